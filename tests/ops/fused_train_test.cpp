// The training step's fused ops (ops/fused_train.h): each plain definition
// against a hand computation on the CPU (values, and gradients against
// finite differences in float64), and each CUDA kernel against the plain
// definition, values and gradients, in float32, bfloat16 and float16, over
// odd shapes (skipped where the kernels are not built or there is no GPU).
#include "ops/fused_train.h"
#include "core/torch_compat.h"
#include "ops/linear.h"
#include "ops/op_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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

TEST(FusedTrain, ReluSquareIsTheSquareOfThePositivePart) {
  torch::manual_seed(5);
  const auto u = torch::randn({4, 9}, kF64);
  const auto want = torch::where(u > 0, u * u, torch::zeros_like(u));
  EXPECT_LT((ops::relu_square(u) - want).abs().max().item<double>(), 1e-15);
  // Away from 0, where the derivative jumps.
  expect_gradients_match_differences(
      [](const std::vector<torch::Tensor>& in) {
        return ops::relu_square(in[0]);
      },
      {torch::randn({3, 7}, kF64) + 0.01 * torch::ones({3, 7}, kF64)});
}

TEST(FusedTrain, RotaryNormQkvRotatesAndNormsQAndKAndKeepsV) {
  torch::manual_seed(6);
  const int64_t B = 2, T = 3, H = 4, Hkv = 2, D = 6;
  const auto qkv = torch::randn({B, T, (H + 2 * Hkv) * D}, kF64);
  const auto angle = torch::rand({T, D / 2}, kF64) * 6.0;
  const auto cos = torch::cos(angle), sin = torch::sin(angle);
  const auto out = ops::rotary_norm_qkv(qkv, H, Hkv, cos, sin, 1e-6);
  // By hand, one head at a time: rotate each pair (x[i], x[i + D/2]) by
  // its position's angle, then divide by the root mean square.
  const auto x = qkv.view({B, T, H + 2 * Hkv, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H + 2 * Hkv; ++h) {
        const auto head = x[b][t][h];
        torch::Tensor want = head;
        if (h < H + Hkv) {
          const auto x1 = head.narrow(0, 0, D / 2),
                     x2 = head.narrow(0, D / 2, D / 2);
          const auto c = cos[t], s = sin[t];
          const auto r = torch::cat({x1 * c + x2 * s, x2 * c - x1 * s});
          want = r / torch::sqrt((r * r).mean() + 1e-6);
        }
        const auto got = h < H ? out[0][b][t][h]
            : h < H + Hkv      ? out[1][b][t][h - H]
                               : out[2][b][t][h - H - Hkv];
        EXPECT_LT((got - want).abs().max().item<double>(), 1e-13) << h;
      }
  EXPECT_THROW(
      ops::rotary_norm_qkv(qkv.narrow(2, 0, 40), H, Hkv, cos, sin, 1e-6),
      c10::Error);
  for (int64_t part = 0; part < 3; ++part)
    expect_gradients_match_differences(
        [&, part](const std::vector<torch::Tensor>& in) {
          return ops::rotary_norm_qkv(in[0], H, Hkv, cos, sin, 1e-6)[part];
        },
        {torch::randn({1, T, (H + 2 * Hkv) * D}, kF64)});
}

TEST(FusedTrain, ResidualAddRmsNormReturnsTheSumAndItsNorm) {
  torch::manual_seed(9);
  const auto x = torch::randn({2, 3, 8}, kF64),
             b = torch::randn({2, 3, 8}, kF64);
  const auto [s, y] = ops::residual_add_rms_norm(x, b, 1e-6);
  EXPECT_LT((s - (x + b)).abs().max().item<double>(), 1e-15);
  const auto want =
      (x + b) / torch::sqrt((x + b).square().mean(-1, true) + 1e-6);
  EXPECT_LT((y - want).abs().max().item<double>(), 1e-13);
  EXPECT_EQ(
      ops::residual_add_rms_norm(x, b, 1e-6, torch::kFloat32)
          .second.scalar_type(),
      torch::kFloat32);
  // Both outputs carry gradient back to both inputs.
  for (int out = 0; out < 2; ++out)
    expect_gradients_match_differences(
        [out](const std::vector<torch::Tensor>& in) {
          const auto r = ops::residual_add_rms_norm(in[0], in[1], 1e-6);
          return out == 0 ? r.first : r.second;
        },
        {torch::randn({3, 5}, kF64), torch::randn({3, 5}, kF64)});
  expect_gradients_match_differences(
      [](const std::vector<torch::Tensor>& in) {
        const auto [sum, normed] =
            ops::residual_add_rms_norm(in[0], in[1], 1e-6);
        return sum * 0.3 + normed;
      },
      {torch::randn({3, 5}, kF64), torch::randn({3, 5}, kF64)});
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

TEST(FusedTrain, ReluSquareKernelEqualsThePlainOpsWithGradients) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(7);
  const auto on = torch::TensorOptions().device(cuda);
  // Vectorized rows, an odd count, and zeros where the derivative jumps.
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{16, 3072}, {37, 11}, {5}}) {
      auto u = (torch::randn(shape, on) * 3).to(dtype);
      u.view({-1}).narrow(0, 0, 1).zero_();
      ASSERT_TRUE(ops::relu_square_is_fused(u));
      const auto w = torch::randn(shape, on);
      const auto fused = run(
          [](const std::vector<torch::Tensor>& in) {
            return ops::relu_square(in[0]);
          },
          {u},
          w);
      const auto plain = run(
          [](const std::vector<torch::Tensor>& in) {
            return ops::relu_square_reference(in[0]);
          },
          {u},
          w);
      EXPECT_EQ(fused.out.scalar_type(), dtype);
      // The same roundings: equal to the bit.
      EXPECT_EQ(relative_error(fused.out, plain.out), 0.0) << dtype;
      EXPECT_EQ(relative_error(fused.grads[0], plain.grads[0]), 0.0) << dtype;
    }
  const auto nan = torch::full({8}, std::nan(""), on);
  EXPECT_TRUE(ops::relu_square(nan).isnan().all().item<bool>());
}

TEST(FusedTrain, RotaryNormQkvKernelEqualsThePlainOpsWithGradients) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(8);
  const auto on = torch::TensorOptions().device(cuda);
  struct Case {
    int64_t B, T, H, Hkv, D;
  };
  // GPT d12's heads (6 of 128), grouped-query heads of 64, 192 and 256, an
  // odd sequence length.
  const std::vector<Case> cases = {
      {2, 33, 6, 6, 128},
      {3, 7, 4, 2, 64},
      {1, 5, 2, 1, 192},
      {2, 9, 3, 3, 256}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const auto& c : cases) {
      const auto qkv =
          torch::randn({c.B, c.T, (c.H + 2 * c.Hkv) * c.D}, on).to(dtype);
      const auto angle =
          torch::arange(c.T, on).unsqueeze(1) * torch::rand({1, c.D / 2}, on);
      const auto cos = torch::cos(angle).to(dtype),
                 sin = torch::sin(angle).to(dtype);
      ASSERT_TRUE(ops::rotary_norm_qkv_is_fused(qkv, c.H, c.Hkv, cos, sin));
      // heads_first: the gradients come back in attention's (B, heads, T,
      // D) layout, which the kernel reads where it is.
      for (const bool heads_first : {false, true})
        for (int64_t part = 0; part < 3; ++part) {
          const int64_t heads = part == 0 ? c.H : c.Hkv;
          const auto w = torch::randn({c.B, c.T, heads, c.D}, on);
          auto f = [&c, &cos, &sin, part, heads_first](bool fused) {
            return [&c, &cos, &sin, part, heads_first, fused](
                       const std::vector<torch::Tensor>& in) {
              const double eps = 1e-6;
              auto out =
                  (fused
                       ? ops::rotary_norm_qkv(in[0], c.H, c.Hkv, cos, sin, eps)
                       : ops::rotary_norm_qkv_reference(
                             in[0], c.H, c.Hkv, cos, sin, eps))[part];
              return heads_first
                  ? out.transpose(1, 2).contiguous().transpose(1, 2)
                  : out;
            };
          };
          const auto got = run(f(true), {qkv}, w);
          const auto want = run(f(false), {qkv}, w);
          ASSERT_EQ(got.out.sizes(), want.out.sizes());
          EXPECT_EQ(got.out.scalar_type(), dtype);
          EXPECT_LT(relative_error(got.out, want.out), 2 * ulp(dtype))
              << dtype << " D " << c.D << " part " << part;
          // The backward reads the rounded outputs where the plain norm
          // kept its float32 input: a few units in the last place.
          EXPECT_LT(relative_error(got.grads[0], want.grads[0]), 8 * ulp(dtype))
              << dtype << " D " << c.D << " part " << part << " heads first "
              << heads_first;
        }
      // v is the product's own columns.
      const auto v = ops::rotary_norm_qkv(qkv, c.H, c.Hkv, cos, sin, 1e-6)[2];
      EXPECT_EQ(v.data_ptr(), qkv.narrow(2, (c.H + c.Hkv) * c.D, 1).data_ptr());
    }
}

TEST(FusedTrain, ResidualAddRmsNormKernelEqualsThePlainOpsWithGradients) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(10);
  const auto on = torch::TensorOptions().device(cuda);
  struct Case {
    torch::ScalarType residual, branch, out;
  };
  // Autocast's float32 stream with bfloat16 (and float16) blocks, the last
  // norm kept in float32, and one dtype throughout.
  const std::vector<Case> cases = {
      {torch::kFloat32, torch::kBFloat16, torch::kBFloat16},
      {torch::kFloat32, torch::kBFloat16, torch::kFloat32},
      {torch::kFloat32, torch::kFloat16, torch::kFloat16},
      {torch::kFloat32, torch::kFloat32, torch::kFloat32},
      {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16},
      {torch::kFloat16, torch::kFloat16, torch::kFloat16}};
  for (const auto& c : cases)
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{4, 17, 768}, {3, 128}, {2, 5, 1280}}) {
      const auto x = (torch::randn(shape, on) * 2).to(c.residual);
      const auto b = torch::randn(shape, on).to(c.branch);
      ASSERT_TRUE(ops::residual_add_rms_norm_is_fused(x, b, c.out));
      const auto ws = torch::randn(shape, on), wy = torch::randn(shape, on);
      auto f = [&c, &ws](bool fused) {
        return [&c, &ws, fused](const std::vector<torch::Tensor>& in) {
          const auto [s, y] = fused
              ? ops::residual_add_rms_norm(in[0], in[1], 1e-6, c.out)
              : ops::residual_add_rms_norm_reference(in[0], in[1], 1e-6, c.out);
          EXPECT_EQ(y.scalar_type(), c.out);
          EXPECT_EQ(s.scalar_type(), c.residual);
          // Both outputs in what run() weighs.
          return y.to(torch::kFloat32) + s.to(torch::kFloat32) * ws;
        };
      };
      const auto got = run(f(true), {x, b}, wy);
      const auto want = run(f(false), {x, b}, wy);
      const double tol = std::max(ulp(c.out), ulp(c.branch));
      EXPECT_LT(relative_error(got.out, want.out), 2 * tol)
          << c.residual << c.branch << c.out;
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(got.grads[k].scalar_type(), k == 0 ? c.residual : c.branch);
        EXPECT_LT(relative_error(got.grads[k], want.grads[k]), 8 * tol)
            << c.residual << c.branch << c.out << " input " << k;
      }
    }
  // The last block's sum feeds nothing (no gradient for it): only the
  // norm's, at a width with a kernel of its own and one without.
  for (const int64_t C : {768, 128}) {
    const auto x = torch::randn({5, C}, on);
    const auto b = torch::randn({5, C}, on).to(torch::kBFloat16);
    const auto w = torch::randn({5, C}, on);
    auto f = [](bool fused) {
      return [fused](const std::vector<torch::Tensor>& in) {
        return (fused ? ops::residual_add_rms_norm(
                            in[0], in[1], 1e-6, torch::kBFloat16)
                      : ops::residual_add_rms_norm_reference(
                            in[0], in[1], 1e-6, torch::kBFloat16))
            .second;
      };
    };
    const auto got = run(f(true), {x, b}, w), want = run(f(false), {x, b}, w);
    for (int k = 0; k < 2; ++k)
      EXPECT_LT(
          relative_error(got.grads[k], want.grads[k]),
          8 * ulp(torch::kBFloat16))
          << "C " << C << " input " << k;
  }
  // 100 values a row: the plain ops.
  const auto odd = torch::randn({3, 100}, on);
  EXPECT_FALSE(ops::residual_add_rms_norm_is_fused(odd, odd, torch::kFloat32));
}
// The CPU's loops (ops/fused_cpu.h) against the plain ops, float32,
// values and gradients; float64 goes through them in the tests above,
// against hand computations and finite differences.
TEST(FusedTrain, CpuReluSquareEqualsThePlainOpsToTheBit) {
  torch::manual_seed(13);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{16, 3072}, {37, 11}, {5}}) {
    auto u = torch::randn(shape) * 3;
    u.view({-1}).narrow(0, 0, 1).zero_();
    ASSERT_TRUE(ops::relu_square_is_fused(u));
    const auto w = torch::randn(shape);
    auto f = [](bool fused) {
      return [fused](const std::vector<torch::Tensor>& in) {
        return fused ? ops::relu_square(in[0])
                     : ops::relu_square_reference(in[0]);
      };
    };
    const auto got = run(f(true), {u}, w), want = run(f(false), {u}, w);
    EXPECT_EQ(relative_error(got.out, want.out), 0.0);
    EXPECT_EQ(relative_error(got.grads[0], want.grads[0]), 0.0);
  }
  const double inf = std::numeric_limits<double>::infinity();
  const auto edge = torch::tensor({std::nan(""), -inf, inf, -0.0, 2.0});
  const auto y = ops::relu_square(edge);
  EXPECT_TRUE(y[0].isnan().item<bool>());
  EXPECT_EQ(y[1].item<float>(), 0.0f);
  EXPECT_EQ(y[2].item<float>(), float(inf));
  EXPECT_EQ(y[3].item<float>(), 0.0f);
  EXPECT_EQ(y[4].item<float>(), 4.0f);
  EXPECT_FALSE(ops::relu_square_is_fused(edge.to(torch::kBFloat16)));
}

TEST(FusedTrain, CpuRotaryNormQkvEqualsThePlainOpsWithGradients) {
  torch::manual_seed(14);
  struct Case {
    int64_t B, T, H, Hkv, D;
  };
  // GPT d12's heads (6 of 128), grouped-query heads, a D of 6.
  const std::vector<Case> cases = {
      {2, 33, 6, 6, 128}, {3, 7, 4, 2, 64}, {1, 5, 2, 1, 6}};
  for (const auto& c : cases) {
    const auto qkv = torch::randn({c.B, c.T, (c.H + 2 * c.Hkv) * c.D});
    const auto angle =
        torch::arange(c.T).unsqueeze(1) * torch::rand({1, c.D / 2});
    const auto cos = torch::cos(angle), sin = torch::sin(angle);
    ASSERT_TRUE(ops::rotary_norm_qkv_is_fused(qkv, c.H, c.Hkv, cos, sin));
    EXPECT_FALSE(ops::rotary_norm_qkv_is_fused(
        qkv, c.H, c.Hkv, cos.narrow(0, 0, c.T - 1), sin.narrow(0, 0, c.T - 1)));
    // heads_first: gradients in attention's (B, heads, T, D) layout.
    for (const bool heads_first : {false, true})
      for (int64_t part = 0; part < 3; ++part) {
        const int64_t heads = part == 0 ? c.H : c.Hkv;
        const auto w = torch::randn({c.B, c.T, heads, c.D});
        auto f = [&c, &cos, &sin, part, heads_first](bool fused) {
          return [&c, &cos, &sin, part, heads_first, fused](
                     const std::vector<torch::Tensor>& in) {
            auto out =
                (fused ? ops::rotary_norm_qkv(in[0], c.H, c.Hkv, cos, sin, 1e-6)
                       : ops::rotary_norm_qkv_reference(
                             in[0], c.H, c.Hkv, cos, sin, 1e-6))[part];
            return heads_first
                ? out.transpose(1, 2).contiguous().transpose(1, 2)
                : out;
          };
        };
        const auto got = run(f(true), {qkv}, w), want = run(f(false), {qkv}, w);
        ASSERT_EQ(got.out.sizes(), want.out.sizes());
        EXPECT_LT(relative_error(got.out, want.out), 2 * ulp(torch::kFloat32))
            << "D " << c.D << " part " << part;
        EXPECT_LT(
            relative_error(got.grads[0], want.grads[0]),
            8 * ulp(torch::kFloat32))
            << "D " << c.D << " part " << part << " heads first "
            << heads_first;
      }
    const auto v = ops::rotary_norm_qkv(qkv, c.H, c.Hkv, cos, sin, 1e-6)[2];
    EXPECT_EQ(v.data_ptr(), qkv.narrow(2, (c.H + c.Hkv) * c.D, 1).data_ptr());
  }
}

TEST(FusedTrain, CpuResidualAddRmsNormEqualsThePlainOpsWithGradients) {
  torch::manual_seed(15);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{4, 17, 768}, {3, 128}, {2, 5, 100}}) {
    const auto x = torch::randn(shape) * 2, b = torch::randn(shape);
    ASSERT_TRUE(ops::residual_add_rms_norm_is_fused(x, b, torch::kFloat32));
    const auto ws = torch::randn(shape), wy = torch::randn(shape);
    // Both outputs weighed, then the norm's alone (the last block's sum
    // feeds nothing).
    for (const bool sum_used : {true, false}) {
      auto f = [&ws, sum_used](bool fused) {
        return [&ws, sum_used, fused](const std::vector<torch::Tensor>& in) {
          const auto [s, y] = fused
              ? ops::residual_add_rms_norm(in[0], in[1], 1e-6)
              : ops::residual_add_rms_norm_reference(in[0], in[1], 1e-6);
          return sum_used ? y + s * ws : y;
        };
      };
      const auto got = run(f(true), {x, b}, wy);
      const auto want = run(f(false), {x, b}, wy);
      EXPECT_LT(relative_error(got.out, want.out), 2 * ulp(torch::kFloat32));
      for (int k = 0; k < 2; ++k)
        EXPECT_LT(
            relative_error(got.grads[k], want.grads[k]),
            8 * ulp(torch::kFloat32))
            << "input " << k << " sum used " << sum_used;
    }
  }
  // A bfloat16 branch or output: the plain ops.
  const auto x = torch::randn({3, 8});
  EXPECT_FALSE(ops::residual_add_rms_norm_is_fused(
      x, x.to(torch::kBFloat16), torch::kFloat32));
  EXPECT_FALSE(ops::residual_add_rms_norm_is_fused(x, x, torch::kBFloat16));
}

TEST(FusedTrain, AutocastLinearMakesTheWeightGradientInFloat32) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  torch::manual_seed(12);
  const torch::Device cuda(torch::kCUDA, 0);
  const auto x0 = torch::randn({3, 37, 96}, cuda).to(torch::kBFloat16);
  const auto w0 = torch::randn({160, 96}, cuda) * 0.1;
  const auto wy = torch::randn({3, 37, 160}, cuda);
  struct Out {
    torch::Tensor y, dx, dw;
  };
  auto step = [&](bool fused) {
    auto x = x0.clone().requires_grad_(true);
    auto w = w0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      compat::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
      EXPECT_EQ(
          ops::autocast_linear_is_fused(x, w), bool(ORCHARD_MM_OUT_DTYPE));
      y = fused ? ops::autocast_linear(x, w)
                : torch::nn::functional::linear(x, w);
    }
    (y.to(torch::kFloat32) * wy).sum().backward();
    return Out{y, x.grad(), w.grad()};
  };
  const Out got = step(true), plain = step(false);
  EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
  EXPECT_LT(relative_error(got.y, plain.y), ulp(torch::kBFloat16));
  EXPECT_EQ(got.dx.scalar_type(), torch::kBFloat16);
  EXPECT_LT(relative_error(got.dx, plain.dx), ulp(torch::kBFloat16));
  // The weight's gradient against float64 from the same 16-bit operands
  // (the incoming gradient as the backward rounds it): float32-exact where
  // the product writes float32, bfloat16-rounded where it is cast after.
  auto dy = wy.to(torch::kBFloat16).to(torch::kFloat64).reshape({-1, 160});
  auto want = dy.t().mm(x0.to(torch::kFloat64).reshape({-1, 96}));
  EXPECT_EQ(got.dw.scalar_type(), torch::kFloat32);
  const double plain_error = relative_error(plain.dw, want);
  EXPECT_GT(plain_error, 1e-4);
  if (ORCHARD_MM_OUT_DTYPE)
    EXPECT_LT(relative_error(got.dw, want), plain_error / 10);
  else
    EXPECT_EQ(relative_error(got.dw, plain.dw), 0.0);
}

} // namespace
} // namespace orchard
