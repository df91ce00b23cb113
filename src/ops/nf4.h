// 4-bit NormalFloat (NF4) weights for a frozen base under LoRA (QLoRA:
// Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs",
// https://arxiv.org/abs/2305.14314). Each block of 64 consecutive values
// is scaled by its largest magnitude (absmax) and every scaled value is
// stored as the index (4 bits) of the nearest of the 16 NF4 levels, the
// quantiles of a normal distribution the paper lists; two indices a byte,
// the first in the high nibble. The absmax stays in the compute dtype (the
// paper quantises it again to 8 bits; Orchard does not).
//
// A 3B model's projections take 0.53 bytes a weight instead of 2. The
// weights are expanded again for every product (forward, recomputation and
// the input gradient) and the expanded copy is dropped right after: a step
// costs more time for less memory.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace orchard::ops {

// The 16 NF4 levels, ascending, from -1 to 1 (the QLoRA paper's table).
const std::vector<float>& nf4_levels();

struct Nf4Weight {
  torch::Tensor codes;  // uint8 (numel / 2): two 4-bit indices a byte
  torch::Tensor absmax; // (numel / 64) in the compute dtype
  torch::Tensor pairs;  // (256, 2): the two levels each byte stands for
  int64_t out = 0, in = 0;
  bool defined() const {
    return codes.defined();
  }
  int64_t bytes() const;
};

constexpr int64_t kNf4Block = 64;

// w (out, in), in any float dtype; in * out must be a multiple of 64.
Nf4Weight quantize_nf4(const torch::Tensor& w);
// The (out, in) weight the codes stand for, in absmax's dtype.
torch::Tensor dequantize_nf4(const Nf4Weight& q);
// x (N, in) -> x W^T (N, out) with W expanded for the product and again
// in the backward for the input's gradient; W itself takes no gradient.
//
// For decoding (x at most 8 rows, on CUDA, x's dtype absmax's, no gradient
// wanted) it is one CUDA kernel that reads each code once and never
// expands the matrix (src/ops/cuda/nf4_matvec.cu): a 4-bit base then
// decodes from a quarter of bf16's bytes. The same numbers up to the
// order of the sums.
torch::Tensor nf4_linear(const torch::Tensor& x, const Nf4Weight& q);
// Whether nf4_linear(x, q) would run that kernel.
bool nf4_matvec_is_fused(const torch::Tensor& x, const Nf4Weight& q);

} // namespace orchard::ops
