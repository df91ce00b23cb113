#include "ops/fused_cpu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace orchard::ops::cpu {
namespace {

// Values a thread takes at least: below this, waking the other threads
// costs more than the loop.
constexpr int64_t kValuesPerTask = int64_t(1) << 15;

// f(first, last) over [0, rows) rows of `width` values each, split across
// the intra-op threads (OpenMP: this file is built with it where the
// compiler has it, see CMakeLists.txt; else one thread).
template <typename F>
void for_rows(int64_t rows, int64_t width, const F& f) {
  const int64_t grain =
      std::max<int64_t>(1, kValuesPerTask / std::max<int64_t>(1, width));
  at::parallel_for(0, rows, grain, f);
}

// sum(x[i] * y[i]) over n values, in double: four running sums, so the
// adds do not wait on each other.
template <typename T>
double dot(const T* x, const T* y, int64_t n) {
  double a[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j)
      a[j] += double(x[i + j]) * double(y[i + j]);
  for (; i < n; ++i)
    a[0] += double(x[i]) * double(y[i]);
  return (a[0] + a[1]) + (a[2] + a[3]);
}

// 1 / sqrt(mean(r^2) + eps) over a row of n values.
template <typename T>
T inverse_rms(const T* r, int64_t n, double eps) {
  return T(1.0 / std::sqrt(dot(r, r, n) / double(n) + eps));
}

// The gradient of y = r * rstd (an RMS norm without weight) for r, from y
// and dy: rstd * (dy - y * mean(dy * y)), into dr.
template <typename T>
void rms_norm_backward_row(const T* dy, const T* y, T rstd, int64_t n, T* dr) {
  const T mean = T(dot(dy, y, n) / double(n));
  for (int64_t i = 0; i < n; ++i)
    dr[i] = rstd * (dy[i] - y[i] * mean);
}

template <typename F>
void by_dtype(const torch::Tensor& t, const F& f) {
  if (t.scalar_type() == torch::kFloat64)
    f(double());
  else
    f(float());
}

struct ReluSquare : torch::autograd::Function<ReluSquare> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& u_in) {
    auto u = u_in.contiguous();
    auto y = torch::empty_like(u);
    by_dtype(u, [&](auto zero) {
      using T = decltype(zero);
      const T* pu = u.data_ptr<T>();
      T* py = y.data_ptr<T>();
      for_rows(u.numel(), 1, [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) {
          // relu keeps NaN (NaN < 0 is false), as torch::relu does.
          const T r = pu[i] < T(0) ? T(0) : pu[i];
          py[i] = r * r;
        }
      });
    });
    ctx->save_for_backward({u});
    return y;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto u = ctx->get_saved_variables()[0];
    if (!grads[0].defined())
      return {torch::Tensor()};
    auto dy = grads[0].to(u.scalar_type()).contiguous();
    auto du = torch::empty_like(u);
    by_dtype(u, [&](auto zero) {
      using T = decltype(zero);
      const T *pu = u.data_ptr<T>(), *pdy = dy.data_ptr<T>();
      T* pdu = du.data_ptr<T>();
      for_rows(u.numel(), 1, [&](int64_t first, int64_t last) {
        // relu's gradient passes where u > 0 (and where u is NaN); the
        // square's is 2 r dy, and (dy r) + (dy r) is 2 (dy r) exactly.
        // Both sides computed, then selected: a select the compiler
        // vectorizes, where a multiply in one branch stays a branch.
        for (int64_t i = first; i < last; ++i) {
          const T g = T(2) * (pdy[i] * pu[i]);
          pdu[i] = pu[i] <= T(0) ? T(0) : g;
        }
      });
    });
    return {du};
  }
};

// Rows of q and k in the stacked product: token n's head h (h < H + Hkv)
// starts at n * (H + 2 Hkv) * D + h * D; its position is n % T.
struct QkvShape {
  int64_t tokens, T, H, Hkv, D;
  int64_t heads() const {
    return H + 2 * Hkv;
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
    auto qkv = qkv_in.contiguous();
    auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
    const int64_t B = qkv.size(0), T = qkv.size(1);
    const QkvShape s{B * T, T, H, Hkv, qkv.size(2) / (H + 2 * Hkv)};
    const int64_t D = s.D, half = D / 2;
    auto q = torch::empty({B, T, H, D}, qkv.options());
    auto k = torch::empty({B, T, Hkv, D}, qkv.options());
    auto v = qkv.narrow(2, (H + Hkv) * D, Hkv * D).view({B, T, Hkv, D});
    auto rstd = torch::empty({s.tokens, H + Hkv}, qkv.options());
    by_dtype(qkv, [&](auto zero) {
      using Scalar = decltype(zero);
      const Scalar* in = qkv.data_ptr<Scalar>();
      const Scalar *pc = cos.data_ptr<Scalar>(), *ps = sin.data_ptr<Scalar>();
      Scalar *pq = q.data_ptr<Scalar>(), *pk = k.data_ptr<Scalar>();
      Scalar* pr = rstd.data_ptr<Scalar>();
      for_rows(s.tokens * (H + Hkv), D, [&](int64_t first, int64_t last) {
        for (int64_t row = first; row < last; ++row) {
          const int64_t n = row / (H + Hkv), h = row % (H + Hkv);
          const Scalar* x = in + (n * s.heads() + h) * D;
          const Scalar *c = pc + (n % T) * half, *sn = ps + (n % T) * half;
          Scalar* out =
              h < H ? pq + (n * H + h) * D : pk + (n * Hkv + h - H) * D;
          for (int64_t i = 0; i < half; ++i) {
            const Scalar x1 = x[i], x2 = x[i + half];
            out[i] = x1 * c[i] + x2 * sn[i];
            out[i + half] = x2 * c[i] - x1 * sn[i];
          }
          const Scalar r = inverse_rms(out, D, eps);
          for (int64_t i = 0; i < D; ++i)
            out[i] *= r;
          pr[row] = r;
        }
      });
    });
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
    const int64_t B = q.size(0), T = q.size(1), D = q.size(3), half = D / 2;
    const QkvShape s{B * T, T, H, Hkv, D};
    // Gradients are read where attention's backward left them (a
    // transposed layout) when each head's values are contiguous; an
    // output nothing used has none, and gives zeros.
    auto grad = [&](size_t i) {
      if (!grads[i].defined())
        return torch::Tensor();
      auto g = grads[i].to(q.scalar_type());
      return g.stride(3) == 1 ? g : g.contiguous();
    };
    const auto dq = grad(0), dk = grad(1), dv = grad(2);
    auto dqkv = torch::empty({B, T, s.heads() * D}, q.options());
    by_dtype(q, [&](auto zero) {
      using Scalar = decltype(zero);
      Scalar* out = dqkv.data_ptr<Scalar>();
      const Scalar *pc = cos.data_ptr<Scalar>(), *ps = sin.data_ptr<Scalar>();
      const Scalar* pr = rstd.data_ptr<Scalar>();
      // Token n's head h of g (B, T, heads, D), any strides but the last.
      auto at = [&](const torch::Tensor& g, int64_t n, int64_t h) {
        return g.data_ptr<Scalar>() + (n / T) * g.stride(0) +
            (n % T) * g.stride(1) + h * g.stride(2);
      };
      for_rows(s.tokens * s.heads(), D, [&](int64_t first, int64_t last) {
        std::vector<Scalar> dr(D);
        for (int64_t row = first; row < last; ++row) {
          const int64_t n = row / s.heads(), h = row % s.heads();
          Scalar* dx = out + row * D;
          const bool is_q = h < H, is_k = !is_q && h < H + Hkv;
          const torch::Tensor& g = is_q ? dq : is_k ? dk : dv;
          if (!g.defined()) {
            std::fill(dx, dx + D, Scalar(0));
            continue;
          }
          if (!is_q && !is_k) { // v: the product's own columns
            std::copy_n(at(g, n, h - H - Hkv), D, dx);
            continue;
          }
          const Scalar* y = is_q ? q.data_ptr<Scalar>() + (n * H + h) * D
                                 : k.data_ptr<Scalar>() + (n * Hkv + h - H) * D;
          rms_norm_backward_row(
              at(g, n, is_q ? h : h - H),
              y,
              pr[n * (H + Hkv) + h],
              D,
              dr.data());
          // Rotation back: the transpose of (x1, x2) -> (x1 c + x2 s,
          // x2 c - x1 s).
          const Scalar *c = pc + (n % T) * half, *sn = ps + (n % T) * half;
          for (int64_t i = 0; i < half; ++i) {
            dx[i] = dr[i] * c[i] - dr[i + half] * sn[i];
            dx[i + half] = dr[i] * sn[i] + dr[i + half] * c[i];
          }
        }
      });
    });
    return {
        dqkv,
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

struct ResidualAddRmsNorm : torch::autograd::Function<ResidualAddRmsNorm> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& x_in,
      const torch::Tensor& b_in,
      double eps) {
    auto x = x_in.contiguous(), b = b_in.contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    auto s = torch::empty_like(x), y = torch::empty_like(x);
    auto rstd = torch::empty({rows}, x.options());
    by_dtype(x, [&](auto zero) {
      using T = decltype(zero);
      const T *px = x.data_ptr<T>(), *pb = b.data_ptr<T>();
      T *ps = s.data_ptr<T>(), *py = y.data_ptr<T>(), *pr = rstd.data_ptr<T>();
      for_rows(rows, C, [&](int64_t first, int64_t last) {
        for (int64_t row = first; row < last; ++row) {
          const int64_t o = row * C;
          for (int64_t i = 0; i < C; ++i)
            ps[o + i] = px[o + i] + pb[o + i];
          const T r = inverse_rms(ps + o, C, eps);
          for (int64_t i = 0; i < C; ++i)
            py[o + i] = ps[o + i] * r;
          pr[row] = r;
        }
      });
    });
    ctx->save_for_backward({s, rstd});
    return {s, y};
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &s = saved[0], &rstd = saved[1];
    const int64_t C = s.size(-1), rows = s.numel() / C;
    auto ds = grads[0].defined() ? grads[0].to(s.scalar_type()).contiguous()
                                 : torch::Tensor();
    auto dy = grads[1].defined() ? grads[1].to(s.scalar_type()).contiguous()
                                 : torch::Tensor();
    // s = x + b: both inputs get ds plus the norm's gradient.
    if (!dy.defined())
      return {ds, ds, torch::Tensor()};
    auto dx = torch::empty_like(s);
    by_dtype(s, [&](auto zero) {
      using T = decltype(zero);
      const T *pdy = dy.data_ptr<T>(), *ps = s.data_ptr<T>();
      const T* pds = ds.defined() ? ds.data_ptr<T>() : nullptr;
      const T* pr = rstd.data_ptr<T>();
      T* pdx = dx.data_ptr<T>();
      for_rows(rows, C, [&](int64_t first, int64_t last) {
        std::vector<T> y(C);
        for (int64_t row = first; row < last; ++row) {
          const int64_t o = row * C;
          for (int64_t i = 0; i < C; ++i)
            y[i] = ps[o + i] * pr[row];
          rms_norm_backward_row(pdy + o, y.data(), pr[row], C, pdx + o);
          if (pds)
            for (int64_t i = 0; i < C; ++i)
              pdx[o + i] += pds[o + i];
        }
      });
    });
    return {dx, dx, torch::Tensor()};
  }
};

} // namespace

bool takes(std::initializer_list<torch::Tensor> tensors) {
  if (tensors.size() == 0)
    return false;
  const auto t = tensors.begin()->scalar_type();
  if (t != torch::kFloat32 && t != torch::kFloat64)
    return false;
  for (const auto& x : tensors)
    if (!x.defined() || !x.device().is_cpu() || x.scalar_type() != t ||
        x.layout() != torch::kStrided)
      return false;
  return true;
}

torch::Tensor relu_square(const torch::Tensor& u) {
  return ReluSquare::apply(u);
}

std::array<torch::Tensor, 3> rotary_norm_qkv(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    double eps) {
  auto out = RotaryNormQkv::apply(qkv, H, Hkv, cos, sin, eps);
  return {out[0], out[1], out[2]};
}

std::pair<torch::Tensor, torch::Tensor> residual_add_rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& b,
    double eps) {
  auto out = ResidualAddRmsNorm::apply(x, b, eps);
  return {out[0], out[1]};
}

} // namespace orchard::ops::cpu
