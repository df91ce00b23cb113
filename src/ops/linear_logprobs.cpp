#include "ops/linear_logprobs.h"

#include "core/dtype.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace orchard::ops {
namespace {

// One chunk's logits / t in the arithmetic dtype.
torch::Tensor scaled_logits(
    const torch::Tensor& h,
    const torch::Tensor& w,
    double temperature) {
  // Under autocast the product runs in its dtype; otherwise h (small) takes
  // the head's.
  auto z =
      at::mm(
          h.scalar_type() == w.scalar_type() ? h : h.to(w.scalar_type()), w.t())
          .to(loss_arithmetic(h.scalar_type()));
  return temperature == 1.0 ? z : z.div_(temperature);
}

struct LinearLogprobs : torch::autograd::Function<LinearLogprobs> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& h,
      const torch::Tensor& w,
      const torch::Tensor& targets,
      double temperature,
      int64_t chunk) {
    const int64_t rows = h.size(0);
    auto out = torch::empty(
        {rows}, h.options().dtype(loss_arithmetic(h.scalar_type())));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      auto z = scaled_logits(h.narrow(0, r0, n), w, temperature);
      auto t = targets.narrow(0, r0, n).unsqueeze(1);
      out.narrow(0, r0, n)
          .copy_((z.gather(1, t) - z.logsumexp(-1, /*keepdim=*/true)).squeeze(1));
    }
    ctx->save_for_backward({h, w, targets});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    return out;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w = saved[1], &targets = saved[2];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    auto g = grads[0].to(loss_arithmetic(h.scalar_type())) / temperature; // (N)
    torch::Tensor dh = need_h ? torch::empty_like(h) : torch::Tensor();
    // In the head's dtype: a float32 (V, C) would be a second head.
    torch::Tensor dw = need_w ? torch::zeros_like(w) : torch::Tensor();
    torch::NoGradGuard no_grad;
    for (int64_t r0 = 0; r0 < h.size(0); r0 += chunk) {
      const int64_t n = std::min(chunk, h.size(0) - r0);
      auto hc = h.narrow(0, r0, n);
      auto z = scaled_logits(hc, w, temperature);
      // -(softmax - onehot) * g, in the logits' memory.
      auto gc = g.narrow(0, r0, n).unsqueeze(1);
      auto d = z.softmax(-1).mul_(gc.neg());
      d.scatter_add_(1, targets.narrow(0, r0, n).unsqueeze(1), gc);
      if (need_h) {
        auto o = dh.narrow(0, r0, n);
        o.copy_(at::mm(d.to(w.scalar_type()), w));
      }
      if (need_w)
        dw.add_(at::mm(d.t().to(w.scalar_type()), hc.to(w.scalar_type())));
    }
    return {
        dh,
        dw,
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

} // namespace

torch::Tensor linear_logprobs(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    double temperature,
    int64_t chunk) {
  TORCH_CHECK(temperature > 0, "linear_logprobs: temperature must be > 0");
  return LinearLogprobs::apply(h, w, targets, temperature, std::max<int64_t>(1, chunk));
}

torch::Tensor linear_logprobs_reference(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    double temperature) {
  const auto acc = loss_arithmetic(h.scalar_type());
  auto z = torch::matmul(h.to(acc), w.to(acc).t()) / temperature;
  return z.log_softmax(-1).gather(1, targets.unsqueeze(1)).squeeze(1);
}

} // namespace orchard::ops
