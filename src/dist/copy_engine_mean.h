// Inside src/dist only (gradient_averager.cpp): the mean of float32
// gradient buckets over the processes of one host, moved by the GPUs' copy
// engines through PyTorch's symmetric memory (c10d's symm_mem) instead of
// NCCL's kernels. NCCL's all-reduce runs on the SMs that the backward's
// products need, and slows them while it sends (bench/RESULTS.md,
// 2026-11-29); a copy engine holds none.
//
// Each rank owns one share of every bucket. Once every rank has made the
// bucket (a barrier on the signal pads), each pulls the other ranks'
// values of its own share into a scratch space, sums them in rank order
// and divides (the one kernel it runs, over 1/world of the bucket); after a
// second barrier it pulls the other shares' means. That moves the bytes a
// ring all-reduce moves; every rank ends with the same bits.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace orchard::dist::detail {

class CopyEngineMean {
 public:
  // Why it cannot serve this run's group, or "" where it can: a CUDA
  // device, NCCL, every rank on this host, symmetric memory in this build.
  static std::string unavailable(const torch::Device& device);
  // Collective (every rank, the same sizes, the same order): buckets of
  // these many float32 values on `device`, zeros, in memory every rank
  // maps. Throws where the mapping fails (GPUs without peer access).
  static std::unique_ptr<CopyEngineMean> make(
      const std::vector<int64_t>& bucket_values,
      const torch::Device& device);
  virtual ~CopyEngineMean() = default;

  // Bucket b's values (what the backward writes, and then the mean).
  virtual torch::Tensor bucket(size_t b) = 0;
  // Queues bucket b's mean on a side stream, once the current stream has
  // made it. Every rank sends the same buckets in the same order.
  virtual void send(size_t b) = 0;
  // The current stream waits for every bucket sent since the last finish,
  // and for every rank to have read this rank's buckets (so that the next
  // backward may write them).
  virtual void finish() = 0;
};

} // namespace orchard::dist::detail
