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

} // namespace orchard::ops
