#include "ops/fused_train.h"

#include "ops/kernel_call.h"
#include "ops/rms_norm.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#endif

namespace orchard::ops {
namespace {

#ifdef ORCHARD_CUDA_KERNELS
// (outer, mid, inner) of a contiguous view of t around dimension dim.
struct Around {
  int64_t outer = 1, mid = 1, inner = 1;
};
Around around(const torch::Tensor& t, int64_t dim) {
  Around a;
  for (int64_t d = 0; d < t.dim(); ++d)
    (d < dim ? a.outer : d == dim ? a.mid : a.inner) *= t.size(d);
  return a;
}

struct SiluMulHalves : torch::autograd::Function<SiluMulHalves> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& gu_in,
      int64_t dim) {
    const c10::cuda::CUDAGuard on_device(gu_in.device());
    auto gu = gu_in.contiguous();
    auto sizes = gu.sizes().vec();
    sizes[dim] /= 2;
    auto y = torch::empty(sizes, gu.options());
    const auto a = around(gu, dim);
    const int64_t inner = a.mid / 2 * a.inner;
    kernel::check(
        cuda::silu_mul_halves(
            kernel::dtype_of(gu),
            gu.data_ptr(),
            y.data_ptr(),
            a.outer,
            inner,
            kernel::stream_of(gu)),
        "silu_mul_halves");
    ctx->save_for_backward({gu});
    ctx->saved_data["dim"] = dim;
    return y;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto gu = ctx->get_saved_variables()[0];
    if (!grads[0].defined())
      return {torch::Tensor(), torch::Tensor()};
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const c10::cuda::CUDAGuard on_device(gu.device());
    auto dy = grads[0].to(gu.scalar_type()).contiguous();
    auto dgu = torch::empty_like(gu);
    const auto a = around(gu, dim);
    kernel::check(
        cuda::silu_mul_halves_backward(
            kernel::dtype_of(gu),
            gu.data_ptr(),
            dy.data_ptr(),
            dgu.data_ptr(),
            a.outer,
            a.mid / 2 * a.inner,
            kernel::stream_of(gu)),
        "silu_mul_halves_backward");
    return {dgu, torch::Tensor()};
  }
};

struct AddRmsNormUnscaled : torch::autograd::Function<AddRmsNormUnscaled> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& a_in,
      const torch::Tensor& b_in,
      int64_t dim,
      double eps,
      int64_t count) {
    const c10::cuda::CUDAGuard on_device(a_in.device());
    auto a = a_in.contiguous(), b = b_in.contiguous();
    auto y = torch::empty_like(a);
    const auto s = around(a, dim);
    auto rstd =
        torch::empty({s.outer * s.inner}, a.options().dtype(torch::kFloat32));
    kernel::check(
        cuda::add_rms_norm_unscaled(
            kernel::dtype_of(a),
            a.data_ptr(),
            b.data_ptr(),
            y.data_ptr(),
            rstd.data_ptr<float>(),
            s.outer,
            s.mid,
            s.inner,
            count,
            float(eps),
            kernel::stream_of(a)),
        "add_rms_norm_unscaled");
    ctx->save_for_backward({y, rstd});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["count"] = count;
    return y;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &y = saved[0], &rstd = saved[1];
    if (!grads[0].defined())
      return {
          torch::Tensor(),
          torch::Tensor(),
          torch::Tensor(),
          torch::Tensor(),
          torch::Tensor()};
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const int64_t count = ctx->saved_data["count"].toInt();
    const c10::cuda::CUDAGuard on_device(y.device());
    auto dy = grads[0].to(y.scalar_type()).contiguous();
    auto dx = torch::empty_like(y);
    const auto s = around(y, dim);
    kernel::check(
        cuda::rms_norm_unscaled_backward(
            kernel::dtype_of(y),
            dy.data_ptr(),
            y.data_ptr(),
            rstd.data_ptr<float>(),
            dx.data_ptr(),
            s.outer,
            s.mid,
            s.inner,
            count,
            kernel::stream_of(y)),
        "rms_norm_unscaled_backward");
    return {dx, dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

int64_t positive_dim(const torch::Tensor& t, int64_t dim) {
  return dim < 0 ? dim + t.dim() : dim;
}

} // namespace

torch::Tensor silu_mul_halves_reference(const torch::Tensor& gu, int64_t dim) {
  const int64_t half = gu.size(dim) / 2;
  return torch::silu(gu.narrow(dim, 0, half)) * gu.narrow(dim, half, half);
}

bool silu_mul_halves_is_fused(const torch::Tensor& gu) {
  return kernel::usable_with_grad({gu});
}

torch::Tensor silu_mul_halves(const torch::Tensor& gu, int64_t dim) {
  TORCH_CHECK(
      gu.size(dim) % 2 == 0,
      "silu_mul_halves: dimension ",
      dim,
      " has an odd size ",
      gu.size(dim));
#ifdef ORCHARD_CUDA_KERNELS
  if (silu_mul_halves_is_fused(gu))
    return SiluMulHalves::apply(gu, positive_dim(gu, dim));
#endif
  return silu_mul_halves_reference(gu, dim);
}

torch::Tensor add_rms_norm_unscaled_reference(
    const torch::Tensor& a,
    const torch::Tensor& b,
    int64_t dim,
    double eps,
    int64_t count) {
  const auto s = a + b;
  const int64_t n = count > 0 ? count : s.size(dim);
  if (n == s.size(dim) && positive_dim(s, dim) == s.dim() - 1)
    return rms_norm_unscaled(s, eps);
  const auto f = s.to(c10::promoteTypes(s.scalar_type(), torch::kFloat32));
  return (f * torch::rsqrt(f.square().sum(dim, true) / double(n) + eps))
      .to(s.scalar_type());
}

bool add_rms_norm_unscaled_is_fused(
    const torch::Tensor& a,
    const torch::Tensor& b) {
  return kernel::usable_with_grad({a, b}) && a.sizes() == b.sizes();
}

torch::Tensor add_rms_norm_unscaled(
    const torch::Tensor& a,
    const torch::Tensor& b,
    int64_t dim,
    double eps,
    int64_t count) {
  const int64_t d = positive_dim(a, dim);
  const int64_t n = count > 0 ? count : a.size(d);
  TORCH_CHECK(
      n <= a.size(d),
      "add_rms_norm_unscaled: count ",
      n,
      " exceeds dimension ",
      d,
      "'s size ",
      a.size(d));
#ifdef ORCHARD_CUDA_KERNELS
  if (add_rms_norm_unscaled_is_fused(a, b))
    return AddRmsNormUnscaled::apply(a, b, d, eps, n);
#endif
  return add_rms_norm_unscaled_reference(a, b, d, eps, n);
}

} // namespace orchard::ops
