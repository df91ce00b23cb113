// RMSNorm as Hugging Face's Llama family computes it (LlamaRMSNorm, also
// Qwen2's and Mistral's): over the last dimension, in float32 whatever x's
// dtype (float64 too, as transformers does),
//   n = (x * rsqrt(mean(x^2) + eps)).to(x.dtype),   y = weight * n
// so the weight multiplies the normalised value rounded to x's dtype.
//
// rms_norm_reference is that definition in plain libtorch ops: the
// portable path (CPU, MPS, libtorch 1.13, training) and the oracle of the
// fused path. rms_norm takes one CUDA kernel instead (src/ops/cuda, built
// with -DORCHARD_CUDA=ON) when nothing needs its gradient (decoding,
// generation: the kernel has no backward), x and weight share a dtype of
// float32, float16 or bfloat16, and x is on a CUDA device; else the
// reference.
#pragma once

#include <torch/torch.h>

#include <utility>

namespace orchard::ops {

torch::Tensor rms_norm_reference(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    double eps);

torch::Tensor rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    double eps);

// x * rsqrt(mean(x^2) + eps) over the last dimension, without a weight
// (the tiny recursive model's norm), in float32 at least (float64 stays),
// back in x's dtype. With gradients: libtorch 2.9's fused CUDA RMSNorm
// where the rows allow it (compat::fused_rms_norm), else the plain ops.
torch::Tensor rms_norm_unscaled(const torch::Tensor& x, double eps);

// Whether rms_norm(x, weight, eps) would run the fused kernel.
bool rms_norm_is_fused(const torch::Tensor& x, const torch::Tensor& weight);

// A decoder layer's residual add and the norm after it: s = x + residual
// (in x's dtype), returned with rms_norm(s, weight, eps). One kernel where
// rms_norm would be one and residual matches x; else the two ops.
std::pair<torch::Tensor, torch::Tensor> add_rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    double eps);

} // namespace orchard::ops
