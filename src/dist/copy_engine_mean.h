// Inside src/dist only (overlapped_averager.h): the mean of float32
// gradient buckets over the processes of one host, moved by the GPUs' copy
// engines through PyTorch's symmetric memory (c10d's symm_mem) instead of
// NCCL's kernels. NCCL's all-reduce runs on the SMs that the backward's
// products need, and slows them while it sends (bench/RESULTS.md,
// 2026-11-29); a copy engine holds none.
//
// Each rank owns one share of every bucket. Once every rank has made the
// bucket (a barrier on the signal pads), each pulls the other ranks'
// values of its own share into a scratch space, sums them in rank order
// and divides (its one pass over the values, over 1/world of the bucket;
// the barriers are a block each); after a second barrier it pulls the
// other shares' means. That moves the bytes a ring all-reduce moves; every
// rank ends with the same bits.
//
// For ZeRO-1 (`scatter`), each rank keeps only its own share's mean (a
// reduce-scatter: half the bytes); the owners step their shares and write
// the updated values there, and gather() pulls every other share back
// (the all-gather), in float32 or, where the caller asks, in a 16-bit
// dtype packed into the share's first half (half those bytes).
#pragma once

#include "dist/world.h"

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orchard::dist::detail {

class CopyEngineMean {
 public:
  // Collective (every rank, the same buckets, the same order): the copy
  // engines for buckets of these many values with these options, where
  // `mover` asks for them (automatic or copy_engines) and they can serve:
  // float32 buckets on one CUDA device, nothing in `ruled_out` (the
  // averager's reason against, e.g. zero_stage=1), `mean_of` set, NCCL,
  // every rank on this host, symmetric memory in this build, and every
  // rank's mapping of the others' memory done (it fails where the GPUs
  // have no peer access; the ranks agree by one all-reduce, so all send
  // alike). Their
  // buckets are zeros. Else null, with why not in `why_not` on CUDA (""
  // where NCCL was asked for or the buckets are on the CPU); a UserError
  // saying why where copy_engines was asked for.
  static std::unique_ptr<CopyEngineMean> choose(
      AveragingOptions::Mover mover,
      const std::vector<bool>& scatter,
      const std::vector<std::pair<int64_t, torch::TensorOptions>>& buckets,
      const std::string& ruled_out,
      const AveragingOptions::MeanOf& mean_of,
      std::string& why_not);
  virtual ~CopyEngineMean() = default;

  // Bucket b's values (what the backward writes, and then the mean).
  virtual torch::Tensor bucket(size_t b) = 0;
  // Queues bucket b's mean on a side stream, once the current stream has
  // made it: of every share, or where scatter[b] of this rank's only.
  // Every rank sends the same buckets in the same order.
  virtual void send(size_t b) = 0;
  // The values (in float32 values) of a rank's share of bucket b: rank
  // r's share starts at r x this in bucket(b).
  virtual int64_t share(size_t b) const = 0;
  // The all-gather, a bucket at a time so that one bucket's pulls overlap
  // the caller's work on the others. After finish(), once the current
  // stream has written this rank's share of bucket b: gather(b, n) pulls
  // the first n values (a whole share, or half of one holding 16-bit
  // values) of every other rank's share of b into this rank's, on a side
  // stream; gathered(b) makes the current stream wait for them. Each
  // bucket gathered once, in the same order on every rank; then
  // end_gather() makes the current stream wait for every rank to have
  // read this rank's shares (before the next backward writes them).
  virtual void gather(size_t b, int64_t n) = 0;
  virtual void gathered(size_t b) = 0;
  virtual void end_gather() = 0;
  // The current stream waits for every bucket sent since the last finish,
  // and for every rank to have read this rank's buckets (so that the next
  // backward may write them).
  virtual void finish() = 0;
  // After finish(): the sum of the squares of the means in this rank's
  // shares of the buckets sent since the finish before (one float32 value
  // on the device); undefined where none was sent.
  virtual torch::Tensor share_squares() const = 0;
};

} // namespace orchard::dist::detail
