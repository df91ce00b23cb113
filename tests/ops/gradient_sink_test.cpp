// core/gradient_sink with ops' products: a product's backward makes its
// weight's gradient in the memory a sink hands out (the gradient
// averager's bucket), returns that memory to autograd, and the gradient
// is the one it makes without a sink; a second use of the weight in the
// same backward gets nothing (the two never write over each other), and
// a destination of the wrong shape or dtype is not used.
#include "core/gradient_sink.h"

#include "core/torch_compat.h"
#include "ops/linear.h"
#include "ops/linear_cross_entropy.h"
#include "ops/op_test_util.h"

#include <gtest/gtest.h>

#include <map>

namespace orchard::ops {
namespace {

// Hands out one tensor per weight, once, as the averager does; counts the
// asks.
struct FakeSink final : GradientSink {
  std::map<std::intptr_t, torch::Tensor> places;
  std::map<std::intptr_t, int> asked;
  torch::Tensor destination(std::intptr_t key) override {
    ++asked[key];
    const auto it = places.find(key);
    if (it == places.end() || asked[key] > 1)
      return {};
    // A view, as the averager's is: a tensor of its own over the memory,
    // which autograd can keep as .grad without a copy.
    return it->second.view(it->second.sizes());
  }
};

// Sets the sink for one scope (a failed assertion leaves none behind).
struct SinkScope {
  explicit SinkScope(GradientSink* s) {
    set_gradient_sink(s);
  }
  ~SinkScope() {
    set_gradient_sink(nullptr);
  }
};

// The head's gradient from linear_cross_entropy used `uses` times on
// one weight (w0's copy), with `place` handed out for it when defined.
struct Made {
  torch::Tensor grad;
  int asked = 0;
};
Made head_gradient(
    const torch::Tensor& h,
    const torch::Tensor& w0,
    const torch::Tensor& targets,
    int uses,
    const torch::Tensor& place) {
  auto w = w0.clone().requires_grad_(true);
  FakeSink sink;
  if (place.defined())
    sink.places[weight_key(w)] = place;
  SinkScope scope(&sink);
  torch::Tensor loss = linear_cross_entropy(h, w, targets, 4);
  for (int u = 1; u < uses; ++u)
    loss = loss + 0.25 * linear_cross_entropy(h * double(u + 1), w, targets, 4);
  loss.backward(torch::full({}, 0.5));
  return {w.grad(), sink.asked[weight_key(w)]};
}

TEST(GradientSink, TheHeadsGradientIsMadeWhereTheSinkSays) {
  torch::manual_seed(3);
  const auto h = torch::randn({13, 8});
  const auto w0 = torch::randn({37, 8});
  const auto targets = torch::randint(0, 37, {13}, torch::kLong);
  const auto want = head_gradient(h, w0, targets, 1, {}).grad;
  ASSERT_GT(want.abs().max().item<double>(), 0.0);

  auto place = torch::full({37, 8}, 7.0);
  const Made got = head_gradient(h, w0, targets, 1, place);
  EXPECT_EQ(got.asked, 1);
  EXPECT_TRUE(torch::equal(place, want)) << max_diff(place, want);
  // Autograd kept the sink's memory as .grad: nothing was copied.
  EXPECT_EQ(got.grad.data_ptr(), place.data_ptr());

  // Two uses of one weight in one backward: the second is refused the
  // place and makes its own; autograd's sum is the whole gradient.
  const auto want2 = head_gradient(h, w0, targets, 2, {}).grad;
  const Made two = head_gradient(h, w0, targets, 2, torch::full({37, 8}, 7.0));
  EXPECT_EQ(two.asked, 2);
  EXPECT_LT(max_diff(two.grad, want2), 1e-6);
  EXPECT_GT(max_diff(want2, want), 1e-3); // the second use counts

  // A place of another shape or dtype is not used.
  for (const auto& wrong :
       {torch::full({8, 37}, 7.0),
        torch::full({37, 8}, 7.0, torch::kFloat64)}) {
    const Made other = head_gradient(h, w0, targets, 1, wrong);
    EXPECT_TRUE(torch::equal(other.grad, want));
    EXPECT_NE(other.grad.data_ptr(), wrong.data_ptr());
    EXPECT_EQ(wrong.max().item<double>(), 7.0); // left as it was
  }
}

// The products under CUDA autocast write the float32 weight gradient into
// the place (libtorch 2.10+; before that they make it and cast it, and
// ask for no place).
TEST(GradientSink, AutocastLinearWritesTheWeightGradientInPlace) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  torch::manual_seed(5);
  const torch::Device cuda(torch::kCUDA, 0);
  const auto x0 = torch::randn({3, 37, 96}, cuda).to(torch::kBFloat16);
  const auto w0 = torch::randn({160, 96}, cuda) * 0.1;
  const auto wy = torch::randn({3, 37, 160}, cuda);
  auto grad = [&](const torch::Tensor& place, int& asked) {
    auto w = w0.clone().requires_grad_(true);
    FakeSink sink;
    if (place.defined())
      sink.places[weight_key(w)] = place;
    SinkScope scope(&sink);
    torch::Tensor y;
    {
      compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      y = autocast_linear(x0, w);
    }
    (y.to(torch::kFloat32) * wy).sum().backward();
    asked = sink.asked[weight_key(w)];
    return w.grad();
  };
  int asked = 0;
  const auto want = grad({}, asked);
  auto place = torch::full({160, 96}, 7.0, torch::TensorOptions().device(cuda));
  const auto got = grad(place, asked);
  if (!ORCHARD_MM_OUT_DTYPE) {
    EXPECT_EQ(asked, 0);
    EXPECT_TRUE(torch::equal(got, want));
    return;
  }
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(torch::equal(place, want)) << max_diff(place, want);
  EXPECT_EQ(got.data_ptr(), place.data_ptr());
}

} // namespace
} // namespace orchard::ops
