// GGML block encodings (export/ggml_quants.h): sizes from ggml-common.h's
// static_asserts, a block worked by hand, and round-trip error bounds that
// follow from each format's step. llama.cpp itself judges whole files in
// tests/e2e/export_test.cpp.
#include "export/ggml_quants.h"

#include <gtest/gtest.h>

#include <cstring>

namespace orchard::gguf {
namespace {

TEST(GgmlQuants, BlockSizesAreGgmls) {
  // sizeof(block_q8_0) == 34, block_q4_0 18, block_q5_0 22, block_q4_K 144,
  // block_q6_K 210 (QK_K = 256).
  EXPECT_EQ(traits(TensorType::Q8_0).block_bytes, 34);
  EXPECT_EQ(traits(TensorType::Q4_0).block_bytes, 18);
  EXPECT_EQ(traits(TensorType::Q5_0).block_bytes, 22);
  EXPECT_EQ(traits(TensorType::Q4_K).block_bytes, 144);
  EXPECT_EQ(traits(TensorType::Q6_K).block_bytes, 210);
  EXPECT_EQ(traits(TensorType::Q4_K).block, 256);
  EXPECT_EQ(encoded_bytes(TensorType::Q4_0, 64 * 3, 64), 6 * 18);
}

TEST(GgmlQuants, Q4_0BlockWorkedByHand) {
  // x = (-8, -7, ..., 7, -8, ..., 7) / 4: the value of largest magnitude is
  // -2, so d = -2 / -8 = 0.25 (f16 0x3400) and level = x / d + 8 exactly:
  // 0..15 twice. Byte j packs level j (low nibble) and level j+16 (high).
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i)
    x[i] = static_cast<float>(i % 16 - 8) / 4.0f;
  const std::string b = encode(torch::tensor(x), TensorType::Q4_0);
  ASSERT_EQ(b.size(), 18u);
  uint16_t d;
  std::memcpy(&d, b.data(), 2);
  EXPECT_EQ(d, 0x3400);
  for (int j = 0; j < 16; ++j)
    EXPECT_EQ(static_cast<uint8_t>(b[2 + j]), j | (j << 4)) << j;
  EXPECT_TRUE(
      torch::equal(decode(b, TensorType::Q4_0, {32}), torch::tensor(x)));
}

TEST(GgmlQuants, Q8_0BlockWorkedByHand) {
  // amax 127 / 64 gives d = 1/64 (f16 0x2400) and q = 64 x.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i)
    x[i] = static_cast<float>(i * 8 - 127) / 64.0f;
  x[31] = 127.0f / 64.0f;
  const std::string b = encode(torch::tensor(x), TensorType::Q8_0);
  uint16_t d;
  std::memcpy(&d, b.data(), 2);
  EXPECT_EQ(d, 0x2400);
  EXPECT_EQ(static_cast<int8_t>(b[2]), -127);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 31]), 127);
  EXPECT_TRUE(
      torch::equal(decode(b, TensorType::Q8_0, {32}), torch::tensor(x)));
}

// Relative RMS error of a round trip on Gaussian rows, with the bound each
// format's bits allow (measured: q8_0 0.004, q5_0 0.04, q4_0 0.09, q4_K
// 0.07, q6_K 0.018; the bounds leave room).
TEST(GgmlQuants, RoundTripErrorFitsEachFormat) {
  torch::manual_seed(0);
  const auto x = torch::randn({64, 512});
  struct Case {
    TensorType t;
    double bound;
  };
  for (const Case& c :
       {Case{TensorType::Q8_0, 0.01},
        Case{TensorType::Q5_0, 0.06},
        Case{TensorType::Q4_0, 0.12},
        Case{TensorType::Q4_K, 0.10},
        Case{TensorType::Q6_K, 0.03},
        Case{TensorType::F16, 1e-3},
        Case{TensorType::BF16, 5e-3}}) {
    const auto y = decode(encode(x, c.t), c.t, {64, 512});
    const double rel =
        ((y - x).pow(2).mean() / x.pow(2).mean()).sqrt().item<double>();
    EXPECT_LT(rel, c.bound) << traits(c.t).name;
    EXPECT_GT(rel, 0.0) << traits(c.t).name << " cannot be exact on noise";
  }
}

// Q4_K's sub-blocks carry their own scale and minimum: a row whose eight
// sub-blocks sit at very different offsets and spreads is reproduced
// sub-block by sub-block (the 6-bit scale packing of sub-blocks 4-7 is the
// part most easily got wrong).
TEST(GgmlQuants, Q4_KKeepsEachSubBlocksScaleAndMin) {
  torch::manual_seed(1);
  auto x = torch::rand({256});
  for (int j = 0; j < 8; ++j)
    x.slice(0, j * 32, (j + 1) * 32).mul_(0.5 + j).add_(j % 2 ? -3.0 : 0.2 * j);
  const auto y = decode(encode(x, TensorType::Q4_K), TensorType::Q4_K, {256});
  for (int j = 0; j < 8; ++j) {
    const auto xs = x.slice(0, j * 32, (j + 1) * 32);
    const auto ys = y.slice(0, j * 32, (j + 1) * 32);
    const double spread = (xs.max() - xs.min()).item<double>();
    EXPECT_LT((ys - xs).abs().max().item<double>(), spread / 15 + 0.1 * spread)
        << "sub-block " << j;
  }
}

TEST(GgmlQuants, RowsThatDoNotFillABlockAreRefused) {
  EXPECT_THROW(encode(torch::zeros({2, 80}), TensorType::Q4_K), std::exception);
  EXPECT_THROW(encode(torch::zeros({2, 48}), TensorType::Q8_0), std::exception);
}

} // namespace
} // namespace orchard::gguf
