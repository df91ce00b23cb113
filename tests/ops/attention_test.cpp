// ops/attention: the fused path against its plain definition on every
// device this machine has (the CPU always; CUDA where present), and the
// sliding-window mask against a hand-written one.
#include "ops/attention.h"

#include <gtest/gtest.h>

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

} // namespace
} // namespace orchard::ops
