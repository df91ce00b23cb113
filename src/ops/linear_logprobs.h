// Per-token log-probabilities of a linear head, log softmax(h W^T / t)
// at each row's target, over chunks of rows: the (rows, V) logits are never
// held whole, in the forward or the backward (which computes each chunk's
// logits again). GRPO's policy and reference passes take one log-probability
// per completion token; at a 150K vocabulary the whole float32 logits of a
// 128-token completion are ~78 MB, their softmax and gradient as much again.
//
// With g the incoming gradient of row i's log-probability and p_i the
// softmax of its logits / t:
//   dh_i = g_i (onehot(target_i) - p_i) W / t
//   dW   = sum_i g_i (onehot(target_i) - p_i)^T h_i / t  (when W is trained)
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace orchard::ops {

// h (N, C), w (V, C), targets (N) in [0, V); temperature > 0; chunk: rows per
// chunk. Returns (N) in float32 (float64 for float64 inputs). Gradients flow
// to h and, when it requires them, to w.
torch::Tensor linear_logprobs(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    double temperature,
    int64_t chunk);

// Its plain definition, the test oracle: the whole (N, V) logits in the same
// arithmetic dtype, divided by the temperature, log-softmaxed, gathered.
torch::Tensor linear_logprobs_reference(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    double temperature);

} // namespace orchard::ops
