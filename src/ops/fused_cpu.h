// The training step's fused ops (ops/fused_train.h) on the CPU: one pass
// over memory each way where the plain libtorch composition makes several.
// On a CPU a GPT's step is its products plus memory-bound elementwise work,
// and the plain ops write each intermediate to memory and read it back
// (ReLU² is 2 passes forward and 4 backward, rotary + QK-norm ~16 and ~25).
// These are loops over rows, split across the intra-op threads, with the
// same arithmetic as the plain definitions: those stay the oracle in the
// tests (tests/ops/fused_train_test.cpp) and the path for every other
// device and dtype.
//
// They take float32 or float64 tensors on the CPU, all of one dtype
// (`takes`); ops/fused_train.cpp decides when to call them.
#pragma once

#include <torch/torch.h>

#include <array>
#include <initializer_list>
#include <utility>

namespace orchard::ops::cpu {

// Every tensor defined, on the CPU, float32 or float64, one dtype.
bool takes(std::initializer_list<torch::Tensor> tensors);

// relu(u)^2; keeps u for the backward, du = 2 dy u where u > 0.
torch::Tensor relu_square(const torch::Tensor& u);

// ops::rotary_norm_qkv: qkv (B, T, (H + 2 Hkv) D) -> q (B, T, H, D), k
// (B, T, Hkv, D) rotated by cos, sin (T, D/2) and RMS-normed over D, and v,
// a view of qkv's last Hkv heads.
std::array<torch::Tensor, 3> rotary_norm_qkv(
    const torch::Tensor& qkv,
    int64_t H,
    int64_t Hkv,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    double eps);

// ops::residual_add_rms_norm with the output in x's dtype: {s = x + b,
// y = rms_norm_unscaled(s)} over the last dimension.
std::pair<torch::Tensor, torch::Tensor> residual_add_rms_norm(
    const torch::Tensor& x,
    const torch::Tensor& b,
    double eps);

} // namespace orchard::ops::cpu
