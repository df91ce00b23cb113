// The sharded half of dist::detail::OverlappedAverager (overlapped_averager.h):
// ZeRO-1's all-gather of the updated pieces into every rank's parameters
// (on NCCL, Gloo or the GPUs' copy engines), and what the averager tells
// the run about itself (describe).
//
// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/overlapped_averager.h"

#include "dist/c10d_group.h"

#include <algorithm>
#include <cstdio>

namespace orchard::dist::detail {

#if defined(ORCHARD_HAVE_C10D)
void OverlappedAverager::gather_parameters(bool exact) {
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

bool OverlappedAverager::in_share_squares(const torch::Tensor& param) const {
  const auto found = slot_of_key_.find(weight_key(param));
  return copies_ && squares_whole_ && found != slot_of_key_.end() &&
      !slots_[found->second].gathered;
}

std::string OverlappedAverager::describe() const {
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
    out +=
        "; averaged by NCCL (the copy engines cannot: " + copies_unavailable_ +
        ")";
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

std::string OverlappedAverager::format_megabytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / double(1 << 20));
  return buf;
}

std::string OverlappedAverager::format_share(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * x);
  return buf;
}

void OverlappedAverager::pack(size_t bi, bool low) {
  copy_pieces(bi, /*in=*/true, low);
}

void OverlappedAverager::unpack(size_t bi, bool low) {
  copy_pieces(bi, /*in=*/false, low);
}

void OverlappedAverager::copy_pieces(size_t bi, bool in, bool low) {
  auto key = std::tuple{bi, in, low};
  auto found = prepared_.find(key);
  if (found == prepared_.end()) {
    auto pairs = in ? pieces_in(bi, low) : pieces_out(bi, low);
    std::function<void()> run =
        copy_pieces_ ? copy_pieces_(std::move(pairs)) : [pairs] {
          for (const auto& [from, to] : pairs)
            to.detach().copy_(from);
        };
    found = prepared_.emplace(key, std::move(run)).first;
  }
  found->second();
}

std::vector<std::pair<torch::Tensor, torch::Tensor>> OverlappedAverager::
    pieces_in(size_t bi, bool low) {
  const Bucket& b = buckets_[bi];
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
  for (size_t k : b.pieces) {
    const torch::Tensor value = pieces_[k].value.detach().view({-1});
    pairs.push_back(
        {value,
         low ? low_values(b).narrow(
                   0,
                   piece_at_[k].second + b.region * rank(),
                   pieces_[k].length)
             : piece_in_bucket(k)});
  }
  return pairs;
}

std::vector<std::pair<torch::Tensor, torch::Tensor>> OverlappedAverager::
    pieces_out(size_t bi, bool low) {
  const Bucket& b = buckets_[bi];
  const torch::Tensor values = low ? low_values(b) : b.flat;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
  for (size_t i : b.slots)
    for (const Segment& g : slots_[i].segments)
      if (g.owner != rank())
        pairs.push_back(
            {values.narrow(
                 0, low ? g.offset + b.region * g.owner : g.offset, g.length),
             slots_[i].param.detach().view({-1}).narrow(0, g.begin, g.length)});
  return pairs;
}

void OverlappedAverager::gather_on_copy_engines(bool exact) {
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
#endif

} // namespace orchard::dist::detail
