// Stable-max cross-entropy, the loss TRM trains with (Prieto et al.,
// "Grokking at the edge of numerical stability", 2025): softmax's exp
// replaced by
//   s(x) = 1 / (1 - x)  for x < 0,     x + 1  otherwise,
// which grows linearly rather than exponentially, so logits cannot push
// the probabilities to floating-point saturation. log p_i =
// log(s(x_i) / sum_j s(x_j)), computed in float64 as upstream TRM does.
// Upstream adds 1e-30 to 1 - x; kept, though it only matters at x = 1.
#pragma once

#include <torch/torch.h>

namespace orchard::ops {

// log(s(x) / sum s(x)) over the last dimension, in float64.
torch::Tensor log_stablemax(const torch::Tensor& logits);

// Per-position loss -log p[label] (float64), 0 where label == ignore_index.
torch::Tensor stablemax_cross_entropy(
    const torch::Tensor& logits,
    const torch::Tensor& labels,
    int64_t ignore_index = -100);

} // namespace orchard::ops
