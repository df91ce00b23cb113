// SwiGLU's product silu(gate) * up, as the Llama family's MLP computes it
// (each op rounding to the inputs' dtype). silu_mul_reference is the two
// plain ops, the portable path and the oracle; silu_mul is one CUDA kernel
// where the tensors allow it (ops/kernel_call.h) and g, u are (B, n) with
// contiguous rows (views of one fused gate/up product are fine).
#pragma once

#include <torch/torch.h>

namespace orchard::ops {

torch::Tensor silu_mul_reference(const torch::Tensor& g, const torch::Tensor& u);
torch::Tensor silu_mul(const torch::Tensor& g, const torch::Tensor& u);
bool silu_mul_is_fused(const torch::Tensor& g, const torch::Tensor& u);

} // namespace orchard::ops
