#include "ops/mean_of.h"

#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace orchard::ops {

torch::Tensor mean_of_reference(const std::vector<torch::Tensor>& parts) {
  torch::Tensor sum = parts.at(0).clone();
  for (size_t k = 1; k < parts.size(); ++k)
    sum.add_(parts[k]);
  return sum.mul_(1.0 / double(parts.size()));
}

void mean_of(
    torch::Tensor& out,
    const std::vector<torch::Tensor>& parts,
    torch::Tensor* squares) {
  TORCH_CHECK(!parts.empty(), "[mean_of] no parts to average");
  for (const auto& p : parts)
    TORCH_CHECK(
        p.sizes() == out.sizes() && p.scalar_type() == torch::kFloat32 &&
            out.scalar_type() == torch::kFloat32 && p.is_contiguous() &&
            out.is_contiguous() && p.device() == out.device(),
        "[mean_of] every part must be of out's size, float32, contiguous "
        "and on its device");
  if (out.numel() == 0) {
    if (squares)
      *squares = torch::zeros({1}, out.options());
    return;
  }
#ifdef ORCHARD_CUDA_KERNELS
  auto aligned = [](const torch::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  bool fused = out.is_cuda() && out.numel() % 4 == 0 && aligned(out) &&
      int(parts.size()) <= cuda::kMeanOfMaxParts;
  std::vector<const float*> at;
  for (const auto& p : parts) {
    fused = fused && aligned(p);
    at.push_back(p.data_ptr<float>());
  }
  if (fused) {
    const c10::cuda::CUDAGuard on_device(out.device());
    torch::Tensor partials; // each block's sum of squares
    if (squares)
      partials =
          torch::empty({cuda::mean_of_blocks(out.numel())}, out.options());
    kernel::check(
        cuda::mean_of(
            at.data(),
            int(at.size()),
            out.data_ptr<float>(),
            out.numel(),
            float(1.0 / double(parts.size())),
            squares ? partials.data_ptr<float>() : nullptr,
            kernel::stream_of(out)),
        "mean_of");
    if (squares) // the blocks' sums, added in block order
      *squares = partials.sum().reshape({1});
    return;
  }
#endif
  out.copy_(mean_of_reference(parts));
  if (squares)
    *squares = out.square().sum().reshape({1});
}

} // namespace orchard::ops
