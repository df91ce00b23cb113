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

// A decoder's residual stream as decoding's products carry it, so that no
// kernel of its own stands between two products for the residual add and
// the norm after it: `sum` is the stream after the add, `squares` the
// float32 partial sums of its squares the product's kernel wrote (their
// sum is the sum of sum's squares), undefined where no kernel ran.
struct ResidualSum {
  torch::Tensor sum, squares;
};

// residual + linear(x, weight, bias), rounded to x's dtype; with squares
// where linear would run the matrix-vector kernel and residual is (N, out)
// of x's dtype, contiguous (matvec.cu's matvec_residual).
ResidualSum linear_add(
    const torch::Tensor& x,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    const torch::Tensor& residual);

// linear(rms_norm(s.sum, norm_weight, eps), weight, bias), or with
// silu_mul_halves linear_silu_mul of it: one kernel where s.squares is
// defined and the product is a matrix-vector one (the norm's sum of
// squares from s.squares, so only the order of that sum differs from
// ops::rms_norm); else those ops.
torch::Tensor normed_linear(
    const ResidualSum& s,
    const torch::Tensor& norm_weight,
    double eps,
    const torch::Tensor& weight,
    const torch::Tensor& bias = {},
    bool silu_mul_halves = false);

} // namespace orchard::ops
