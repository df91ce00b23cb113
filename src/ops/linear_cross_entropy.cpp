#include "ops/linear_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace orchard::ops {
namespace {

// The forward keeps dL/dh (same shape as h); the backward only scales it by
// the incoming gradient.
struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& h,
      const torch::Tensor& w,
      const torch::Tensor& targets,
      int64_t chunk) {
    const int64_t rows = h.size(0);
    const bool need = h.requires_grad();
    torch::Tensor dh = need ? torch::empty_like(h) : torch::Tensor();
    // float32 arithmetic (float64 for a float64 model, as forward() keeps)
    const auto acc =
        h.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    auto total = torch::zeros({}, h.options().dtype(acc));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      auto t = targets.narrow(0, r0, n);
      auto logits = at::mm(h.narrow(0, r0, n), w.t()).to(acc);
      auto lse = logits.logsumexp(-1, /*keepdim=*/true); // (n, 1)
      auto valid = t.ne(-1).unsqueeze(1);
      auto tc = t.clamp_min(0).unsqueeze(1);
      total.add_(((lse - logits.gather(1, tc)) * valid).sum());
      if (need) {
        auto p = logits.sub_(lse).exp_(); // softmax, in the logits' memory
        p.scatter_add_(1, tc, torch::full_like(lse, -1));
        p.mul_(valid);
        auto out = dh.narrow(0, r0, n);
        at::mm_out(out, p.to(h.scalar_type()), w);
      }
    }
    ctx->save_for_backward({dh});
    return total;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto dh = ctx->get_saved_variables()[0];
    return {
        dh * grads[0].to(dh.scalar_type()),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

} // namespace

torch::Tensor linear_cross_entropy(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    int64_t chunk) {
  return LinearCrossEntropy::apply(h, w, targets, chunk);
}

torch::Tensor linear_cross_entropy_reference(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets) {
  const auto compute =
      h.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto logits = torch::matmul(h.to(compute), w.to(compute).t()); // (N, V)
  return torch::nn::functional::cross_entropy(
      logits,
      targets,
      torch::nn::functional::CrossEntropyFuncOptions()
          .ignore_index(-1)
          .reduction(torch::kSum));
}

} // namespace orchard::ops
