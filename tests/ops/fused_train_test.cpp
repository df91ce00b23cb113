// The training step's fused ops (ops/fused_train.h): each plain definition
// against a hand computation on the CPU (values, and gradients against
// finite differences in float64), and each CUDA kernel against the plain
// definition, values and gradients, in float32, bfloat16 and float16, over
// odd shapes (skipped where the kernels are not built or there is no GPU).
#include "ops/fused_train.h"
#include "ops/op_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

namespace orchard {
namespace {

using test::relative_error;
using test::ulp;

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// The gradients of sum(f(inputs) * weights) by autograd, and by central
// differences of each input's entries.
void expect_gradients_match_differences(
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
    std::vector<torch::Tensor> inputs) {
  for (auto& x : inputs)
    x.requires_grad_(true);
  const auto out = f(inputs);
  const auto w = torch::randn(out.sizes(), kF64);
  (out * w).sum().backward();
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto x = inputs[k].detach().clone();
    auto flat = x.view({-1});
    auto numeric = torch::zeros_like(flat);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double h = 1e-6, v = flat[i].item<double>();
      auto with = [&](double value) {
        flat[i] = value;
        auto in = inputs;
        for (auto& t : in)
          t = t.detach();
        in[k] = x;
        return (f(in) * w).sum().item<double>();
      };
      numeric[i] = (with(v + h) - with(v - h)) / (2 * h);
      flat[i] = v;
    }
    EXPECT_LT(relative_error(inputs[k].grad().view({-1}), numeric), 1e-7) << k;
  }
}

TEST(FusedTrain, SiluMulHalvesIsSiluOfTheFirstHalfTimesTheSecond) {
  torch::manual_seed(1);
  const auto gu = torch::randn({3, 6, 5}, kF64);
  const auto got = ops::silu_mul_halves(gu, 1);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{3, 3, 5}));
  const auto g = gu.narrow(1, 0, 3), u = gu.narrow(1, 3, 3);
  EXPECT_LT(
      (got - g / (1 + torch::exp(-g)) * u).abs().max().item<double>(), 1e-14);
  EXPECT_THROW(ops::silu_mul_halves(torch::randn({3, 5}, kF64), 1), c10::Error);
  expect_gradients_match_differences(
      [](const std::vector<torch::Tensor>& in) {
        return ops::silu_mul_halves(in[0], -1);
      },
      {torch::randn({4, 6}, kF64)});
}

TEST(FusedTrain, AddRmsNormOverAnyDimensionWithPadding) {
  torch::manual_seed(2);
  auto a = torch::randn({2, 7, 5}, kF64), b = torch::randn({2, 7, 5}, kF64);
  // Over the middle dimension, its last two entries zero padding.
  a.narrow(1, 5, 2).zero_();
  b.narrow(1, 5, 2).zero_();
  const auto got = ops::add_rms_norm_unscaled(a, b, 1, 1e-5, 5);
  const auto s = a + b;
  const auto want =
      s / torch::sqrt((s * s).narrow(1, 0, 5).mean(1, true) + 1e-5);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-13);
  EXPECT_EQ(got.narrow(1, 5, 2).abs().max().item<double>(), 0.0);
  // Over the last, all entries.
  const auto last = ops::add_rms_norm_unscaled(a, b, -1, 1e-5);
  EXPECT_LT(
      (last - s / torch::sqrt((s * s).mean(-1, true) + 1e-5))
          .abs()
          .max()
          .item<double>(),
      1e-13);
  EXPECT_THROW(ops::add_rms_norm_unscaled(a, b, 1, 1e-5, 8), c10::Error);
  for (int64_t dim : {0, 1, 2})
    expect_gradients_match_differences(
        [dim](const std::vector<torch::Tensor>& in) {
          return ops::add_rms_norm_unscaled(in[0], in[1], dim, 1e-5);
        },
        {torch::randn({3, 4, 5}, kF64), torch::randn({3, 4, 5}, kF64)});
}

// f on the inputs (in dtype, on dev), output and input gradients for a
// fixed random output weight; fused says which path ran.
struct Run {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;
};
Run run(
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
    const std::vector<torch::Tensor>& inputs,
    const torch::Tensor& weight) {
  std::vector<torch::Tensor> in;
  for (const auto& x : inputs)
    in.push_back(x.detach().clone().requires_grad_(true));
  Run r;
  r.out = f(in);
  (r.out.to(torch::kFloat32) * weight).sum().backward();
  for (const auto& x : in)
    r.grads.push_back(x.grad());
  return r;
}

TEST(FusedTrain, SiluMulHalvesKernelEqualsThePlainOpsWithGradients) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(3);
  const auto on = torch::TensorOptions().device(cuda);
  // (shape, dim): a feature MLP's rows, the position mixer's (B, 2I, D),
  // odd sizes that take the unvectorized kernel.
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{37, 2 * 96}, -1},
      {{3, 2 * 40, 24}, 1},
      {{5, 2 * 7}, 1},
      {{2, 6, 3, 5}, 1}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const auto& [shape, dim] : cases) {
      const auto gu = (torch::randn(shape, on) * 3).to(dtype);
      ASSERT_TRUE(ops::silu_mul_halves_is_fused(gu));
      auto out_shape = shape;
      out_shape[dim < 0 ? shape.size() - 1 : size_t(dim)] /= 2;
      const auto w = torch::randn(out_shape, on);
      const auto fused = run(
          [dim = dim](const std::vector<torch::Tensor>& in) {
            return ops::silu_mul_halves(in[0], dim);
          },
          {gu},
          w);
      const auto plain = run(
          [dim = dim](const std::vector<torch::Tensor>& in) {
            return ops::silu_mul_halves_reference(in[0], dim);
          },
          {gu},
          w);
      ASSERT_EQ(fused.out.sizes(), plain.out.sizes());
      EXPECT_EQ(fused.out.scalar_type(), dtype);
      EXPECT_LT(relative_error(fused.out, plain.out), 2 * ulp(dtype)) << dtype;
      EXPECT_LT(relative_error(fused.grads[0], plain.grads[0]), 4 * ulp(dtype))
          << dtype;
    }
}

TEST(FusedTrain, AddRmsNormKernelEqualsThePlainOpsWithGradients) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(4);
  const auto on = torch::TensorOptions().device(cuda);
  struct Case {
    std::vector<int64_t> shape;
    int64_t dim, count;
  };
  // Rows of 512 and of an odd 37; positions of the position mixer (104,
  // 97 of them real) over columns of 64; fewer columns than a tile; a
  // first dimension of 1; more positions than a tile holds.
  const std::vector<Case> cases = {
      {{33, 512}, -1, 0},
      {{5, 9, 37}, 2, 0},
      {{3, 104, 64}, 1, 97},
      {{1, 13, 7}, 1, 0},
      {{4, 6}, 0, 0},
      {{2, 150, 40}, 1, 149}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const auto& c : cases) {
      auto a = torch::randn(c.shape, on), b = torch::randn(c.shape, on);
      if (c.count > 0) {
        const int64_t real = c.count, n = a.size(c.dim) - real;
        a.narrow(c.dim, real, n).zero_();
        b.narrow(c.dim, real, n).zero_();
      }
      a = a.to(dtype);
      b = b.to(dtype);
      ASSERT_TRUE(ops::add_rms_norm_unscaled_is_fused(a, b));
      const auto w = torch::randn(c.shape, on);
      auto f = [&c](bool fused) {
        return [&c, fused](const std::vector<torch::Tensor>& in) {
          return fused
              ? ops::add_rms_norm_unscaled(in[0], in[1], c.dim, 1e-5, c.count)
              : ops::add_rms_norm_unscaled_reference(
                    in[0], in[1], c.dim, 1e-5, c.count);
        };
      };
      const auto fused = run(f(true), {a, b}, w);
      const auto plain = run(f(false), {a, b}, w);
      ASSERT_EQ(fused.out.sizes(), plain.out.sizes());
      EXPECT_EQ(fused.out.scalar_type(), dtype);
      EXPECT_LT(relative_error(fused.out, plain.out), 2 * ulp(dtype)) << dtype;
      // The backward reads the rounded output where the plain one kept
      // the float32 sum: a few units in the last place.
      for (int k = 0; k < 2; ++k)
        EXPECT_LT(
            relative_error(fused.grads[k], plain.grads[k]), 8 * ulp(dtype))
            << dtype << " input " << k;
      if (c.count > 0) {
        EXPECT_EQ(
            fused.out.narrow(c.dim, c.count, c.shape[c.dim] - c.count)
                .abs()
                .max()
                .item<double>(),
            0.0);
      }
    }
}

} // namespace
} // namespace orchard
