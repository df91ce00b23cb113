// dist::detail::CopyEngineMean (copy_engine_mean.h).
//
// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/copy_engine_mean.h"

#include "core/error.h"
#include "dist/c10d_group.h"
#include "dist/world.h"

// PyTorch 2.x's CUDA builds; 1.13 has no symmetric memory.
#if defined(USE_C10D_NCCL) && \
    __has_include(<torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp>)
#define ORCHARD_HAVE_SYMM_MEM 1
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp>
#endif

#include <algorithm>
#include <cstdlib>

namespace orchard::dist::detail {

#if defined(ORCHARD_HAVE_SYMM_MEM)
namespace {

const std::string kGroup = "orchard_gradients";
// A share starts on a 256-byte boundary (64 float32 values).
constexpr int64_t kAlign = 64;
// How long a barrier waits for the other ranks (NCCL's default timeout).
constexpr size_t kBarrierTimeoutMs = 10 * 60 * 1000;

int64_t round_up(int64_t n, int64_t a) {
  return (n + a - 1) / a * a;
}

class SymmetricMean final : public CopyEngineMean {
 public:
  SymmetricMean(
      const std::vector<int64_t>& values,
      const torch::Device& device,
      AveragingOptions::MeanOf mean_of,
      std::vector<bool> scatter)
      : mean_of_(std::move(mean_of)),
        scatter_(std::move(scatter)),
        world_(size()),
        me_(rank()),
        stream_(c10::cuda::getStreamFromPool(
            /*isHighPriority=*/false,
            device.index())) {
    int64_t at = 0, largest = 0;
    for (int64_t v : values) {
      const int64_t share = round_up((v + world_ - 1) / world_, kAlign);
      buckets_.push_back({at, v, share});
      at += share * world_;
      largest = std::max(largest, share);
    }
    scratch_at_ = at;
    pulled_ = std::vector<at::cuda::CUDAEvent>(buckets_.size());
    const int64_t total = at + largest * (world_ - 1);
    // Orchard never uses NVLink multicast; without this PyTorch would set
    // up a multicast object for the buffer where the GPUs offer one.
    setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
    // The rendezvous finds the ranks by the group's name: a group of this
    // name (its rank, size and store; it sends nothing itself), made once
    // a process and kept (the registry holds it weakly).
    static const auto* group = [&] {
      auto* made = new c10::intrusive_ptr<c10d::ProcessGroup>(
          c10::make_intrusive<c10d::ProcessGroup>(
              c10::make_intrusive<c10d::PrefixStore>(kGroup, store()),
              me_,
              world_));
      c10d::register_process_group(kGroup, *made);
      return made;
    }();
    (void)group;
    namespace sm = c10d::symmetric_memory;
    all_ = sm::empty_strided_p2p(
        {total}, {1}, torch::kFloat32, device, kGroup, std::nullopt);
    all_.zero_(); // a share's padding is never written and sums to zero
    squares_ = torch::zeros(
        {int64_t(buckets_.size())},
        torch::TensorOptions().dtype(torch::kFloat32).device(device));
    memory_ = sm::rendezvous(all_, kGroup);
    // A host whose GPUs cannot reach each other's memory fails here, after
    // the rendezvous; ORCHARD_TEST_NO_PEER_ACCESS=R makes rank R fail so,
    // to try the fallback to NCCL on a host that has peer access.
    if (const char* r = std::getenv("ORCHARD_TEST_NO_PEER_ACCESS");
        r != nullptr && std::to_string(me_) == r)
      throw std::runtime_error(
          "rank " + std::string(r) +
          " refused peer access (ORCHARD_TEST_NO_PEER_ACCESS, a test)");
    for (int p = 0; p < world_; ++p)
      peer_.push_back(
          p == me_ ? all_
                   : memory_->get_buffer(p, {total}, torch::kFloat32, 0));
  }

  torch::Tensor bucket(size_t b) override {
    return all_.narrow(0, buckets_[b].at, buckets_[b].values);
  }

  void send(size_t b) override {
    torch::NoGradGuard no_grad;
    const Bucket& k = buckets_[b];
    made_.record(c10::cuda::getCurrentCUDAStream());
    made_.block(stream_);
    c10::cuda::CUDAStreamGuard on(stream_);
    memory_->barrier(0, kBarrierTimeoutMs); // every rank has made bucket b
    const int64_t mine = k.at + k.share * me_;
    torch::Tensor own = all_.narrow(0, mine, k.share);
    std::vector<torch::Tensor> part(static_cast<size_t>(world_)); // each rank's
    for (int p = 0, i = 0; p < world_; ++p) {
      if (p == me_) {
        part[size_t(p)] = own;
        continue;
      }
      part[size_t(p)] =
          all_.narrow(0, scratch_at_ + int64_t(i++) * k.share, k.share);
      part[size_t(p)].copy_(peer_[size_t(p)].narrow(0, mine, k.share));
    }
    // Summed in rank order (each share is made once and copied, so every
    // rank ends with its bits); the squares of the share's mean too, for
    // the gradient norm.
    torch::Tensor squares;
    mean_of_(own, part, &squares);
    squares_.narrow(0, int64_t(b), 1).copy_(squares);
    sent_ = true;
    if (scatter_[b]) // the others' shares stay as they are until gather()
      return;
    memory_->barrier(0, kBarrierTimeoutMs); // every share is its mean
    for (int p = 0; p < world_; ++p)
      if (p != me_) {
        const int64_t at = k.at + k.share * p;
        all_.narrow(0, at, k.share)
            .copy_(peer_[size_t(p)].narrow(0, at, k.share));
      }
  }

  int64_t share(size_t b) const override {
    return buckets_[b].share;
  }

  void gather(size_t b, int64_t n) override {
    const Bucket& k = buckets_[b];
    n = std::min(n, k.share);
    made_.record(c10::cuda::getCurrentCUDAStream());
    made_.block(stream_);
    c10::cuda::CUDAStreamGuard on(stream_);
    memory_->barrier(0, kBarrierTimeoutMs); // every owner has written b
    for (int p = 0; p < world_; ++p)
      if (p != me_) {
        const int64_t at = k.at + k.share * p;
        all_.narrow(0, at, n).copy_(peer_[size_t(p)].narrow(0, at, n));
      }
    pulled_[b].record(stream_);
    gathering_ = true;
  }

  void gathered(size_t b) override {
    pulled_[b].block(c10::cuda::getCurrentCUDAStream());
  }

  void end_gather() override {
    if (!gathering_)
      return;
    gathering_ = false;
    {
      c10::cuda::CUDAStreamGuard on(stream_);
      memory_->barrier(0, kBarrierTimeoutMs); // every rank has read mine
      done_.record(stream_);
    }
    done_.block(c10::cuda::getCurrentCUDAStream());
  }

  void finish() override {
    total_ = torch::Tensor();
    if (!sent_)
      return;
    sent_ = false;
    {
      c10::cuda::CUDAStreamGuard on(stream_);
      memory_->barrier(0, kBarrierTimeoutMs); // every rank has read mine
      // A bucket not sent this step counts nothing.
      total_ = squares_.sum().reshape({1});
      squares_.zero_();
      done_.record(stream_);
    }
    done_.block(c10::cuda::getCurrentCUDAStream());
  }

  torch::Tensor share_squares() const override {
    return total_;
  }

 private:
  struct Bucket {
    int64_t at, values, share; // share: values a rank owns, world x share
  };
  AveragingOptions::MeanOf mean_of_;
  // Each bucket's: each rank keeps its own share's mean only.
  std::vector<bool> scatter_;
  int world_, me_;
  c10::cuda::CUDAStream stream_;
  std::vector<Bucket> buckets_;
  int64_t scratch_at_ = 0; // (world - 1) shares of the largest bucket
  torch::Tensor all_;
  c10::intrusive_ptr<c10d::symmetric_memory::SymmetricMemory> memory_;
  std::vector<torch::Tensor> peer_; // each rank's all_, mapped here
  at::cuda::CUDAEvent made_, done_;
  std::vector<at::cuda::CUDAEvent> pulled_; // each bucket's, gather()
  bool gathering_ = false;
  bool sent_ = false;
  // Each bucket's share's sum of squared means (zero where not sent since
  // the last finish), and their total (share_squares).
  torch::Tensor squares_, total_;
};

} // namespace
#endif

namespace {

// Why the copy engines cannot serve this run's group on `device`, or "".
std::string unavailable(const torch::Device& device) {
#if defined(ORCHARD_HAVE_SYMM_MEM)
  if (launch().local_world != launch().world)
    return "the ranks are on several hosts";
  if (!dynamic_cast<c10d::ProcessGroupNCCL*>(&group()))
    return "the group is not NCCL's";
  (void)device;
  return "";
#else
  (void)device;
  return "this libtorch has no symmetric memory (PyTorch 2.x on CUDA)";
#endif
}

// Maps the buckets into every GPU of this host, or throws.
std::unique_ptr<CopyEngineMean> map_buckets(
    const std::vector<int64_t>& values,
    const torch::Device& device,
    const AveragingOptions::MeanOf& mean_of,
    const std::vector<bool>& scatter) {
#if defined(ORCHARD_HAVE_SYMM_MEM)
  return std::make_unique<SymmetricMean>(values, device, mean_of, scatter);
#else
  (void)values, (void)device, (void)mean_of, (void)scatter;
  return nullptr;
#endif
}

} // namespace

std::unique_ptr<CopyEngineMean> CopyEngineMean::choose(
    AveragingOptions::Mover mover,
    const std::vector<bool>& scatter,
    const std::vector<std::pair<int64_t, torch::TensorOptions>>& buckets,
    const std::string& ruled_out,
    const AveragingOptions::MeanOf& mean_of,
    std::string& why_not) {
  using Mover = AveragingOptions::Mover;
  why_not.clear();
  if (mover == Mover::nccl || buckets.empty())
    return nullptr;
  // The first reason against, from the settings to the machine.
  const torch::Device device = buckets[0].second.device();
  std::vector<int64_t> values;
  why_not = ruled_out;
  for (const auto& [n, options] : buckets) {
    if (why_not.empty() &&
        (options.dtype() != torch::kFloat32 || options.device() != device))
      why_not = "the gradients are not all float32 on one device";
    values.push_back(n);
  }
  if (why_not.empty() && !device.is_cuda())
    why_not = "they are on " + device.str() +
        ", where Gloo sends them; the copy engines are CUDA GPUs'";
  if (why_not.empty() && !mean_of)
    why_not = "no kernel for the mean was given to the averager";
  if (why_not.empty())
    why_not = unavailable(device);
  std::unique_ptr<CopyEngineMean> made;
  if (why_not.empty()) {
    std::string failed;
    try {
      made = map_buckets(values, device, mean_of, scatter);
    } catch (const std::exception& e) {
      failed = why_of(e);
    }
    torch::Tensor mapped = torch::full(
        {1}, made ? 1.0 : 0.0, torch::TensorOptions().device(device));
    all_reduce_mean({mapped});
    if (mapped.item<double>() == 1.0)
      return made;
    why_not = failed.empty() ? "another process could not map them"
                             : "mapping them failed: " + failed;
  }
  if (mover == Mover::copy_engines)
    throw UserError(
        "grad_average=copy_engines: the copy engines cannot average these "
        "gradients (" +
        why_not +
        "). Use grad_average=auto (copy engines where they can, else NCCL) "
        "or grad_average=nccl.");
  if (!device.is_cuda())
    why_not.clear(); // nothing to say where only Gloo could send
  return nullptr;
}

} // namespace orchard::dist::detail
