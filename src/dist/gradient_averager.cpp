// dist::GradientAverager (world.h): the gradients of a step averaged over
// the ranks in buckets while the backward runs, as DDP's reducer does, or
// reduce-scattered into each rank's share for ZeRO-1 (make_sharded).
//
// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/world.h"

#include "core/error.h"
#include "core/gradient_sink.h"
#include "dist/bucket_regions.h"
#include "dist/c10d_group.h"
#include "dist/copy_engine_mean.h"

#if defined(USE_C10D_NCCL)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace orchard::dist {

#if defined(ORCHARD_HAVE_C10D)
namespace {

// Buckets of up to bucket_bytes (100 MB unless set; DDP's 25 MB was slower
// on two H200s, bench/RESULTS.md), parameters in
// the reverse of their order: the backward produces the last layers'
// gradients first. Sharded, each rank's region of a bucket is up to
// bucket_bytes, or twice the largest whole parameter where that is more
// (a bucket of world x that), so that a bucket holds several whole
// parameters to balance between the regions: a whole parameter alone in
// its bucket would leave the other regions as padding, sent for nothing
// (a d20's 26 MB MLP matrices with Muon, an 8-bit embedding).
// Also the products' gradient sink (core/gradient_sink.h) while the last
// backward of a step runs: a weight whose gradient lands whole in one
// place of a bucket gets that place to be written by its product, so the
// hook has nothing to copy (as DDP's gradient_as_bucket_view).
class OverlappedAverager final : public GradientAverager, public GradientSink {
 public:
  OverlappedAverager(
      const std::vector<Shardable>& params,
      bool sharded,
      const AveragingOptions& options)
      : sharded_(sharded),
        same_rows_(options.same_rows_on_every_rank),
        reduce_dtype_(options.reduce_dtype),
        mover_(options.mover),
        gather_dtype_(options.gather_dtype) {
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
              region_cap_,
              2 * s.param.numel() * int64_t(s.param.element_size()));
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
          !copies_ || !sharded_ || b.everywhere ||
              copies_->share(bi) == b.region,
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
                 whole ? s.param
                       : s.param.detach().view({-1}).narrow(
                             0, g.begin, g.length)});
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

  ~OverlappedAverager() override {
    leave_sink();
    for (size_t i = 0; i < slots_.size(); ++i)
      slots_[i].param.remove_hook(hooks_[i]);
  }

  void arm() override {
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
    for (auto& s : slots_)
      s.ready = s.given = s.gathered = false;
    set_gradient_sink(this);
    for (auto& b : buckets_) {
      b.ready = 0;
      b.work.reset();
    }
  }

  void disarm() override {
    leave_sink();
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    for (auto& b : buckets_)
      try { // called while an error unwinds: never throws
        if (b.work)
          b.work->wait();
      } catch (const std::exception&) {
      }
  }

  void finish() override {
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
          const torch::Tensor& acc = s.param.grad();
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
    }
    // How many ranks gave each parameter a gradient, summed after the
    // buckets (the same collective on every rank, in the same order).
    c10::intrusive_ptr<c10d::Work> counted;
    if (used_.defined()) {
      used_.fill_(1.0);
      if (!unused_here.empty())
        used_.index_fill_(
            0, torch::tensor(unused_here).to(used_.device()), 0.0);
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

  const std::vector<ShardPiece>& pieces() const override {
    return pieces_;
  }

  void gather_parameters(bool exact) override {
    bool rounded = false; // the last gather sent some values low
    for (const Bucket& b : buckets_)
      rounded = rounded || sends_low(b, /*exact=*/false);
    if (!sharded_ || (exact && !rounded))
      return; // every rank holds the owners' float32 values already
    torch::NoGradGuard no_grad;
    // Each piece's .grad (a view of its bucket, overwritten now) stays as
    // it is: a replayed CUDA graph writes the next mean there again.
    if (copies_) {
      gather_on_copy_engines(exact);
      return;
    }
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      Bucket& b = buckets_[bi];
      if (b.everywhere)
        continue;
      pack(bi, /*low=*/false);
      torch::Tensor mine = region(b, rank());
      detail::collective("gathering the updated parameters", [&] {
        if (b.flat.is_cuda()) { // NCCL: in place, this rank's region
          b.work = detail::group()._allgather_base(b.flat, mine);
          return;
        }
        // Gloo (1.13's has no all-gather into one tensor): a sum of
        // zeros but for each rank's own region.
        const int64_t r = b.region, at = r * rank();
        b.flat.narrow(0, 0, at).zero_();
        b.flat.narrow(0, at + r, b.values - at - r).zero_();
        std::vector<torch::Tensor> v = {b.flat};
        b.work = detail::group().allreduce(v);
      });
    }
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      Bucket& b = buckets_[bi];
      if (b.everywhere)
        continue;
      detail::collective(
          "gathering the updated parameters", [&] { b.work->wait(); });
      b.work.reset();
      unpack(bi, /*low=*/false);
    }
  }

  torch::Tensor share_squares() const override {
    return copies_ && squares_whole_ ? copies_->share_squares()
                                     : torch::Tensor();
  }

  bool in_share_squares(const torch::Tensor& param) const override {
    const auto found = slot_of_key_.find(weight_key(param));
    return copies_ && squares_whole_ && found != slot_of_key_.end() &&
        !slots_[found->second].gathered;
  }

  std::string describe() const override {
    int64_t padding = 0, values = 0;
    for (const auto& b : buckets_) {
      int64_t used = 0;
      for (size_t i : b.slots)
        used += slots_[i].param.numel();
      padding += b.values - used;
      values += b.values;
    }
    const std::string mb = std::to_string(region_cap_ >> 20) + " MB";
    std::string out = std::to_string(buckets_.size()) + " bucket(s) of up to " +
        (sharded_ ? mb + " a rank, reduce-scattered" : mb) + ", " +
        std::to_string(sent_in_backward_) +
        " of them sent while the backward ran; " + std::to_string(hooked_) +
        " of " + std::to_string(slots_.size()) +
        " gradients handed over by its hooks, " + std::to_string(in_place_) +
        " of them made in their bucket by their product";
    if (copies_ && sharded_) {
      size_t low = 0;
      for (const auto& b : buckets_)
        low += b.gathers_low ? 1 : 0;
      out +=
          "; reduce-scattered, and the updated parameters gathered, by the "
          "GPUs' copy engines (PyTorch's symmetric memory; no SMs held while "
          "sending)";
      if (low > 0)
        out += ", " + std::to_string(low) + " of the " +
            std::to_string(buckets_.size()) + " bucket(s) gathered in " +
            std::string(c10::toString(gather_dtype_)) +
            " (parameters read only by products in it; each owner keeps "
            "float32)";
    } else if (copies_) {
      out +=
          "; averaged by the GPUs' copy engines (PyTorch's symmetric "
          "memory; no SMs held while sending)";
    } else if (!copies_unavailable_.empty())
      out += "; averaged by NCCL (the copy engines cannot: " +
          copies_unavailable_ + ")";
    if (rounds_)
      out += std::string("; averaged in bfloat16") +
          (casts_present() ? " (half the bytes sent)"
                           : " (each rank's gradient rounded to it; Gloo "
                             "sends the sum in float32)");
    if (gathered_ > 0)
      out += "; " + std::to_string(gathered_) +
          " made from every process's rows of its output's gradient, "
          "gathered (" +
          format_megabytes(gathered_bytes_) + " a process, in place of " +
          format_megabytes(gathered_weight_bytes_) + " of all-reduce)";
    if (!skip_.empty())
      out += "; ORCHARD_TEST_SKIP_BUCKETS=" + skip_ +
          ": gradients NOT averaged (a measurement, not training)";
    if (unused_ > 0)
      out += "; " + std::to_string(unused_) +
          " parameter(s) no process gave a gradient keep none (the optimizer "
          "skips them, as in one process)";
    if (sharded_) {
      int whole = 0, everywhere = 0;
      for (const auto& p : pieces_) {
        whole += p.whole && !p.everywhere ? 1 : 0;
        everywhere += p.everywhere ? 1 : 0;
      }
      out += "; this rank steps " +
          std::to_string(pieces_.size() - size_t(everywhere)) + " piece(s) (" +
          std::to_string(whole) + " whole)" +
          (everywhere > 0 ? " and, as every rank does, " +
                   std::to_string(everywhere) + " parameter(s) whole"
                          : "") +
          ", " +
          format_share(double(padding) / double(std::max<int64_t>(1, values))) +
          " of the buckets is padding";
    }
    return out;
  }

 private:
  using Segment = detail::Segment;
  struct Slot {
    std::string name;
    torch::Tensor param;
    bool whole;
    size_t bucket;
    std::vector<Segment> segments;
    bool ready;
    bool given; // its place in the bucket handed to its product
    // Made from every rank's gathered rows (gathered_gradient): the mean
    // already, not copied into its bucket.
    bool gathered;
    bool everywhere; // sharded, yet stepped whole by every rank
  };
  struct Bucket {
    torch::TensorOptions options;
    bool gathers_low = false; // sharded: parameters gathered in gather_dtype_
    bool everywhere = false;  // sharded: not cut into regions (Shardable's)
    std::vector<size_t> pieces; // sharded: this rank's (pieces_), in order
    int64_t values = 0; // sharded: world x region
    int64_t region = 0; // sharded: each rank's values
    std::vector<size_t> slots;
    size_t ready = 0;
    torch::Tensor flat;
    // NCCL, reduce_dtype_ not float32: flat in reduce_dtype_, what is sent.
    torch::Tensor low;
    c10::intrusive_ptr<c10d::Work> work;
  };

#if defined(USE_C10D_NCCL)
  // The side streams of a bucket sent in reduce_dtype_: `to` casts it
  // down once the backward's stream has made it (and NCCL sends from
  // there), `back` casts the mean up once NCCL is done, while the
  // backward goes on.
  struct Casts {
    c10::cuda::CUDAStream to, back;
    at::cuda::CUDAEvent made, back_done;
  };
  std::optional<Casts> casts_;
#endif
  bool casts_present() const {
#if defined(USE_C10D_NCCL)
    return casts_.has_value();
#else
    return false;
#endif
  }

  static std::string format_megabytes(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / double(1 << 20));
    return buf;
  }

  static std::string format_share(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * x);
    return buf;
  }

  torch::Tensor region(const Bucket& b, int r) const {
    return b.flat.narrow(0, b.region * r, b.region);
  }
  torch::Tensor in_bucket(const Slot& s, const Segment& g) {
    return buckets_[s.bucket].flat.narrow(0, g.offset, g.length);
  }
  torch::Tensor piece_in_bucket(size_t k) {
    const auto [bucket, offset] = piece_at_[k];
    return buckets_[bucket].flat.narrow(0, offset, pieces_[k].length);
  }

  // Whether bucket b's updated values are all-gathered in gather_dtype_
  // (on the copy engines, unless `exact`).
  bool sends_low(const Bucket& b, bool exact) const {
    return copies_ && b.gathers_low && !exact;
  }

  // A low bucket's values as gather_dtype_ (twice as many): rank r's
  // region's first half holds its values sent low, a value at offset o of
  // the float32 bucket at o + region x r of these.
  torch::Tensor low_values(const Bucket& b) const {
    return b.flat.view(gather_dtype_);
  }

  // This rank's updated pieces of bucket bi written into its region, in
  // gather_dtype_ where `low`.
  void pack(size_t bi, bool low) {
    const Bucket& b = buckets_[bi];
    for (size_t k : b.pieces) {
      const torch::Tensor value = pieces_[k].value.reshape({-1});
      if (low)
        low_values(b)
            .narrow(
                0, piece_at_[k].second + b.region * rank(), pieces_[k].length)
            .copy_(value);
      else
        piece_in_bucket(k).copy_(value);
    }
  }

  // The other ranks' pieces of bucket bi, gathered into their regions,
  // copied out into the parameters.
  void unpack(size_t bi, bool low) {
    const Bucket& b = buckets_[bi];
    const torch::Tensor values = low ? low_values(b) : b.flat;
    for (size_t i : b.slots)
      for (const Segment& g : slots_[i].segments)
        if (g.owner != rank())
          slots_[i]
              .param.detach()
              .view({-1})
              .narrow(0, g.begin, g.length)
              .copy_(values.narrow(
                  0, low ? g.offset + b.region * g.owner : g.offset, g.length));
  }

  // gather_parameters on the copy engines, a bucket at a time: bucket b's
  // regions are pulled from their owners while this rank packs the next
  // bucket, and copied out into the parameters while the next is pulled.
  void gather_on_copy_engines(bool exact) {
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      const Bucket& b = buckets_[bi];
      if (b.everywhere)
        continue;
      pack(bi, sends_low(b, exact));
      copies_->gather(bi, sends_low(b, exact) ? b.region / 2 : b.region);
    }
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      if (buckets_[bi].everywhere)
        continue;
      copies_->gathered(bi);
      unpack(bi, sends_low(buckets_[bi], exact));
    }
    copies_->end_gather();
  }

  // The sink (core/gradient_sink.h), on autograd's thread: the weight's
  // place in its bucket, once a backward, where the gradient lands whole
  // in one place and nothing is accumulated in .grad from earlier
  // micro-steps to add to it.
  torch::Tensor destination(std::intptr_t key) override {
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

  // The sink's gathered embedding gradient (core/gradient_sink.h), on
  // autograd's thread: where every rank's rows (n each, the same n on
  // every rank: same_rows_) are fewer values than a ring all-reduce sends
  // of the weight's gradient (n x world < 2 x num_rows), nothing from
  // earlier micro-steps is to be added, and `sum` makes the same bits on
  // every rank. Every rank decides alike from the shapes and the build,
  // so all issue the same collectives.
  torch::Tensor gathered_gradient(
      std::intptr_t key,
      const torch::Tensor& rows,
      const torch::Tensor& ids,
      int64_t num_rows,
      RowsSum& sum) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto found = slot_of_key_.find(key);
      if (!armed_ || !same_rows_ || found == slot_of_key_.end())
        return {};
      Slot& s = slots_[found->second];
      if (sharded_ && !s.everywhere)
        return {};
      const int64_t n = rows.size(0);
      if (s.ready || s.given || s.param.grad().defined() ||
          n * size() >= 2 * num_rows || rows.dim() != 2 ||
          s.param.numel() != num_rows * rows.size(1) ||
          rows.scalar_type() != s.param.scalar_type() || !sum.same_bits(rows))
        return {};
      s.given = s.gathered = true;
      ++gathered_;
      gathered_bytes_ += n * rows.size(1) * int64_t(rows.element_size());
      gathered_weight_bytes_ =
          s.param.numel() * int64_t(s.param.element_size());
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

  // The copy engines (copy_engine_mean.h), where mover_ asks for them
  // and they can average these buckets; else NCCL or Gloo.
  void start_copy_engines(const AveragingOptions::MeanOf& mean_of) {
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

  void leave_sink() {
    if (gradient_sink() == this)
      set_gradient_sink(nullptr);
  }

  // Autograd's hook (its thread on CUDA): the step's gradient g of
  // parameter i, before it is added to .grad. The bucket gets the sum now
  // (queued on the stream the collective waits for), unless its product
  // made g in the bucket already.
  void on_gradient(size_t i, const torch::Tensor& g) {
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
    const torch::Tensor& acc = s.param.grad();
    const torch::Tensor flat_g = g.reshape({-1});
    for (const Segment& seg : s.segments) {
      torch::Tensor dst = in_bucket(s, seg);
      const torch::Tensor part = flat_g.narrow(0, seg.begin, seg.length);
      if (s.given && !acc.defined() && part.data_ptr() == dst.data_ptr() &&
          part.is_contiguous())
        continue;
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

  void ready(size_t i) {
    slots_[i].ready = true;
    ++buckets_[slots_[i].bucket].ready;
  }

  // Sends the full buckets, in bucket order (every rank must issue the
  // same collectives in the same order).
  void launch_ready(bool in_backward) {
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

  // NCCL's mean of bucket b's values in `all` (b.flat, or b.low), in
  // place: all-reduced, or reduce-scattered into this rank's region. NCCL
  // averages as it sums (ReduceOp::AVG): no division pass over the
  // gradients after the backward.
  c10::intrusive_ptr<c10d::Work> average_on_nccl(
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
  // Bucket b cast to reduce_dtype_, averaged (all-reduced, or
  // reduce-scattered into this rank's region) and cast back, all on side
  // streams: the backward's stream only marks where b is made, and
  // finish() waits for the last cast back.
  void send_low(Bucket& b) {
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

  bool sharded_;
  std::unique_ptr<detail::CopyEngineMean> copies_;
  std::string copies_unavailable_; // why not, on CUDA where not ruled out
  // Every rank's micro-steps have the same shapes (a GPT's B x T windows),
  // so an embedding's rows can be gathered.
  bool same_rows_;
  // The dtype gradients are averaged in; rounds_: some bucket's gradients
  // are float32 and reduce_dtype_ is not.
  torch::ScalarType reduce_dtype_;
  AveragingOptions::Mover mover_;
  torch::ScalarType gather_dtype_;
  bool rounds_ = false;
  bool sent_low_ = false; // this step (send_low)
  size_t gathered_ = 0;
  int64_t gathered_bytes_ = 0, gathered_weight_bytes_ = 0;
  std::string skip_;           // ORCHARD_TEST_SKIP_BUCKETS
  int64_t region_cap_ = 0;     // bytes of a rank's region (sharded)
  std::vector<Slot> slots_;
  std::unordered_map<std::intptr_t, size_t> slot_of_key_;
  // This step's buckets all averaged by the copy engines, none holding a
  // gathered gradient: their squares (share_squares) count every bucketed
  // gradient.
  bool squares_whole_ = false;
  std::vector<Bucket> buckets_;
  std::vector<ShardPiece> pieces_;
  // Each piece's bucket and offset in it, and its parameter's slot.
  std::vector<std::pair<size_t, int64_t>> piece_at_;
  std::vector<size_t> piece_slot_;
  // 1 where this rank gave the parameter a gradient, then the sum over the
  // ranks; and how many no rank gave one in the last step.
  torch::Tensor used_;
  size_t unused_ = 0;
  std::vector<unsigned> hooks_;
  std::mutex mu_;
  bool armed_ = false;
  size_t next_ = 0;
  size_t sent_in_backward_ = 0, hooked_ = 0, in_place_ = 0;
};

} // namespace
#endif

std::unique_ptr<GradientAverager> GradientAverager::make(
    const std::vector<torch::Tensor>& params,
    const AveragingOptions& options) {
#if defined(ORCHARD_HAVE_C10D)
  if (active()) {
    std::vector<Shardable> all;
    for (const auto& p : params)
      all.push_back({"", p, false});
    return std::make_unique<OverlappedAverager>(
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
    return std::make_unique<OverlappedAverager>(
        params, /*sharded=*/true, options);
#endif
  (void)params, (void)options;
  return nullptr;
}

} // namespace orchard::dist
