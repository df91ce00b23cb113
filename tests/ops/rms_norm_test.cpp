// RMSNorm (ops/rms_norm.h): the plain definition against a float64 hand
// computation, and the fused CUDA kernel against the plain definition on
// every dtype it takes (skipped where it is not built or there is no GPU).
#include "ops/rms_norm.h"
#include "ops/op_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace orchard {
namespace {

using test::relative_error;

TEST(RmsNorm, ThePlainDefinitionIsTheFormula) {
  torch::manual_seed(1);
  const auto x = torch::randn({3, 7}, torch::kFloat64) * 3;
  const auto w = torch::randn({7}, torch::kFloat64);
  const double eps = 1e-5;
  // By hand, in float64: each row over its root mean square.
  auto want = torch::empty_like(x);
  for (int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < 7; ++i)
      ss += std::pow(x[r][i].item<double>(), 2);
    const double scale = 1.0 / std::sqrt(ss / 7 + eps);
    for (int64_t i = 0; i < 7; ++i)
      want[r][i] = w[i].item<double>() * x[r][i].item<double>() * scale;
  }
  // Computed in float32, as transformers does (float64 inputs too).
  EXPECT_LT(relative_error(ops::rms_norm_reference(x, w, eps), want), 1e-6);
  EXPECT_LT(relative_error(ops::rms_norm(x, w, eps), want), 1e-6);
  // bfloat16: the weight multiplies the normalised value rounded to
  // bfloat16, then the product is rounded.
  const auto xb = x.to(torch::kBFloat16), wb = w.to(torch::kBFloat16);
  auto n = (xb.to(torch::kFloat32) *
            torch::rsqrt(xb.to(torch::kFloat32).pow(2).mean(-1, true) + eps))
               .to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(ops::rms_norm_reference(xb, wb, eps), wb * n));
}

TEST(RmsNorm, TheFusedKernelEqualsThePlainDefinition) {
  torch::NoGradGuard no_grad;
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const auto probe = torch::ones({4}, torch::Device(torch::kCUDA, 0));
  if (!ops::rms_norm_is_fused(probe, probe))
    GTEST_SKIP() << "SKIPPED: built without the CUDA kernels (ORCHARD_CUDA)";
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(2);
  // Decoding rows (one token), a prefill block, odd and tiny widths.
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 3072}, {8, 1, 896}, {3, 17, 2048}, {5, 33}, {2, 1}, {4, 8192}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (const auto& shape : shapes) {
      // Fresh values each time, not zeros; an offset so rows differ in
      // scale.
      const auto x = (torch::randn(shape, cuda) * 2 + 0.3).to(dtype);
      const auto w = (torch::randn({shape.back()}, cuda) + 1).to(dtype);
      const auto want = ops::rms_norm_reference(x, w, 1e-6);
      const auto got = ops::rms_norm(x, w, 1e-6);
      ASSERT_EQ(got.scalar_type(), dtype);
      ASSERT_EQ(got.sizes(), x.sizes());
      ASSERT_TRUE(torch::isfinite(got).all().item<bool>());
      // float32 differs only in the order of the sum; half types may round
      // the other way where the sum's order moved a value across a tie.
      const double tolerance = dtype == torch::kFloat32 ? 1e-6 : 4e-3;
      EXPECT_LT(relative_error(got, want), tolerance)
          << dtype << " " << x.sizes();
    }
  }
  // A non-contiguous input, and a gradient wanted: the plain path.
  const auto x = torch::randn({6, 64}, cuda).t();
  const auto w = torch::randn({6}, cuda);
  EXPECT_LT(
      relative_error(
          ops::rms_norm(x, w, 1e-6), ops::rms_norm_reference(x, w, 1e-6)),
      1e-6);
  torch::GradMode::set_enabled(true);
  const auto wg = torch::randn({64}, cuda).requires_grad_(true);
  EXPECT_FALSE(ops::rms_norm_is_fused(torch::randn({2, 64}, cuda), wg));
  torch::GradMode::set_enabled(false);
}

} // namespace
} // namespace orchard
