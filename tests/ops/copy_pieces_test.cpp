// ops::prepare_copies (ops/copy_pieces.h), ZeRO-1's copies between the
// weights and the buckets: every piece's values cast as Tensor::copy_
// casts them, the same bits, pieces starting anywhere and longer than the
// kernel's chunk; bad pairs refused.
#include "ops/copy_pieces.h"
#include "ops/op_test_util.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace orchard {
namespace {

using Pairs = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

// Pieces of `from` (dtype a) copied into pieces of `to` (dtype b) at other
// offsets, as the averager's bucket and weights hold them; returns `to`
// after prepare_copies ran twice (the second run must change nothing) and
// the same copies done one by one.
std::pair<torch::Tensor, torch::Tensor> both_ways(
    torch::Device device,
    torch::ScalarType a,
    torch::ScalarType b) {
  const std::vector<std::pair<int64_t, int64_t>> pieces = {
      {0, 5}, {7, 8192}, {8203, 3}, {8210, 20000}, {28213, 1}};
  const auto from = torch::randn({30000}).to(device, a);
  auto to =
      torch::full({30100}, 7.0, torch::TensorOptions().device(device)).to(b);
  auto expected = to.clone();
  Pairs pairs, plain;
  int64_t at = 3; // the destinations start elsewhere than the sources
  for (const auto& [begin, length] : pieces) {
    pairs.push_back({from.narrow(0, begin, length), to.narrow(0, at, length)});
    plain.push_back(
        {from.narrow(0, begin, length), expected.narrow(0, at, length)});
    at += length + 11;
  }
  const auto run = ops::prepare_copies(pairs);
  run();
  run();
  for (auto& [f, t] : plain)
    t.copy_(f);
  return {to.cpu(), expected.cpu()};
}

TEST(CopyPieces, EveryPieceCastAsCopyCastsIt) {
  torch::manual_seed(3);
  const std::vector<std::pair<torch::ScalarType, torch::ScalarType>> kinds = {
      {torch::kFloat32, torch::kBFloat16},
      {torch::kBFloat16, torch::kFloat32},
      {torch::kFloat32, torch::kFloat32},
      {torch::kFloat32, torch::kFloat16},
      {torch::kFloat16, torch::kFloat32}};
  for (const auto& [a, b] : kinds) {
    const auto [got, want] = both_ways(torch::kCPU, a, b);
    EXPECT_TRUE(torch::equal(got, want)) << "CPU " << a << " -> " << b;
  }
  EXPECT_THROW(
      ops::prepare_copies({{torch::zeros({4}), torch::zeros({5})}}),
      c10::Error);
  EXPECT_THROW(
      ops::prepare_copies(
          {{torch::zeros({4, 4}).t(), torch::zeros({4, 4})}}), // not contiguous
      c10::Error);
  ops::prepare_copies({})(); // nothing to copy
  REQUIRE_KERNELS(cuda);
  for (const auto& [a, b] : kinds) {
    const auto [got, want] = both_ways(cuda, a, b);
    EXPECT_TRUE(torch::equal(got, want)) << "CUDA " << a << " -> " << b;
  }
  // Mixed dtypes in one call: copied one by one, still right.
  auto x = torch::randn({10}, torch::TensorOptions().device(cuda));
  auto y = torch::zeros({10}, torch::TensorOptions().device(cuda));
  auto z = torch::zeros(
      {10}, torch::TensorOptions().device(cuda).dtype(torch::kBFloat16));
  ops::prepare_copies({{x, y}, {x, z}})();
  EXPECT_TRUE(torch::equal(y, x));
  EXPECT_TRUE(torch::equal(z, x.to(torch::kBFloat16)));
}

} // namespace
} // namespace orchard
