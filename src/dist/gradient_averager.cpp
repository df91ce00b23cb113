// dist::GradientAverager (world.h): the gradients of a step averaged over
// the ranks in buckets while the backward runs, as DDP's reducer does, or
// reduce-scattered into each rank's share for ZeRO-1 (make_sharded).
//
// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/overlapped_averager.h"

#include "core/error.h"
#include "dist/c10d_group.h"

#include <algorithm>
#include <cstdlib>

namespace orchard::dist {

#if defined(ORCHARD_HAVE_C10D)
namespace detail {

OverlappedAverager::OverlappedAverager(
    const std::vector<Shardable>& params,
    bool sharded,
    const AveragingOptions& options)
    : sharded_(sharded),
      same_rows_(options.same_rows_on_every_rank),
      reduce_dtype_(options.reduce_dtype),
      mover_(options.mover),
      gather_dtype_(options.gather_dtype),
      copy_pieces_(options.copy_pieces) {
  // For measuring what the collectives cost, never for training: "all"
  // sends no bucket, "last" all but the last (each rank then steps on
  // its own gradients there).
  if (const char* skip = std::getenv("ORCHARD_TEST_SKIP_BUCKETS")) {
    skip_ = skip;
    if (skip_ != "all" && skip_ != "last")
      throw UserError(
          "ORCHARD_TEST_SKIP_BUCKETS=" + skip_ +
          " is not a setting: \"all\" (no bucket all-reduced) or \"last\" "
          "(all but the last), for measuring only; unset it to train.");
  }
  region_cap_ = options.bucket_bytes;
  if (sharded)
    for (const auto& s : params)
      if (s.whole && s.param.requires_grad())
        region_cap_ = std::max(
            region_cap_, 2 * s.param.numel() * int64_t(s.param.element_size()));
  const int64_t cap = region_cap_ * (sharded ? size() : 1);
  // kind (dtype, device, gathered low, everywhere) -> bucket
  std::map<std::tuple<int, std::string, bool, bool>, size_t> open;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const torch::Tensor& p = it->param;
    if (!p.requires_grad())
      continue;
    const bool low = sharded && it->low && gather_dtype_ != p.scalar_type() &&
        p.is_cuda() && p.scalar_type() == torch::kFloat32;
    const bool everywhere = sharded && it->everywhere;
    auto kind =
        std::tuple{int(p.scalar_type()), p.device().str(), low, everywhere};
    auto o = open.find(kind);
    if (o == open.end() ||
        (buckets_[o->second].values + p.numel()) * int64_t(p.element_size()) >
            cap) {
      buckets_.push_back({});
      buckets_.back().options = p.options().requires_grad(false);
      buckets_.back().gathers_low = low;
      buckets_.back().everywhere = everywhere;
      o = open.insert_or_assign(kind, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[o->second];
    slots_.push_back(
        {it->name,
         p,
         it->whole,
         o->second,
         {},
         false,
         false,
         false,
         everywhere});
    slot_of_key_[weight_key(p)] = slots_.size() - 1;
    b.values += p.numel();
    b.slots.push_back(slots_.size() - 1);
  }
  std::vector<int64_t> owned(size_t(size()), 0); // values each rank steps
  for (Bucket& b : buckets_) {
    if (sharded_ && !b.everywhere) { // one region a rank (bucket_regions.h)
      std::vector<std::pair<int64_t, bool>> sizes;
      for (size_t i : b.slots)
        sizes.push_back({slots_[i].param.numel(), slots_[i].whole});
      // Regions of whole 64-value blocks: the copy engines' shares.
      detail::Regions laid = detail::lay_out_regions(sizes, owned, 64);
      b.region = laid.region;
      b.values = laid.region * size();
      for (size_t k = 0; k < b.slots.size(); ++k)
        slots_[b.slots[k]].segments = std::move(laid.segments[k]);
      continue;
    }
    int64_t at = 0;
    for (size_t i : b.slots) {
      slots_[i].segments.push_back({0, slots_[i].param.numel(), at, -1});
      at += slots_[i].param.numel();
    }
  }
  start_copy_engines(options.mean_of); // the buckets' sizes now final
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    // Zeros: a region's padding is never written and sums to zero.
    b.flat =
        copies_ ? copies_->bucket(bi) : torch::zeros({b.values}, b.options);
    TORCH_CHECK(
        !copies_ || !sharded_ || b.everywhere || copies_->share(bi) == b.region,
        "copy engines' share ",
        copies_ ? copies_->share(bi) : 0,
        " is not the region ",
        b.region);
    if (b.options.dtype() == torch::kFloat32 &&
        reduce_dtype_ != torch::kFloat32) {
      rounds_ = true;
#if defined(USE_C10D_NCCL)
      if (b.flat.is_cuda()) { // sent in reduce_dtype_ (send_low)
        b.low = torch::zeros({b.values}, b.options.dtype(reduce_dtype_));
        const auto d = b.flat.device().index();
        if (!casts_)
          casts_.emplace(Casts{
              c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d),
              c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d),
              {},
              {}});
      }
#endif
    }
  }
  if (sharded_) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.everywhere) { // every rank steps it whole
        pieces_.push_back(
            {s.name, s.param, 0, s.param.numel(), true, s.param, true});
        piece_at_.push_back({s.bucket, 0});
        piece_slot_.push_back(i);
        continue;
      }
      for (const Segment& g : s.segments)
        if (g.owner == rank()) {
          const bool whole = g.length == s.param.numel() && s.whole;
          pieces_.push_back(
              {s.name,
               s.param,
               g.begin,
               g.length,
               whole,
               whole
                   ? s.param
                   : s.param.detach().view({-1}).narrow(0, g.begin, g.length)});
          piece_at_.push_back({s.bucket, g.offset});
          piece_slot_.push_back(i);
          buckets_[s.bucket].pieces.push_back(pieces_.size() - 1);
        }
    }
  }
  if (!slots_.empty())
    used_ = torch::ones(
        {int64_t(slots_.size())},
        torch::TensorOptions()
            .dtype(torch::kFloat32)
            .device(slots_.front().param.device()));
  for (size_t i = 0; i < slots_.size(); ++i) {
    torch::Tensor p = slots_[i].param;
    hooks_.push_back(
        p.register_hook([this, i](torch::Tensor g) { on_gradient(i, g); }));
  }
}

OverlappedAverager::~OverlappedAverager() {
  leave_sink();
  for (size_t i = 0; i < slots_.size(); ++i)
    slots_[i].param.remove_hook(hooks_[i]);
}

void OverlappedAverager::arm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  next_ = 0;
  sent_in_backward_ = 0;
  hooked_ = 0;
  in_place_ = 0;
  sent_low_ = false;
  gathered_ = 0;
  gathered_bytes_ = 0;
  squares_whole_ = copies_ != nullptr;
  for (auto& s : slots_) {
    s.ready = s.given = s.gathered = false;
    // Earlier micro-steps' sum out of .grad: the last backward's gradient
    // gets it added once, in its bucket (on_gradient), and autograd keeps
    // that gradient as .grad rather than adding it to this a second time.
    s.earlier = s.param.grad();
    if (s.earlier.defined())
      s.param.mutable_grad() = torch::Tensor();
  }
  set_gradient_sink(this);
  for (auto& b : buckets_) {
    b.ready = 0;
    b.work.reset();
  }
}

void OverlappedAverager::disarm() {
  leave_sink();
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  // The step is given up (with several processes the run then stops): its
  // gradients, partly in the buckets, are dropped.
  for (auto& s : slots_) {
    s.earlier = torch::Tensor();
    s.param.mutable_grad() = torch::Tensor();
  }
  for (auto& b : buckets_)
    try { // called while an error unwinds: never throws
      if (b.work)
        b.work->wait();
    } catch (const std::exception&) {
    }
}

void OverlappedAverager::finish() {
  leave_sink();
  torch::NoGradGuard no_grad;
  // Parameters no micro-step of this rank reached (no gradient at all).
  std::vector<int64_t> unused_here;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Parameters the backward did not reach: what earlier micro-steps
    // left in .grad, or zeros.
    for (size_t i = 0; i < slots_.size(); ++i)
      if (!slots_[i].ready) {
        const Slot& s = slots_[i];
        const torch::Tensor& acc = s.earlier;
        if (!acc.defined())
          unused_here.push_back(int64_t(i));
        for (const Segment& g : s.segments)
          if (acc.defined())
            in_bucket(s, g).copy_(
                acc.reshape({-1}).narrow(0, g.begin, g.length));
          else
            in_bucket(s, g).zero_();
        ready(i);
      }
    launch_ready(/*in_backward=*/false);
    armed_ = false;
    for (auto& s : slots_) // added into the buckets
      s.earlier = torch::Tensor();
  }
  // How many ranks gave each parameter a gradient, summed after the
  // buckets (the same collective on every rank, in the same order).
  c10::intrusive_ptr<c10d::Work> counted;
  if (used_.defined()) {
    used_.fill_(1.0);
    if (!unused_here.empty())
      used_.index_fill_(0, torch::tensor(unused_here).to(used_.device()), 0.0);
    detail::collective("averaging gradients", [&] {
      std::vector<torch::Tensor> v = {used_};
      counted = detail::group().allreduce(v);
    });
  }
  const double n = double(size());
  for (auto& b : buckets_) {
    if (!b.work) // not sent (ORCHARD_TEST_SKIP_BUCKETS)
      continue;
    if (b.low.defined()) // cast back on a side stream, waited for below
      continue;
    detail::collective("averaging gradients", [&] { b.work->wait(); });
    if (!b.flat.is_cuda()) // Gloo sent the sum
      (sharded_ && !b.everywhere ? region(b, rank()) : b.flat).div_(n);
  }
  if (copies_)
    copies_->finish();
#if defined(USE_C10D_NCCL)
  if (casts_ && sent_low_) { // the buckets sent in reduce_dtype_, back
    casts_->back_done.record(casts_->back);
    casts_->back_done.block(c10::cuda::getCurrentCUDAStream());
  }
#endif
  if (counted)
    detail::collective("averaging gradients", [&] { counted->wait(); });
  // A parameter no rank gave a gradient keeps none, as in one process
  // (the optimizer skips it; a zero gradient would still move it through
  // weight decay and momentum). Only a rank that lacks one itself needs
  // the counts, so only then are they read back.
  std::vector<bool> unused(slots_.size(), false);
  unused_ = 0;
  if (!unused_here.empty()) {
    const torch::Tensor counts = used_.to(torch::kCPU);
    const float* c = counts.data_ptr<float>();
    for (int64_t i : unused_here)
      if (c[i] == 0) {
        unused[size_t(i)] = true;
        ++unused_;
      }
  }
  // The gradients made in their bucket: autograd kept that memory as
  // .grad, so nothing was copied on the way.
  for (const Slot& s : slots_)
    if (s.given && s.param.grad().defined() &&
        s.param.grad().data_ptr() == in_bucket(s, s.segments[0]).data_ptr())
      ++in_place_;
  if (!sharded_) {
    // .grad becomes a view of the mean (no copy back); the gradient
    // autograd accumulated on its own is dropped.
    // A gathered gradient is the mean already, and autograd's .grad.
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.gathered)
        s.param.mutable_grad() = unused[i]
            ? torch::Tensor()
            : in_bucket(s, s.segments[0]).view(s.param.sizes());
    }
    return;
  }
  // Sharded: the mean exists only for this rank's pieces, and whole in
  // the parameters every rank steps (a gathered one's is autograd's).
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.everywhere)
      s.param.mutable_grad() = torch::Tensor();
    else if (!s.gathered)
      s.param.mutable_grad() = unused[i]
          ? torch::Tensor()
          : in_bucket(s, s.segments[0]).view(s.param.sizes());
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    ShardPiece& p = pieces_[k];
    if (p.everywhere)
      continue;
    p.value.mutable_grad() = unused[piece_slot_[k]]
        ? torch::Tensor()
        : piece_in_bucket(k).view(p.value.sizes());
  }
}

bool OverlappedAverager::casts_present() const {
#if defined(USE_C10D_NCCL)
  return casts_.has_value();
#else
  return false;
#endif
}

torch::Tensor OverlappedAverager::destination(std::intptr_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = slot_of_key_.find(key);
  if (!armed_ || found == slot_of_key_.end())
    return {};
  Slot& s = slots_[found->second];
  if (s.ready || s.given || s.segments.size() != 1 ||
      s.segments[0].length != s.param.numel() || s.param.grad().defined())
    return {};
  s.given = true;
  return in_bucket(s, s.segments[0]).view(s.param.sizes());
}

torch::Tensor OverlappedAverager::gathered_gradient(
    std::intptr_t key,
    const torch::Tensor& rows,
    const torch::Tensor& ids,
    int64_t num_rows,
    RowsSum& sum) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto found = slot_of_key_.find(key);
    if (!armed_ || !same_rows_ || found == slot_of_key_.end())
      return {};
    Slot& s = slots_[found->second];
    if (sharded_ && !s.everywhere)
      return {};
    const int64_t n = rows.size(0);
    if (s.ready || s.given || s.earlier.defined() ||
        n * size() >= 2 * num_rows || rows.dim() != 2 ||
        s.param.numel() != num_rows * rows.size(1) ||
        rows.scalar_type() != s.param.scalar_type() || !sum.same_bits(rows))
      return {};
    s.given = s.gathered = true;
    ++gathered_;
    gathered_bytes_ += n * rows.size(1) * int64_t(rows.element_size());
    gathered_weight_bytes_ = s.param.numel() * int64_t(s.param.element_size());
  }
  torch::NoGradGuard no_grad;
  // The ids first: the sum's preparation (on CUDA sorting them and
  // zeroing the gradient) runs while the rows are still on their way.
  const std::string what = "gathering an embedding's rows";
  RowsGathering all_ids = start_gather_rows(ids.reshape({-1}), what);
  RowsGathering all_rows = start_gather_rows(rows, what);
  sum.prepare(all_ids.wait(), num_rows, rows);
  return sum.sum(all_rows.wait(), 1.0 / double(size()));
}

void OverlappedAverager::start_copy_engines(
    const AveragingOptions::MeanOf& mean_of) {
  std::vector<std::pair<int64_t, torch::TensorOptions>> buckets;
  for (const Bucket& b : buckets_)
    buckets.push_back({b.values, b.options});
  const std::string ruled_out = reduce_dtype_ != torch::kFloat32
      ? "grad_reduce_dtype=bfloat16 sends them in bfloat16"
      : "";
  std::vector<bool> scatter;
  for (const Bucket& b : buckets_)
    scatter.push_back(sharded_ && !b.everywhere);
  copies_ = detail::CopyEngineMean::choose(
      mover_, scatter, buckets, ruled_out, mean_of, copies_unavailable_);
}

void OverlappedAverager::on_gradient(size_t i, const torch::Tensor& g) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[i];
  if (!armed_ || s.ready)
    return;
  torch::NoGradGuard no_grad;
  if (s.gathered) { // the mean already: autograd keeps it as .grad
    ++hooked_;
    ready(i);
    launch_ready(/*in_backward=*/true);
    return;
  }
  const torch::Tensor& acc = s.earlier;
  const torch::Tensor flat_g = g.reshape({-1});
  for (const Segment& seg : s.segments) {
    torch::Tensor dst = in_bucket(s, seg);
    const torch::Tensor part = flat_g.narrow(0, seg.begin, seg.length);
    if (s.given && part.data_ptr() == dst.data_ptr() &&
        part.is_contiguous()) { // made in the bucket by its product
      if (acc.defined())
        dst.add_(acc.reshape({-1}).narrow(0, seg.begin, seg.length));
      continue;
    }
    if (acc.defined())
      torch::add_out(
          dst, acc.reshape({-1}).narrow(0, seg.begin, seg.length), part);
    else
      dst.copy_(part);
  }
  ++hooked_;
  ready(i);
  launch_ready(/*in_backward=*/true);
}

void OverlappedAverager::launch_ready(bool in_backward) {
  while (next_ < buckets_.size() &&
         buckets_[next_].ready == buckets_[next_].slots.size()) {
    Bucket& b = buckets_[next_];
    bool all_gathered = true;
    for (size_t i : b.slots)
      all_gathered = all_gathered && slots_[i].gathered;
    if (all_gathered) { // nothing left to average in it
      b.work.reset();
      ++next_;
      continue;
    }
    if (skip_ == "all" || (skip_ == "last" && next_ + 1 == buckets_.size())) {
      b.work.reset(); // measurement only: ranks' gradients not averaged
      squares_whole_ = false;
      ++next_;
      continue;
    }
    bool some_gathered = false; // its place in the bucket is not the mean
    for (size_t i : b.slots)
      some_gathered = some_gathered || slots_[i].gathered;
    if (some_gathered)
      squares_whole_ = false;
    sent_in_backward_ += in_backward ? 1 : 0;
    if (copies_) {
      copies_->send(next_);
      ++next_;
      continue;
    }
#if defined(USE_C10D_NCCL)
    if (b.low.defined()) {
      send_low(b);
      ++next_;
      continue;
    }
#endif
    if (rounds_ && !b.flat.is_cuda()) // Gloo: the rounding, not the bytes
      b.flat.copy_(b.flat.to(reduce_dtype_));
    detail::collective("averaging gradients", [&] {
      if (b.flat.is_cuda()) {
        b.work = average_on_nccl(b, b.flat);
        return;
      }
      // Gloo (no average; 1.13's has no reduce-scatter): the whole sum,
      // of which a sharded rank reads its region, divided in finish().
      std::vector<torch::Tensor> v = {b.flat};
      b.work = detail::group().allreduce(v);
    });
    ++next_;
  }
}

c10::intrusive_ptr<c10d::Work> OverlappedAverager::average_on_nccl(
    const Bucket& b,
    torch::Tensor& all) {
  if (sharded_ && !b.everywhere) {
    c10d::ReduceScatterOptions mean;
    mean.reduceOp = c10d::ReduceOp::AVG;
    torch::Tensor mine = all.narrow(0, b.region * rank(), b.region);
    return detail::group()._reduce_scatter_base(mine, all, mean);
  }
  c10d::AllreduceOptions mean;
  mean.reduceOp = c10d::ReduceOp::AVG;
  std::vector<torch::Tensor> v = {all};
  return detail::group().allreduce(v, mean);
}

#if defined(USE_C10D_NCCL)
void OverlappedAverager::send_low(Bucket& b) {
  sent_low_ = true;
  casts_->made.record(c10::cuda::getCurrentCUDAStream());
  {
    c10::cuda::CUDAStreamGuard on(casts_->to);
    casts_->made.block(casts_->to);
    b.low.copy_(b.flat);
    detail::collective(
        "averaging gradients", [&] { b.work = average_on_nccl(b, b.low); });
  }
  c10::cuda::CUDAStreamGuard on(casts_->back);
  detail::collective("averaging gradients", [&] { b.work->wait(); });
  if (sharded_ && !b.everywhere)
    region(b, rank()).copy_(b.low.narrow(0, b.region * rank(), b.region));
  else
    b.flat.copy_(b.low);
}
#endif

} // namespace detail
#endif

std::unique_ptr<GradientAverager> GradientAverager::make(
    const std::vector<torch::Tensor>& params,
    const AveragingOptions& options) {
#if defined(ORCHARD_HAVE_C10D)
  if (active()) {
    std::vector<Shardable> all;
    for (const auto& p : params)
      all.push_back({"", p, false});
    return std::make_unique<detail::OverlappedAverager>(
        all, /*sharded=*/false, options);
  }
#endif
  (void)params, (void)options;
  return nullptr;
}

std::unique_ptr<GradientAverager> GradientAverager::make_sharded(
    const std::vector<Shardable>& params,
    const AveragingOptions& options) {
#if defined(ORCHARD_HAVE_C10D)
  if (active())
    return std::make_unique<detail::OverlappedAverager>(
        params, /*sharded=*/true, options);
#endif
  (void)params, (void)options;
  return nullptr;
}

} // namespace orchard::dist
