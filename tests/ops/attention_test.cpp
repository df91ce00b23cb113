// ops/attention: the fused path against its plain definition on every
// device this machine has (the CPU always; CUDA where present), and the
// sliding-window mask against a hand-written one.
#include "ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>

namespace orchard::ops {
namespace {

TEST(Attention, FusedMatchesExplicitOnEveryDevice) {
  torch::manual_seed(2);
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available())
    devices.push_back(torch::Device(torch::kCUDA, 0));
  for (auto dev : devices) {
    for (int64_t tq : {7, 1}) {
      auto q = torch::randn({2, 3, tq, 16}, torch::kFloat64);
      auto k = torch::randn({2, 3, 7, 16}, torch::kFloat64);
      auto v = torch::randn({2, 3, 7, 16}, torch::kFloat64);
      auto want = ops::explicit_attention(q, k, v);
      auto got = ops::causal_attention(
                     q.to(dev, torch::kFloat32),
                     k.to(dev, torch::kFloat32),
                     v.to(dev, torch::kFloat32))
                     .to(torch::kCPU, torch::kFloat64);
      EXPECT_TRUE(torch::allclose(got, want, 1e-3, 1e-4))
          << dev << " tq=" << tq << " max diff "
          << (got - want).abs().max().item<double>();
    }
  }
  // Hand-worked: with one key position, the output is that value.
  auto q = torch::randn({1, 1, 1, 4}), k = torch::randn({1, 1, 1, 4});
  auto v = torch::tensor({1.f, 2.f, 3.f, 4.f}).view({1, 1, 1, 4});
  EXPECT_TRUE(torch::allclose(ops::causal_attention(q, k, v), v));
}

// Mistral's window: query i sees keys i-W+1 .. i, written out by hand for
// Tq = Tk = 5 and W = 2; and the fused path with that mask equals the
// explicit one.
TEST(Attention, SlidingWindowHidesWhatTransformersHides) {
  auto hidden = hidden_keys(5, 5, 2, torch::kCPU);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 5; ++j)
      EXPECT_EQ(hidden[i][j].item<bool>(), !(j <= i && j > i - 2))
          << i << "," << j;
  torch::manual_seed(4);
  auto q = torch::randn({1, 2, 5, 8}), k = torch::randn({1, 2, 5, 8}),
       v = torch::randn({1, 2, 5, 8});
  EXPECT_TRUE(torch::allclose(
      causal_attention(q, k, v, 2),
      explicit_attention(q, k, v, 2),
      1e-4,
      1e-5));
}

// Decoding attention (one query per row over a fixed cache, grouped
// heads, a key_len bound and a window) equals explicit_attention on each
// row's own filled keys, the kv heads repeated.
TEST(Attention, DecodeReadsEachRowsKeysOnly) {
  torch::manual_seed(6);
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available())
    devices.push_back(torch::Device(torch::kCUDA, 0));
  const int64_t B = 3, H = 4, Hkv = 2, D = 8, Tmax = 20;
  auto ck = torch::randn({B, Hkv, Tmax, D}, torch::kFloat64);
  auto cv = torch::randn({B, Hkv, Tmax, D}, torch::kFloat64);
  auto q = torch::randn({B, H, 1, D}, torch::kFloat64);
  std::vector<int64_t> pos = {0, 5, 11};
  for (auto dev : devices)
    for (int64_t window : {0, 3})
      for (int64_t key_len : {0, 12}) {
        auto got = decode_attention(
                       q.to(dev),
                       ck.to(dev),
                       cv.to(dev),
                       torch::tensor(pos, torch::kInt64).to(dev),
                       key_len,
                       window)
                       .to(torch::kCPU);
        for (int64_t b = 0; b < B; ++b) {
          const int64_t T = pos[size_t(b)] + 1;
          auto k = ck[b].narrow(1, 0, T).repeat_interleave(H / Hkv, 0);
          auto v = cv[b].narrow(1, 0, T).repeat_interleave(H / Hkv, 0);
          auto want = explicit_attention(
              q[b].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), window);
          EXPECT_LT(
              (got[b] - want.reshape({H * D})).abs().max().item<double>(),
              1e-12)
              << dev << " row " << b << " window " << window << " key_len "
              << key_len;
        }
      }
  // Positions past key_len are never read: NaN values there change
  // nothing (and would, read with weight 0: 0 * NaN is NaN).
  auto dirty = cv.clone();
  dirty.narrow(2, 12, Tmax - 12).fill_(std::nan(""));
  auto p = torch::tensor(pos, torch::kInt64);
  EXPECT_TRUE(torch::equal(
      decode_attention(q, ck, dirty, p, 12), decode_attention(q, ck, cv, p, 12)));
  EXPECT_TRUE(decode_attention(q, ck, dirty, p, 0).isnan().any().item<bool>());
}

} // namespace
} // namespace orchard::ops
