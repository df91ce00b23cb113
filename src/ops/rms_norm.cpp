#include "ops/rms_norm.h"

#include "core/torch_compat.h"
#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace orchard::ops {

torch::Tensor rms_norm_reference(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    double eps) {
  auto x32 = x.to(torch::kFloat32);
  x32 = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * x32.to(x.scalar_type());
}

torch::Tensor rms_norm_unscaled(const torch::Tensor& x, double eps) {
  if (auto fused = compat::fused_rms_norm(x, eps))
    return *fused;
  const auto f = x.to(c10::promoteTypes(x.scalar_type(), torch::kFloat32));
  return (f * torch::rsqrt(f.square().mean(-1, true) + eps))
      .to(x.scalar_type());
}

bool rms_norm_is_fused(const torch::Tensor& x, const torch::Tensor& weight) {
  return kernel::usable({x, weight}) && weight.dim() == 1 && x.dim() >= 1 &&
      weight.size(0) == x.size(-1);
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
  kernel::check(
      cuda::rms_norm(
          kernel::dtype_of(x),
          xc.data_ptr(),
          wc.data_ptr(),
          y.data_ptr(),
          C == 0 ? 0 : xc.numel() / C,
          C,
          float(eps),
          kernel::stream_of(x)),
      "rms_norm");
  return y;
#else
  return rms_norm_reference(x, weight, eps);
#endif
}

std::pair<torch::Tensor, torch::Tensor> add_rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    double eps) {
  if (!rms_norm_is_fused(x, weight) || !kernel::usable({x, residual}) ||
      residual.sizes() != x.sizes()) {
    auto s = x + residual;
    return {s, rms_norm(s, weight, eps)};
  }
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(x.device());
  auto xc = x.contiguous();
  auto rc = residual.contiguous();
  auto wc = weight.contiguous();
  auto sum = torch::empty_like(xc);
  auto y = torch::empty_like(xc);
  const int64_t C = x.size(-1);
  kernel::check(
      cuda::add_rms_norm(
          kernel::dtype_of(x),
          xc.data_ptr(),
          rc.data_ptr(),
          wc.data_ptr(),
          sum.data_ptr(),
          y.data_ptr(),
          C == 0 ? 0 : xc.numel() / C,
          C,
          float(eps),
          kernel::stream_of(x)),
      "add_rms_norm");
  return {sum, y};
#else
  auto s = x + residual;
  return {s, rms_norm_reference(s, weight, eps)};
#endif
}

} // namespace orchard::ops
