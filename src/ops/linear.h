// A projection of 2-D rows, x (N, in) W^T + bias, W (out, in) as stored by
// torch::nn::Linear and Hugging Face checkpoints.
//
// at::mm / at::addmm (cuBLAS on CUDA) is the definition. For decoding
// (one row on a CUDA device, one dtype, nothing needing a gradient,
// contiguous 16-byte-aligned x and W) it is one matrix-vector kernel
// instead (src/ops/cuda/matvec.cu), which streams W closer to the memory
// bus than cuBLAS does on one row: the same numbers up to the order of the
// float32 sums.
#pragma once

#include <torch/torch.h>

namespace orchard::ops {

torch::Tensor linear(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias = {});

// Whether linear(x, weight, bias) would run the matrix-vector kernel.
bool linear_is_matvec(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias = {});

// x W^T for training under CUDA autocast (16-bit) with a float32 weight
// that takes a gradient and no bias: the product in autocast's dtype, as
// F::linear computes it there, but the weight's gradient written float32
// by the product itself (libtorch 2.10+), not made 16-bit and then cast
// (a d12 GPT step's 48 casts), and not rounded to 16 bits on the way.
// Elsewhere F::linear(x, weight).
torch::Tensor autocast_linear(
    const torch::Tensor& x,
    const torch::Tensor& weight);

// Whether autocast_linear(x, weight) takes the float32-gradient product.
bool autocast_linear_is_fused(
    const torch::Tensor& x,
    const torch::Tensor& weight);

// SwiGLU: silu(g) * u where g and u are the two halves of
// linear(x, weight, bias) (weight stacks the gate's rows over the up's, as
// prepare_inference() stacks gate_proj and up_proj), each op rounding to
// x's dtype. Where linear would run the matrix-vector kernel this is one
// kernel that never writes g and u (matvec.cu); elsewhere linear, then
// ops::silu_mul.
torch::Tensor linear_silu_mul(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias = {});

} // namespace orchard::ops
