// What lets an optimizer keep less than float32 per weight: AdamW's two
// moments in 8 bits a value (optim=adamw_8bit), and weights held in
// bfloat16 updated without losing small steps (weights_dtype=bfloat16).
//
// 8-bit moments: blocks of kBlock values share one float32 scale, their
// largest magnitude; each value is stored as a code on a power-law scale,
//   first moment m (signed):    q = round(127 sign(r) |r|^(1/4)),  r = m / absmax
//   second moment v (>= 0):     q = round(255 (s / absmax)^(1/4)), s = sqrt(v)
// so one byte covers about eight decades under the block's largest value
// (the smallest non-zero step is 1.5e-11 of it for s) instead of the two
// a linear code would: Adam's v spans many orders of magnitude and a v
// rounded to zero under a non-zero m would blow the update up. The idea
// of block-wise 8-bit moments is Dettmers et al., "8-bit Optimizers via
// Block-wise Quantization" (2021), bitsandbytes' adamw_8bit; the code
// scale here is Orchard's own (bitsandbytes uses a "dynamic tree" map), so
// the state is not bitsandbytes'. 2 bytes a parameter plus 8 per 256,
// against 8 for float32 moments.
//
// Stochastic rounding: a float32 value x lies between two neighbouring
// values of the narrow type; it becomes the upper with probability equal
// to its distance from the lower over their gap, so the rounded value's
// expectation is x. An update far below the weight's last bit (a learning
// rate of 1e-6 on a bfloat16 weight) then moves the weight on average
// instead of vanishing every step (Gupta et al., "Deep Learning with
// Limited Numerical Precision", 2015).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace orchard::train {

constexpr int64_t kBlock = 256;

// n rounded up to whole blocks.
inline int64_t whole_blocks(int64_t n) {
  return (n + kBlock - 1) / kBlock * kBlock;
}

// Codes of one moment for a tensor of n values: int8 (m) or uint8 (v),
// padded to whole blocks, and one float32 scale per block.
struct Quantized8 {
  torch::Tensor codes, absmax;
};

// An all-zero state for n values on `options`' device.
Quantized8 zero_quantized(int64_t n, bool is_signed, const torch::TensorOptions& options);

// Values [from, from + len) (from a multiple of kBlock) as float32, padded
// with zeros to whole blocks. `is_signed`: m's code; else v's (returned as
// v, not its root).
torch::Tensor dequantize8(const Quantized8& q, bool is_signed, int64_t from, int64_t len);

// Stores `x` (float32, a multiple of kBlock long, the padding zero) at
// [from, from + x.numel()).
void quantize8(Quantized8& q, bool is_signed, int64_t from, const torch::Tensor& x);

// `x` (float32, contiguous) into `out` (bfloat16, same shape), rounding
// stochastically with `gen`: bfloat16 is float32's upper 16 bits, so a
// uniform 16-bit integer added to the bits before they are cut carries
// into the kept part with exactly that probability.
void stochastic_round_into(
    torch::Tensor out,
    const torch::Tensor& x,
    c10::optional<at::Generator> gen);

} // namespace orchard::train
