// ops/linear_cross_entropy: the chunked frozen-head loss against its plain
// definition (the whole logits' cross-entropy), values and the gradient for
// h, over chunk sizes that do and do not divide the rows, with ignored
// targets, in float64 and float32.
#include "ops/linear_cross_entropy.h"

#include <gtest/gtest.h>

namespace orchard::ops {
namespace {

TEST(LinearCrossEntropy, EqualsTheWholeLogitsCrossEntropy) {
  torch::manual_seed(11);
  const int64_t N = 13, C = 8, V = 37;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
    auto w = torch::randn({V, C}, dtype);
    auto targets = torch::randint(0, V, {N}, torch::kLong);
    targets[2] = -1; // ignored positions
    targets[9] = -1;
    auto h0 = torch::randn({N, C}, dtype);
    auto href = h0.clone().requires_grad_(true);
    auto want = linear_cross_entropy_reference(href, w, targets);
    want.backward(torch::full({}, 0.5, dtype));
    for (int64_t chunk : {1, 4, 5, 13, 64}) {
      auto h = h0.clone().requires_grad_(true);
      auto got = linear_cross_entropy(h, w, targets, chunk);
      EXPECT_NEAR(got.item<double>(), want.item<double>(), tol * N)
          << "chunk " << chunk << " " << dtype;
      got.backward(torch::full({}, 0.5, dtype));
      EXPECT_TRUE(torch::allclose(h.grad(), href.grad(), tol, tol))
          << "chunk " << chunk << " " << dtype << " max diff "
          << (h.grad() - href.grad()).abs().max().item<double>();
      // Ignored rows get no gradient.
      EXPECT_EQ(h.grad()[2].abs().max().item<double>(), 0.0);
    }
  }
}

} // namespace
} // namespace orchard::ops
