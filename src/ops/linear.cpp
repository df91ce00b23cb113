#include "ops/linear.h"

#include "ops/kernel_call.h"
#include "ops/silu_mul.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

#include <cstdint>

namespace orchard::ops {

namespace {

bool aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

} // namespace

bool linear_is_matvec(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias) {
#ifdef ORCHARD_CUDA_KERNELS
  if (!kernel::usable({x, weight}) ||
      (bias.defined() && !kernel::usable({x, bias})))
    return false;
  const int64_t per_piece = 16 / int64_t(x.element_size());
  return x.dim() == 2 && weight.dim() == 2 &&
      x.size(0) <= cuda::kMatvecMaxRows && x.size(1) == weight.size(1) &&
      x.size(1) % per_piece == 0 && x.is_contiguous() &&
      weight.is_contiguous() && aligned16(x) && aligned16(weight) &&
      (!bias.defined() ||
       (bias.dim() == 1 && bias.size(0) == weight.size(0) &&
        bias.is_contiguous()));
#else
  (void)x, (void)weight, (void)bias, (void)aligned16;
  return false;
#endif
}

#ifdef ORCHARD_CUDA_KERNELS
namespace {

// The matrix-vector kernel `launch` (cuda::matvec or its gated form) on x
// and weight, writing `outputs` values a row.
using MatvecKernel = int (*)(
    cuda::Dtype,
    const void*,
    const void*,
    const void*,
    void*,
    int64_t,
    int64_t,
    int64_t,
    void*);
torch::Tensor run_matvec(
    MatvecKernel launch,
    const char* op,
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    int64_t outputs) {
  const c10::cuda::CUDAGuard on_device(x.device());
  auto y = torch::empty({x.size(0), outputs}, x.options());
  kernel::check(
      launch(
          kernel::dtype_of(x),
          x.data_ptr(),
          weight.data_ptr(),
          bias.defined() ? bias.data_ptr() : nullptr,
          y.data_ptr(),
          x.size(0),
          outputs,
          x.size(1),
          kernel::stream_of(x)),
      op);
  return y;
}

} // namespace
#endif

torch::Tensor linear(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias) {
  if (!linear_is_matvec(x, weight, bias))
    return bias.defined() ? at::addmm(bias, x, weight.t())
                          : at::mm(x, weight.t());
#ifdef ORCHARD_CUDA_KERNELS
  return run_matvec(cuda::matvec, "linear", x, weight, bias, weight.size(0));
#else
  return at::mm(x, weight.t()); // linear_is_matvec is false without them
#endif
}

torch::Tensor linear_silu_mul(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias) {
  TORCH_CHECK(
      weight.dim() == 2 && weight.size(0) % 2 == 0,
      "linear_silu_mul: the weight must stack two halves of equal rows, got ",
      weight.sizes());
  const int64_t half = weight.size(0) / 2;
  if (!linear_is_matvec(x, weight, bias)) {
    auto gu = linear(x, weight, bias);
    return silu_mul(gu.narrow(-1, 0, half), gu.narrow(-1, half, half));
  }
#ifdef ORCHARD_CUDA_KERNELS
  return run_matvec(
      cuda::matvec_silu_mul, "linear_silu_mul", x, weight, bias, half);
#else
  return {}; // linear_is_matvec is false without the kernels
#endif
}

} // namespace orchard::ops
