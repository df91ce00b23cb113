#include "ops/stablemax.h"

namespace orchard::ops {

namespace {
constexpr double kUpstreamEpsilon = 1e-30;
}

torch::Tensor log_stablemax(const torch::Tensor& logits) {
  const auto x = logits.to(torch::kFloat64);
  const auto s =
      torch::where(x < 0, 1.0 / (1.0 - x + kUpstreamEpsilon), x + 1.0);
  return torch::log(s / s.sum(-1, true));
}

torch::Tensor stablemax_cross_entropy(
    const torch::Tensor& logits,
    const torch::Tensor& labels,
    int64_t ignore_index) {
  const auto valid = labels != ignore_index;
  const auto safe = torch::where(valid, labels, torch::zeros_like(labels));
  const auto lp =
      log_stablemax(logits).gather(-1, safe.unsqueeze(-1)).squeeze(-1);
  return torch::where(valid, -lp, torch::zeros_like(lp));
}

} // namespace orchard::ops
