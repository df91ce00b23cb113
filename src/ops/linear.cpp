#include "ops/linear.h"

#include "ops/kernel_call.h"
#include "ops/rms_norm.h"
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

torch::Tensor linear(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias) {
  if (!linear_is_matvec(x, weight, bias))
    return bias.defined() ? at::addmm(bias, x, weight.t())
                          : at::mm(x, weight.t());
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(x.device());
  auto y = torch::empty({x.size(0), weight.size(0)}, x.options());
  kernel::check(
      cuda::matvec(
          kernel::dtype_of(x),
          x.data_ptr(),
          weight.data_ptr(),
          bias.defined() ? bias.data_ptr() : nullptr,
          y.data_ptr(),
          x.size(0),
          weight.size(0),
          x.size(1),
          kernel::stream_of(x)),
      "linear");
  return y;
#else
  return at::mm(x, weight.t());
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
  const c10::cuda::CUDAGuard on_device(x.device());
  auto y = torch::empty({x.size(0), half}, x.options());
  kernel::check(
      cuda::matvec_silu_mul(
          kernel::dtype_of(x),
          x.data_ptr(),
          weight.data_ptr(),
          bias.defined() ? bias.data_ptr() : nullptr,
          y.data_ptr(),
          x.size(0),
          half,
          x.size(1),
          kernel::stream_of(x)),
      "linear_silu_mul");
  return y;
#else
  return {}; // linear_is_matvec is false without the kernels
#endif
}

ResidualSum linear_add(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    const torch::Tensor& residual) {
  const bool fused = linear_is_matvec(x, weight, bias) &&
      kernel::usable({x, residual}) && residual.is_contiguous() &&
      residual.sizes() == torch::IntArrayRef({x.size(0), weight.size(0)});
  if (!fused)
    return {residual + linear(x, weight, bias), {}};
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(x.device());
  const auto dt = kernel::dtype_of(x);
  const int64_t out = weight.size(0), in = x.size(1);
  ResidualSum r{
      torch::empty({x.size(0), out}, x.options()),
      torch::empty(
          {cuda::matvec_residual_squares(dt, out, in)},
          x.options().dtype(torch::kFloat32))};
  kernel::check(
      cuda::matvec_residual(
          dt,
          x.data_ptr(),
          weight.data_ptr(),
          bias.defined() ? bias.data_ptr() : nullptr,
          residual.data_ptr(),
          r.sum.data_ptr(),
          r.squares.data_ptr<float>(),
          x.size(0),
          out,
          in,
          kernel::stream_of(x)),
      "linear_add");
  return r;
#else
  return {};
#endif
}

torch::Tensor normed_linear(
    const ResidualSum& s,
    const torch::Tensor& norm_weight,
    double eps,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    bool silu_mul_halves) {
  const bool fused = s.squares.defined() &&
      linear_is_matvec(s.sum, weight, bias) &&
      kernel::usable({s.sum, norm_weight}) && norm_weight.is_contiguous() &&
      norm_weight.numel() == s.sum.size(1) && aligned16(norm_weight) &&
      s.squares.is_contiguous() && s.squares.device() == s.sum.device() &&
      s.squares.scalar_type() == torch::kFloat32 &&
      (!silu_mul_halves || weight.size(0) % 2 == 0);
  if (!fused) {
    auto h = rms_norm(s.sum, norm_weight, eps);
    return silu_mul_halves ? linear_silu_mul(h, weight, bias)
                           : linear(h, weight, bias);
  }
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(s.sum.device());
  const int64_t rows = silu_mul_halves ? weight.size(0) / 2 : weight.size(0);
  auto y = torch::empty({s.sum.size(0), rows}, s.sum.options());
  kernel::check(
      cuda::matvec_normed(
          kernel::dtype_of(s.sum),
          s.sum.data_ptr(),
          s.squares.data_ptr<float>(),
          s.squares.numel(),
          norm_weight.data_ptr(),
          float(eps),
          weight.data_ptr(),
          bias.defined() ? bias.data_ptr() : nullptr,
          y.data_ptr(),
          s.sum.size(0),
          weight.size(0),
          s.sum.size(1),
          silu_mul_halves,
          kernel::stream_of(s.sum)),
      "normed_linear");
  return y;
#else
  return {};
#endif
}

} // namespace orchard::ops
