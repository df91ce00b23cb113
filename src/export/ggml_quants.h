// GGML's tensor encodings, as a GGUF file stores them: plain floats and the
// block-quantised types llama.cpp reads (ggml-common.h's block_* structs).
// A block covers values along a row (GGUF's first dimension), so a row
// length must be a multiple of the block's.
//
//   Q8_0  32 values: f16 d, int8 q[32]                 x = d*q
//   Q4_0  32 values: f16 d, 4-bit q[32] packed         x = d*(q-8)
//   Q5_0  32 values: f16 d, 32 fifth bits, 4-bit low   x = d*(q-16)
//   Q4_K  256 values = 8 sub-blocks of 32: f16 d, f16 dmin, 12 bytes of
//         6-bit scales and mins, 4-bit q                x = d*sc*q - dmin*m
//   Q6_K  256 values = 16 sub-blocks of 16: 4+2-bit q, int8 scales, f16 d
//                                                       x = d*sc*(q-32)
//
// The byte layouts are llama.cpp's; how the scales are chosen is Orchard's
// own (a weighted least-squares fit over a few candidate scales, the idea
// of llama.cpp's make_qkx2_quants), so files differ from llama-quantize's
// in their values, not in their format.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace orchard::gguf {

// ggml_type's numbers.
enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q5_0 = 6,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30,
};

struct TypeTraits {
  const char* name;    // "q4_K", as llama.cpp prints it
  int64_t block;       // values a block
  int64_t block_bytes; // bytes a block
};
TypeTraits traits(TensorType t);

// The bytes `values` take in type `t`; `row` is the row length (GGUF's
// ne[0]), which must be a multiple of the block (UserError otherwise).
int64_t encoded_bytes(TensorType t, int64_t values, int64_t row);

// `x`: any float tensor whose last dimension is the row. Returns the bytes
// of every row in order.
std::string encode(const torch::Tensor& x, TensorType t);

// The inverse, to float32 of `shape` (tests and the quality report).
torch::Tensor decode(
    const std::string& bytes,
    TensorType t,
    const std::vector<int64_t>& shape);

} // namespace orchard::gguf
