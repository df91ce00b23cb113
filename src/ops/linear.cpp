#include "ops/linear.h"

#include "core/gradient_sink.h"
#include "core/torch_compat.h"
#include "ops/kernel_call.h"
#include "ops/silu_mul.h"

#include <torch/csrc/autograd/custom_function.h>

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

bool autocast_linear_is_fused(
    const torch::Tensor& x,
    const torch::Tensor& weight) {
#if ORCHARD_MM_OUT_DTYPE
  const auto dtype = compat::autocast_dtype(torch::kCUDA);
  return x.is_cuda() && weight.is_cuda() && weight.dim() == 2 &&
      x.dim() >= 1 && x.size(-1) == weight.size(1) &&
      weight.scalar_type() == torch::kFloat32 && weight.requires_grad() &&
      torch::GradMode::is_enabled() &&
      (dtype == torch::kBFloat16 || dtype == torch::kFloat16) &&
      (x.scalar_type() == dtype || x.scalar_type() == torch::kFloat32);
#else
  (void)x, (void)weight;
  return false;
#endif
}

#if ORCHARD_MM_OUT_DTYPE
namespace {

struct AutocastLinear : torch::autograd::Function<AutocastLinear> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& x,
      const torch::Tensor& weight,
      int64_t dtype) {
    const auto low = static_cast<torch::ScalarType>(dtype);
    auto x2 = x.to(low).reshape({-1, x.size(-1)});
    auto w = weight.to(low);
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    ctx->save_for_backward({x2, w});
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["weight_key"] = int64_t(weight_key(weight));
    return at::mm(x2, w.t()).view(sizes);
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &w = saved[1];
    auto dy = grads[0].reshape({-1, w.size(0)}).to(w.scalar_type());
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0))
      dx = at::mm(dy, w)
               .view(ctx->saved_data["x_sizes"].toIntVector())
               .to(static_cast<torch::ScalarType>(
                   ctx->saved_data["x_dtype"].toInt()));
    if (ctx->needs_input_grad(1)) {
      // Into the gradient averager's bucket where it hands one out
      // (core/gradient_sink.h), else a tensor of its own.
      dw = gradient_destination(
          std::intptr_t(ctx->saved_data["weight_key"].toInt()),
          w.sizes(),
          torch::kFloat32);
      if (dw.defined())
        at::mm_out(dw, dy.t(), x2, torch::kFloat32);
      else
        dw = at::mm(dy.t(), x2, torch::kFloat32);
    }
    return {dx, dw, torch::Tensor()};
  }
};

} // namespace
#endif

torch::Tensor autocast_linear(
    const torch::Tensor& x,
    const torch::Tensor& weight) {
#if ORCHARD_MM_OUT_DTYPE
  if (autocast_linear_is_fused(x, weight))
    return AutocastLinear::apply(
        x, weight, int64_t(compat::autocast_dtype(torch::kCUDA)));
#endif
  return torch::nn::functional::linear(x, weight);
}

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
