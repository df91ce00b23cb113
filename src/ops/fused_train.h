// Ops of the training step that CUDA kernels (src/ops/cuda/train_fused.cu)
// fuse, forward and backward, each beside its plain libtorch composition:
// the portable path (CPU, MPS, libtorch 1.13, builds without
// -DORCHARD_CUDA=ON, float64) and the oracle of the fused one. The fused
// path runs where the tensors are on a CUDA device in float32, float16 or
// bfloat16 (one dtype) and the kernels are built; gradients are allowed.
#pragma once

#include <torch/torch.h>

namespace orchard::ops {

// SwiGLU's silu(gate) * up where gate and up are the two halves of one
// product `gu` along `dim` (size 2I there; the result has I): one product
// for both, and the halves read in place. Each op rounds to gu's dtype, as
// torch::silu(gate) * up does.
torch::Tensor silu_mul_halves(const torch::Tensor& gu, int64_t dim);
torch::Tensor silu_mul_halves_reference(const torch::Tensor& gu, int64_t dim);
bool silu_mul_halves_is_fused(const torch::Tensor& gu);

// A residual add and an unscaled RMSNorm over `dim`: s = a + b (in their
// dtype), y = s * rsqrt(sum(s^2 over dim) / count + eps) in float32 at
// least, back in s's dtype. `count` is how many entries along dim are
// real (the rest are zero padding, which stays zero); the dimension's size
// where it is 0. a and b have one shape.
torch::Tensor add_rms_norm_unscaled(
    const torch::Tensor& a,
    const torch::Tensor& b,
    int64_t dim,
    double eps,
    int64_t count = 0);
torch::Tensor add_rms_norm_unscaled_reference(
    const torch::Tensor& a,
    const torch::Tensor& b,
    int64_t dim,
    double eps,
    int64_t count = 0);
bool add_rms_norm_unscaled_is_fused(
    const torch::Tensor& a,
    const torch::Tensor& b);

} // namespace orchard::ops
