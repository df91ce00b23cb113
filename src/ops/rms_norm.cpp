#include "ops/rms_norm.h"

#ifdef ORCHARD_CUDA_KERNELS
#include "ops/cuda/kernels.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <stdexcept>
#include <string>

namespace orchard::ops {

torch::Tensor rms_norm_reference(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    double eps) {
  auto x32 = x.to(torch::kFloat32);
  x32 = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * x32.to(x.scalar_type());
}

bool rms_norm_is_fused(const torch::Tensor& x, const torch::Tensor& weight) {
#ifdef ORCHARD_CUDA_KERNELS
  const auto t = x.scalar_type();
  return x.is_cuda() && weight.device() == x.device() &&
      weight.scalar_type() == t &&
      (t == torch::kFloat32 || t == torch::kFloat16 || t == torch::kBFloat16) &&
      weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1) &&
      !(torch::GradMode::is_enabled() &&
        (x.requires_grad() || weight.requires_grad()));
#else
  return false;
#endif
}

torch::Tensor rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    double eps) {
  if (!rms_norm_is_fused(x, weight))
    return rms_norm_reference(x, weight, eps);
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(x.device());
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t C = x.size(-1);
  const auto t = x.scalar_type();
  const cuda::Dtype dtype = t == torch::kFloat32 ? cuda::Dtype::float32
      : t == torch::kFloat16                     ? cuda::Dtype::float16
                                                 : cuda::Dtype::bfloat16;
  const int err = cuda::rms_norm(
      dtype,
      xc.data_ptr(),
      wc.data_ptr(),
      y.data_ptr(),
      C == 0 ? 0 : xc.numel() / C,
      C,
      float(eps),
      c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  if (err != 0)
    throw std::runtime_error(
        "[rms_norm] the CUDA kernel failed to launch (cudaError " +
        std::to_string(err) + ")");
  return y;
#else
  return rms_norm_reference(x, weight, eps);
#endif
}

} // namespace orchard::ops
