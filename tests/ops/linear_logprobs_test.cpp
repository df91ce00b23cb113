// ops/linear_logprobs: the chunked per-token log-probabilities against their
// plain definition (the whole logits, divided by the temperature,
// log-softmaxed), values and the gradients for h and for a trained W, with
// an uneven incoming gradient, over chunk sizes that do and do not divide
// the rows, in float64 and float32.
#include "ops/linear_logprobs.h"

#include <gtest/gtest.h>

namespace orchard::ops {
namespace {

TEST(LinearLogprobs, EqualTheWholeLogitsLogSoftmax) {
  torch::manual_seed(12);
  const int64_t N = 11, C = 6, V = 29;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 2e-5;
    auto h0 = torch::randn({N, C}, dtype);
    auto w0 = torch::randn({V, C}, dtype);
    auto targets = torch::randint(0, V, {N}, torch::kLong);
    auto g = torch::randn({N}, dtype); // per token, as GRPO's loss gives
    for (double t : {1.0, 0.7}) {
      auto href = h0.clone().requires_grad_(true);
      auto wref = w0.clone().requires_grad_(true);
      auto want = linear_logprobs_reference(href, wref, targets, t);
      want.backward(g);
      for (int64_t chunk : {1, 3, 4, 11, 64}) {
        auto h = h0.clone().requires_grad_(true);
        auto w = w0.clone().requires_grad_(true);
        auto got = linear_logprobs(h, w, targets, t, chunk);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_TRUE(torch::allclose(got, want.detach(), tol, tol))
            << "chunk " << chunk << " t " << t << " " << dtype;
        got.backward(g);
        EXPECT_TRUE(torch::allclose(h.grad(), href.grad(), tol, tol))
            << "dh, chunk " << chunk << " t " << t << " max diff "
            << (h.grad() - href.grad()).abs().max().item<double>();
        EXPECT_TRUE(torch::allclose(w.grad(), wref.grad(), tol, tol))
            << "dW, chunk " << chunk << " t " << t << " max diff "
            << (w.grad() - wref.grad()).abs().max().item<double>();
      }
      // A frozen head: only h gets a gradient.
      auto h = h0.clone().requires_grad_(true);
      auto got = linear_logprobs(h, w0, targets, t, 4);
      got.backward(g);
      EXPECT_TRUE(torch::allclose(h.grad(), href.grad(), tol, tol));
      EXPECT_FALSE(w0.grad().defined());
    }
  }
}

} // namespace
} // namespace orchard::ops
