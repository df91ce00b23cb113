// The summed cross-entropy of h W^T against targets for a frozen W (the
// head of a LoRA run): over chunks of rows, with the gradient for h,
// (softmax - onehot) W, taken in the forward while each chunk's logits
// exist. The (rows, V) logits are never held whole and computed once.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace orchard::ops {

// h (N, C), w (V, C) without gradient, targets (N) with -1 ignored; chunk:
// rows per chunk. Float32 arithmetic (float64 for float64 inputs).
torch::Tensor linear_cross_entropy(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    int64_t chunk);

// Its plain definition, the test oracle: the summed cross-entropy of the
// whole (N, V) logits h W^T, in the same arithmetic dtype.
torch::Tensor linear_cross_entropy_reference(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets);

} // namespace orchard::ops
