#include "ops/fused_train.h"

#include "ops/fused_cpu.h"
#include "ops/kernel_call.h"
#include "ops/rms_norm.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#endif

#include <cstdint>

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

// t, or a copy of it where its first value is not 16-byte aligned (a view
// into a larger tensor): the kernels load 8 or 16 bytes at a time.
torch::Tensor aligned(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

struct ReluSquare : torch::autograd::Function<ReluSquare> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& u_in) {
    const c10::cuda::CUDAGuard on_device(u_in.device());
    auto u = u_in.contiguous();
    auto y = torch::empty_like(u);
    kernel::check(
        cuda::relu_square(
            kernel::dtype_of(u),
            u.data_ptr(),
            y.data_ptr(),
            u.numel(),
            kernel::stream_of(u)),
        "relu_square");
    ctx->save_for_backward({u});
    return y;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto u = ctx->get_saved_variables()[0];
    if (!grads[0].defined())
      return {torch::Tensor()};
    const c10::cuda::CUDAGuard on_device(u.device());
    auto dy = grads[0].to(u.scalar_type()).contiguous();
    auto du = torch::empty_like(u);
    kernel::check(
        cuda::relu_square_backward(
            kernel::dtype_of(u),
            u.data_ptr(),
            dy.data_ptr(),
            du.data_ptr(),
            u.numel(),
            kernel::stream_of(u)),
        "relu_square_backward");
    return {du};
  }
};

struct RotaryNormQkv : torch::autograd::Function<RotaryNormQkv> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& qkv_in,
      int64_t H,
      int64_t Hkv,
      const torch::Tensor& cos_in,
      const torch::Tensor& sin_in,
      double eps) {
    const c10::cuda::CUDAGuard on_device(qkv_in.device());
    auto qkv = aligned(qkv_in);
    auto cos = aligned(cos_in), sin = aligned(sin_in);
    const int64_t B = qkv.size(0), T = qkv.size(1);
    const int64_t D = qkv.size(2) / (H + 2 * Hkv);
    auto q = torch::empty({B, T, H, D}, qkv.options());
    auto k = torch::empty({B, T, Hkv, D}, qkv.options());
    // v is the product's own columns, not a copy (attention takes strided
    // heads): a third of the kernel's traffic.
    auto v = qkv.narrow(2, (H + Hkv) * D, Hkv * D).view({B, T, Hkv, D});
    auto rstd =
        torch::empty({B * T * (H + Hkv)}, qkv.options().dtype(torch::kFloat32));
    kernel::check(
        cuda::rotary_norm_qkv(
            kernel::dtype_of(qkv),
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            q.data_ptr(),
            k.data_ptr(),
            nullptr,
            rstd.data_ptr<float>(),
            B * T,
            T,
            H,
            Hkv,
            D,
            float(eps),
            kernel::stream_of(qkv)),
        "rotary_norm_qkv");
    ctx->save_for_backward({q, k, rstd, cos, sin});
    ctx->saved_data["H"] = H;
    ctx->saved_data["Hkv"] = Hkv;
    return {q, k, v};
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &rstd = saved[2];
    const auto &cos = saved[3], &sin = saved[4];
    const int64_t H = ctx->saved_data["H"].toInt();
    const int64_t Hkv = ctx->saved_data["Hkv"].toInt();
    const c10::cuda::CUDAGuard on_device(q.device());
    const int64_t B = q.size(0), T = q.size(1), D = q.size(3);
    // An output nothing used has no gradient: zeros in its place. The
    // others are read where attention's backward left them (its layout,
    // not necessarily (B, T, heads, D)) when each head's values are
    // contiguous and 16-byte aligned, else copied.
    auto grad = [&](size_t i, const torch::Tensor& like) {
      if (!grads[i].defined())
        return torch::zeros_like(like);
      auto g = grads[i].to(like.scalar_type());
      const int64_t per16 = 16 / int64_t(g.element_size());
      const bool readable = g.stride(3) == 1 &&
          reinterpret_cast<uintptr_t>(g.data_ptr()) % 16 == 0 &&
          g.stride(0) % per16 == 0 && g.stride(1) % per16 == 0 &&
          g.stride(2) % per16 == 0;
      return readable ? g : aligned(g);
    };
    auto strides = [](const torch::Tensor& g) {
      return cuda::HeadStrides{g.stride(0), g.stride(1), g.stride(2)};
    };
    auto dq = grad(0, q), dk = grad(1, k);
    auto dv = grad(2, k);
    auto dqkv = torch::empty({B, T, (H + 2 * Hkv) * D}, q.options());
    kernel::check(
        cuda::rotary_norm_qkv_backward(
            kernel::dtype_of(q),
            dq.data_ptr(),
            dk.data_ptr(),
            dv.data_ptr(),
            strides(dq),
            strides(dk),
            strides(dv),
            q.data_ptr(),
            k.data_ptr(),
            rstd.data_ptr<float>(),
            cos.data_ptr(),
            sin.data_ptr(),
            dqkv.data_ptr(),
            B * T,
            T,
            H,
            Hkv,
            D,
            kernel::stream_of(q)),
        "rotary_norm_qkv_backward");
    return {
        dqkv,
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

cuda::Dtype kernel_dtype(torch::ScalarType t) {
  return t == torch::kFloat16 ? cuda::Dtype::float16
      : t == torch::kBFloat16 ? cuda::Dtype::bfloat16
                              : cuda::Dtype::float32;
}

struct ResidualAddRmsNorm : torch::autograd::Function<ResidualAddRmsNorm> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& x_in,
      const torch::Tensor& b_in,
      double eps,
      int64_t out_type) {
    const c10::cuda::CUDAGuard on_device(x_in.device());
    auto x = aligned(x_in), b = aligned(b_in);
    const auto out = static_cast<torch::ScalarType>(out_type);
    const int64_t C = x.size(-1), rows = x.numel() / C;
    auto s = torch::empty_like(x);
    auto y = torch::empty_like(x, x.options().dtype(out));
    auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat32));
    kernel::check(
        cuda::residual_add_rms_norm(
            kernel_dtype(x.scalar_type()),
            kernel_dtype(b.scalar_type()),
            kernel_dtype(out),
            x.data_ptr(),
            b.data_ptr(),
            s.data_ptr(),
            y.data_ptr(),
            rstd.data_ptr<float>(),
            rows,
            C,
            float(eps),
            kernel::stream_of(x)),
        "residual_add_rms_norm");
    ctx->save_for_backward({s, rstd});
    ctx->saved_data["branch"] = int64_t(b.scalar_type());
    ctx->saved_data["out"] = out_type;
    return {s, y};
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &s = saved[0], &rstd = saved[1];
    const auto branch =
        static_cast<torch::ScalarType>(ctx->saved_data["branch"].toInt());
    const auto out =
        static_cast<torch::ScalarType>(ctx->saved_data["out"].toInt());
    const c10::cuda::CUDAGuard on_device(s.device());
    const int64_t C = s.size(-1), rows = s.numel() / C;
    auto ds = grads[0].defined() ? aligned(grads[0].to(s.scalar_type()))
                                 : torch::Tensor();
    auto dy = grads[1].defined() ? aligned(grads[1].to(out))
                                 : torch::zeros_like(s, s.options().dtype(out));
    auto dx = torch::empty_like(s);
    const bool other = branch != s.scalar_type();
    auto db = other ? torch::empty_like(s, s.options().dtype(branch)) : dx;
    kernel::check(
        cuda::residual_add_rms_norm_backward(
            kernel_dtype(s.scalar_type()),
            kernel_dtype(branch),
            kernel_dtype(out),
            ds.defined() ? ds.data_ptr() : nullptr,
            dy.data_ptr(),
            s.data_ptr(),
            rstd.data_ptr<float>(),
            dx.data_ptr(),
            other ? db.data_ptr() : nullptr,
            rows,
            C,
            kernel::stream_of(s)),
        "residual_add_rms_norm_backward");
    return {dx, db, torch::Tensor(), torch::Tensor()};
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

torch::Tensor relu_square_reference(const torch::Tensor& u) {
  // r * r rather than square(): autocast runs pow in float32, which would
  // write the activation in float32 and cast it back.
  const auto r = torch::relu(u);
  return r * r;
}

bool relu_square_is_fused(const torch::Tensor& u) {
  return kernel::usable_with_grad({u}) || cpu::takes({u});
}

torch::Tensor relu_square(const torch::Tensor& u) {
  if (cpu::takes({u}))
    return cpu::relu_square(u);
#ifdef ORCHARD_CUDA_KERNELS
  if (relu_square_is_fused(u))
    return ReluSquare::apply(u);
#endif
  return relu_square_reference(u);
}

torch::Tensor apply_rotary(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin) {
  const int64_t d = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, d), x2 = x.narrow(-1, d, d);
  auto c = cos.unsqueeze(0).unsqueeze(2).to(x.scalar_type()); // (1, T, 1, D/2)
  auto s = sin.unsqueeze(0).unsqueeze(2).to(x.scalar_type());
  return torch::cat({x1 * c + x2 * s, x2 * c - x1 * s}, -1);
}

namespace {

// D of a stacked product of H + 2 Hkv heads; throws where it does not split.
int64_t head_size(const torch::Tensor& qkv, int64_t H, int64_t Hkv) {
  TORCH_CHECK(
      qkv.dim() == 3 && H > 0 && Hkv > 0 && qkv.size(2) % (H + 2 * Hkv) == 0,
      "rotary_norm_qkv: a (B, T, (H + 2 Hkv) D) product was expected, got ",
      qkv.sizes(),
      " for H=",
      H,
      ", Hkv=",
      Hkv);
  return qkv.size(2) / (H + 2 * Hkv);
}

} // namespace

std::array<torch::Tensor, 3> rotary_norm_qkv_reference(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    double eps) {
  const int64_t D = head_size(qkv, H, Hkv);
  const int64_t B = qkv.size(0), T = qkv.size(1);
  auto parts = qkv.split_with_sizes({H * D, Hkv * D, Hkv * D}, -1);
  auto q = parts[0].view({B, T, H, D}), k = parts[1].view({B, T, Hkv, D});
  return {
      rms_norm_unscaled(apply_rotary(q, cos, sin), eps),
      rms_norm_unscaled(apply_rotary(k, cos, sin), eps),
      parts[2].view({B, T, Hkv, D})};
}

bool rotary_norm_qkv_is_fused(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin) {
  if (!qkv.defined() || qkv.dim() != 3 || H <= 0 || Hkv <= 0 ||
      qkv.size(2) % (H + 2 * Hkv) != 0)
    return false;
  const int64_t D = qkv.size(2) / (H + 2 * Hkv);
  const bool tables = cos.defined() && sin.defined() && cos.dim() == 2 &&
      cos.sizes() == sin.sizes() && cos.size(0) == qkv.size(1) &&
      cos.size(1) == D / 2 && D % 2 == 0 && !cos.requires_grad() &&
      !sin.requires_grad();
  if (cpu::takes({qkv, cos, sin}))
    return tables;
#ifdef ORCHARD_CUDA_KERNELS
  if (!kernel::usable_with_grad({qkv, cos, sin}))
    return false;
  // Rows are indexed in 32 bits there.
  const int64_t rows = qkv.size(0) * qkv.size(1) * (H + 2 * Hkv);
  return cuda::rotary_norm_qkv_supports(D) && rows < (int64_t(1) << 31) &&
      tables;
#else
  return false;
#endif
}

std::array<torch::Tensor, 3> rotary_norm_qkv(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    double eps) {
  head_size(qkv, H, Hkv);
  if (qkv.device().is_cpu() && rotary_norm_qkv_is_fused(qkv, H, Hkv, cos, sin))
    return cpu::rotary_norm_qkv(qkv, H, Hkv, cos, sin, eps);
#ifdef ORCHARD_CUDA_KERNELS
  if (rotary_norm_qkv_is_fused(qkv, H, Hkv, cos, sin)) {
    auto out = RotaryNormQkv::apply(qkv, H, Hkv, cos, sin, eps);
    return {out[0], out[1], out[2]};
  }
#endif
  return rotary_norm_qkv_reference(qkv, H, Hkv, cos, sin, eps);
}

std::pair<torch::Tensor, torch::Tensor> residual_add_rms_norm_reference(
    const torch::Tensor& x,
    const torch::Tensor& b,
    double eps,
    std::optional<torch::ScalarType> out) {
  auto s = x + b;
  auto y = rms_norm_unscaled(s, eps);
  return {s, out ? y.to(*out) : y};
}

bool residual_add_rms_norm_is_fused(
    const torch::Tensor& x,
    const torch::Tensor& b,
    torch::ScalarType out) {
  if (cpu::takes({x, b}))
    return x.sizes() == b.sizes() && x.dim() >= 1 && x.size(-1) > 0 &&
        out == x.scalar_type();
#ifdef ORCHARD_CUDA_KERNELS
  auto ok = [](torch::ScalarType t) {
    return t == torch::kFloat32 || t == torch::kFloat16 ||
        t == torch::kBFloat16;
  };
  if (!x.defined() || !b.defined() || !x.is_cuda() ||
      b.device() != x.device() || x.sizes() != b.sizes() || x.dim() < 1 ||
      !ok(x.scalar_type()) || !ok(b.scalar_type()) || !ok(out))
    return false;
  // s has x's dtype: the branch may not be wider than the residual.
  if (c10::promoteTypes(x.scalar_type(), b.scalar_type()) != x.scalar_type())
    return false;
  return cuda::residual_add_rms_norm_supports(
      kernel_dtype(x.scalar_type()),
      kernel_dtype(b.scalar_type()),
      kernel_dtype(out),
      x.size(-1));
#else
  (void)x, (void)b, (void)out;
  return false;
#endif
}

std::pair<torch::Tensor, torch::Tensor> residual_add_rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& b,
    double eps,
    std::optional<torch::ScalarType> out) {
  const auto type = out.value_or(x.scalar_type());
  if (x.device().is_cpu() && residual_add_rms_norm_is_fused(x, b, type))
    return cpu::residual_add_rms_norm(x, b, eps);
#ifdef ORCHARD_CUDA_KERNELS
  if (residual_add_rms_norm_is_fused(x, b, type)) {
    auto r = ResidualAddRmsNorm::apply(x, b, eps, int64_t(type));
    return {r[0], r[1]};
  }
#endif
  return residual_add_rms_norm_reference(x, b, eps, out);
}

} // namespace orchard::ops
