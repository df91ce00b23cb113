#include "ops/silu_mul.h"

#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace orchard::ops {

torch::Tensor silu_mul_reference(
    const torch::Tensor& g,
    const torch::Tensor& u) {
  return torch::silu(g) * u;
}

bool silu_mul_is_fused(const torch::Tensor& g, const torch::Tensor& u) {
  return kernel::usable({g, u}) && g.dim() == 2 && g.sizes() == u.sizes() &&
      g.stride(1) == 1 && u.stride(1) == 1;
}

torch::Tensor silu_mul(const torch::Tensor& g, const torch::Tensor& u) {
  if (!silu_mul_is_fused(g, u))
    return silu_mul_reference(g, u);
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(g.device());
  auto y = torch::empty(g.sizes(), g.options());
  kernel::check(
      cuda::silu_mul(
          kernel::dtype_of(g),
          g.data_ptr(),
          u.data_ptr(),
          g.stride(0),
          u.stride(0),
          y.data_ptr(),
          g.size(0),
          g.size(1),
          kernel::stream_of(g)),
      "silu_mul");
  return y;
#else
  return silu_mul_reference(g, u);
#endif
}

} // namespace orchard::ops
