// Ops of the training step that CUDA kernels (src/ops/cuda/train_fused.cu,
// gpt_train.cu) fuse, forward and backward, each beside its plain libtorch
// composition: the portable path (CPU, MPS, libtorch 1.13, builds without
// -DORCHARD_CUDA=ON, float64) and the oracle of the fused one. The fused
// path runs where the tensors are on a CUDA device in float32, float16 or
// bfloat16 (one dtype) and the kernels are built; gradients are allowed.
#pragma once

#include <torch/torch.h>

#include <array>
#include <optional>
#include <utility>

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

// The GPT MLP's activation, relu(u) squared: r = relu(u), y = r * r, each
// rounded to u's dtype as those two ops round. The fused kernel keeps u
// for its backward (du = 2 T(dy * u) where u > 0) and writes one tensor
// forward and one backward, where the plain ops write two and four.
torch::Tensor relu_square(const torch::Tensor& u);
torch::Tensor relu_square_reference(const torch::Tensor& u);
bool relu_square_is_fused(const torch::Tensor& u);

// Rotates pairs (x[..., :D/2], x[..., D/2:]) by the position angles:
// (x1 c + x2 s, x2 c - x1 s), in x's dtype. x: (B, T, H, D); cos, sin:
// (T, D/2).
torch::Tensor apply_rotary(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin);

// Attention's inputs from one stacked product qkv (B, T, (H + 2 Hkv) D),
// q's heads first, then k's, then v's: q and k rotated (apply_rotary with
// cos, sin of shape (T, D/2)) and RMS-normed over D without a weight
// (rms_norm_unscaled(., eps)), v as it is; each (B, T, heads, D). The
// fused path is one kernel forward and one backward, which writes the
// stacked product's gradient itself (the plain ops are ~16 kernels
// forward and ~25 backward, and keep the product and the rotated q and k
// for their backward: the kernel keeps only its outputs, which attention
// keeps anyway). It needs D of 64, 128, 192 or 256 and the tables in
// qkv's dtype.
std::array<torch::Tensor, 3> rotary_norm_qkv(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    double eps);
std::array<torch::Tensor, 3> rotary_norm_qkv_reference(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    double eps);
bool rotary_norm_qkv_is_fused(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin);

// A pre-norm block's residual add and the norm of the next product's
// input: s = x + b (in their promoted dtype) and y = rms_norm_unscaled(s,
// eps) in `out` (x's dtype where out is undefined), returned as {s, y}.
// Under autocast x is the float32 residual stream, b a block's bfloat16
// output, and out bfloat16: y is then what the next product's cast would
// make. The fused path (rows of a multiple of 128 values) is one kernel
// each way, where the plain ops are an add, the norm and a cast forward,
// and a cast, the norm's gradient, an add and a cast backward.
std::pair<torch::Tensor, torch::Tensor> residual_add_rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& b,
    double eps,
    std::optional<torch::ScalarType> out = std::nullopt);
std::pair<torch::Tensor, torch::Tensor> residual_add_rms_norm_reference(
    const torch::Tensor& x,
    const torch::Tensor& b,
    double eps,
    std::optional<torch::ScalarType> out = std::nullopt);
bool residual_add_rms_norm_is_fused(
    const torch::Tensor& x,
    const torch::Tensor& b,
    torch::ScalarType out);

} // namespace orchard::ops
