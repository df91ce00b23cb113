// ops/linear_cross_entropy: the chunked loss against its plain definition
// (the whole logits' cross-entropy), values and the gradients for h and,
// when trained, W, with and without the soft-cap, over chunk sizes that do
// and do not divide the rows, with ignored targets, in float64 and
// float32; on a GPU, the CUDA kernel's chunks against the same definition.
#include "ops/linear_cross_entropy.h"

#include "core/torch_compat.h"
#include "ops/op_test_util.h"

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

// The GPT's loss: soft-capped logits and a trained head. Gradients for h
// and W against autograd through the plain definition; without gradients
// (evaluation) only the value. A cap of 15 on logits of about +-40 is far
// from linear, so a missing (1 - tanh^2) factor would show.
TEST(LinearCrossEntropy, SoftCappedWithATrainedHeadEqualsThePlainLoss) {
  torch::manual_seed(12);
  const int64_t N = 17, C = 8, V = 41;
  const double cap = 15;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double tol = dtype == torch::kFloat64 ? 1e-11 : 2e-5;
    auto w0 = torch::randn({V, C}, dtype) * 4;
    auto h0 = torch::randn({N, C}, dtype) * 4;
    auto targets = torch::randint(0, V, {N}, torch::kLong);
    targets[0] = -1;
    targets[11] = -1;
    auto href = h0.clone().requires_grad_(true);
    auto wref = w0.clone().requires_grad_(true);
    auto want = linear_cross_entropy_reference(href, wref, targets, cap);
    want.backward(torch::full({}, 0.25, dtype));
    EXPECT_GT(
        (torch::matmul(h0, w0.t()).abs() > 3 * cap).sum().item<int64_t>(), 10)
        << "the cap should bend some logits";
    for (int64_t chunk : {1, 3, 16, 17, 0}) {
      auto h = h0.clone().requires_grad_(true);
      auto w = w0.clone().requires_grad_(true);
      auto got = linear_cross_entropy(h, w, targets, chunk, cap);
      EXPECT_NEAR(got.item<double>(), want.item<double>(), tol * N)
          << "chunk " << chunk << " " << dtype;
      got.backward(torch::full({}, 0.25, dtype));
      EXPECT_TRUE(torch::allclose(h.grad(), href.grad(), tol, tol))
          << "chunk " << chunk << " " << dtype << " dh max diff "
          << (h.grad() - href.grad()).abs().max().item<double>();
      EXPECT_TRUE(torch::allclose(w.grad(), wref.grad(), tol, tol))
          << "chunk " << chunk << " " << dtype << " dW max diff "
          << (w.grad() - wref.grad()).abs().max().item<double>();
      EXPECT_EQ(h.grad()[11].abs().max().item<double>(), 0.0);
    }
    // Evaluation: the same value with gradients off, and nothing recorded.
    torch::NoGradGuard no_grad;
    auto w = w0.clone().requires_grad_(true);
    auto v = linear_cross_entropy(h0, w, targets, 5, cap);
    EXPECT_NEAR(v.item<double>(), want.item<double>(), tol * N);
    EXPECT_FALSE(v.requires_grad());
  }
}

void check_cuda_kernel(torch::Device cuda, int64_t V);

// On CUDA each chunk's loss and gradient come from one kernel
// (cuda::softcap_cross_entropy) over the logits in their own dtype. In
// float32 it equals the plain definition on the CPU; under bfloat16
// autocast (the logits rounded to bfloat16, as the plain chunk's product
// also rounds them) it stays within bfloat16's rounding of it. Odd
// vocabulary (past a 512-thread row), chunks that do not divide the rows,
// ignored rows, with and without the cap, gradients off too.
TEST(LinearCrossEntropy, TheCudaKernelEqualsThePlainDefinition) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(13);
  // 1999: padded to 2048, the last 16-byte piece of a row part padding;
  // 2048: no padding.
  for (int64_t V : {1999, 2048})
    check_cuda_kernel(cuda, V);
}

void check_cuda_kernel(torch::Device cuda, int64_t V) {
  const int64_t N = 37, C = 64;
  auto w0 = torch::randn({V, C}) * 0.5;
  auto h0 = torch::randn({N, C}) * 0.5;
  auto targets = torch::randint(0, V, {N}, torch::kLong);
  targets[3] = -1;
  targets[30] = -1;
  for (double cap : {0.0, 15.0}) {
    auto href = h0.to(torch::kFloat64).requires_grad_(true);
    auto wref = w0.to(torch::kFloat64).requires_grad_(true);
    auto want = linear_cross_entropy_reference(href, wref, targets, cap);
    want.backward(torch::full({}, 0.5, torch::kFloat64));
    for (bool bf16 : {false, true}) {
      const double tol = bf16 ? 2e-2 : 1e-5;
      for (int64_t chunk : {5, 37, 0}) {
        auto h = h0.to(cuda).requires_grad_(true);
        auto w = w0.to(cuda).requires_grad_(true);
        torch::Tensor got;
        {
          compat::AutocastGuard autocast(
              torch::kCUDA, bf16 ? torch::kBFloat16 : torch::kFloat32);
          got = linear_cross_entropy(h, w, targets.to(cuda), chunk, cap);
        }
        got.backward(torch::full({}, 0.5, got.options()));
        const std::string what = "V " + std::to_string(V) + " cap " +
            std::to_string(cap) + " chunk " +
            std::to_string(chunk) + (bf16 ? " bf16" : " fp32");
        EXPECT_NEAR(got.item<double>(), want.item<double>(),
                    tol * std::abs(want.item<double>()))
            << what;
        EXPECT_LT(test::relative_error(h.grad(), href.grad()), tol) << what;
        EXPECT_LT(test::relative_error(w.grad(), wref.grad()), tol) << what;
        EXPECT_EQ(h.grad()[30].abs().max().item<float>(), 0.0f) << what;
      }
    }
    torch::NoGradGuard no_grad;
    auto v = linear_cross_entropy(
        h0.to(cuda), w0.to(cuda), targets.to(cuda), 8, cap);
    EXPECT_NEAR(v.item<double>(), want.item<double>(),
                1e-5 * std::abs(want.item<double>()));
  }
  // A NaN in one row's input: that row's loss and gradient are NaN (the
  // sum is), the other rows' gradients stay finite.
  for (double cap : {0.0, 15.0}) {
    auto hn = h0.clone();
    hn[5][7] = std::nan("");
    auto h = hn.to(cuda).requires_grad_(true);
    torch::Tensor got;
    {
      compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      got = linear_cross_entropy(h, w0.to(cuda), targets.to(cuda), 0, cap);
    }
    got.backward();
    const std::string what =
        "V " + std::to_string(V) + " cap " + std::to_string(cap);
    EXPECT_TRUE(std::isnan(got.item<double>())) << what;
    EXPECT_TRUE(h.grad()[5].isnan().all().item<bool>()) << what;
    EXPECT_TRUE(h.grad()[6].isfinite().all().item<bool>()) << what;
  }
}

} // namespace
} // namespace orchard::ops
