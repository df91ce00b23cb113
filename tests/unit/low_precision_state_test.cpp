// train/low_precision_state and the optimizer paths on it: the 8-bit codes
// against their definition (relative error bounds over eight decades, zero
// kept zero, tails shorter than a block), stochastic rounding against its
// expectation, 8-bit AdamW against float32 AdamW, bfloat16 weights that
// still move under updates far below their last bit (and do not with
// round-to-nearest, the control), and the 8-bit state's round trip.
#include "train/low_precision_state.h"
#include "train/optimizer.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace orchard::train {
namespace {

TEST(LowPrecisionState, EightBitCodesKeepEightDecades) {
  torch::manual_seed(3);
  const int64_t n = 3 * kBlock + 17; // a tail shorter than a block
  // Magnitudes from 1 down to 1e-8 in every block, both signs.
  auto mag = torch::pow(10.0, -8.0 * torch::rand({n}, torch::kFloat64));
  auto x = (mag * (torch::rand({n}, torch::kFloat64) < 0.5).to(torch::kFloat64).mul(2).sub(1))
               .to(torch::kFloat32);
  x[5] = 0.0f;
  for (bool is_signed : {true, false}) {
    auto value = is_signed ? x : x * x; // v: squares, as Adam's second moment
    Quantized8 q = zero_quantized(n, is_signed, torch::TensorOptions());
    EXPECT_EQ(q.codes.numel(), 4 * kBlock);
    EXPECT_EQ(q.codes.scalar_type(), is_signed ? torch::kChar : torch::kByte);
    for (int64_t from : {int64_t(0), 2 * kBlock}) {
      const int64_t len = from == 0 ? 2 * kBlock : n - from;
      auto part = value.narrow(0, from, len);
      const int64_t padded = (len + kBlock - 1) / kBlock * kBlock;
      quantize8(q, is_signed, from, torch::constant_pad_nd(part, {0, padded - len}));
      auto back = dequantize8(q, is_signed, from, len).narrow(0, 0, len);
      // Within each block: for the exact code c = 127 r^(1/4) (255 for v's
      // root), the stored code is within half a step, so the value is off
      // by at most a factor (1 + 1/(2c))^4 ~ 1 + 2/c (v: squared), and
      // values below the block's smallest step round to zero.
      auto blocks = part.abs().view({-1}).split(kBlock);
      auto backs = back.split(kBlock);
      for (size_t b = 0; b < blocks.size(); ++b) {
        const double top = blocks[b].max().item<double>();
        auto r = (is_signed ? blocks[b] / top : (blocks[b] / top).sqrt()).to(torch::kFloat64);
        auto code = r.pow(0.25) * (is_signed ? 127 : 255);
        auto bound = (1 + 0.5 / code.clamp_min(0.5)).pow(is_signed ? 4 : 8) - 1 + 1e-5;
        auto err = ((backs[b] - part.split(kBlock)[b]).abs() /
                    part.split(kBlock)[b].abs().clamp_min(1e-38))
                       .to(torch::kFloat64);
        auto big = code >= 1; // above the smallest step
        EXPECT_TRUE((err.masked_select(big) <= bound.masked_select(big)).all().item<bool>())
            << (is_signed ? "m" : "v") << " block " << b << " worst "
            << (err - bound).masked_select(big).max().item<double>();
        if (is_signed) // the sign survives
          EXPECT_TRUE((backs[b] * part.split(kBlock)[b] >= 0).all().item<bool>());
      }
    }
    auto back = dequantize8(q, is_signed, 0, n).narrow(0, 0, n);
    EXPECT_EQ(back[5].item<float>(), 0.0f); // zero stays zero
    EXPECT_EQ(dequantize8(q, is_signed, 0, n).numel(), 4 * kBlock);
  }
}

TEST(LowPrecisionState, StochasticRoundingIsUnbiasedAndLandsOnNeighbours) {
  torch::manual_seed(4);
  // 1 + 1/3 of bfloat16's step at 1 (2^-7): between 1 and 1 + 2^-7.
  const double step = std::ldexp(1.0, -7), x = 1.0 + step / 3;
  const int64_t n = 200000;
  auto src = torch::full({n}, x, torch::kFloat32);
  auto out = torch::empty({n}, torch::kBFloat16);
  auto gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(7);
  stochastic_round_into(out, src, gen);
  auto o = out.to(torch::kFloat64);
  EXPECT_TRUE(((o == 1.0) | (o == 1.0 + step)).all().item<bool>());
  // P(up) = 1/3: the mean is x within five standard errors.
  const double se = step * std::sqrt(1.0 / 3 * 2.0 / 3 / double(n));
  EXPECT_NEAR(o.mean().item<double>(), x, 5 * se);
  // Negative values and values already representable.
  auto neg = torch::full({n}, -x, torch::kFloat32);
  stochastic_round_into(out, neg, gen);
  EXPECT_NEAR(out.to(torch::kFloat64).mean().item<double>(), -x, 5 * se);
  auto exact = torch::tensor({1.5f, -2.0f, 0.0f, 3.0f});
  auto e_out = torch::empty({4}, torch::kBFloat16);
  stochastic_round_into(e_out, exact, gen);
  EXPECT_TRUE(torch::equal(e_out.to(torch::kFloat32), exact));
}

// A least-squares problem both optimizers solve: 8-bit moments follow the
// float32 ones closely, step by step and at the end.
TEST(LowPrecisionState, EightBitAdamwFollowsFloat32Adamw) {
  torch::manual_seed(5);
  auto A = torch::randn({64, 700}), target = torch::randn({64});
  auto w0 = torch::randn({700}) * 0.01;
  auto run = [&](bool q8, int steps) {
    auto w = w0.clone().requires_grad_(true);
    OptimizerOptions oo;
    oo.adam_beta1 = 0.9;
    oo.adam_beta2 = 0.999;
    oo.adam_eps = 1e-8;
    oo.adam_8bit = q8;
    Optimizers opt({{"w", {{"w", w}}, 1e-2, 0.01, false}}, oo);
    double loss = 0;
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto l = (torch::matmul(A, w) - target).pow(2).mean();
      l.backward();
      loss = l.item<double>();
      opt.step(1.0, s);
    }
    return std::make_pair(w.detach().clone(), loss);
  };
  auto [w32_1, l32_1] = run(false, 1);
  auto [w8_1, l8_1] = run(true, 1);
  // Step 1 moves every weight by about lr (m / sqrt(v) = sign(g)): the
  // 8-bit update is within a few per cent of it.
  auto d32 = w32_1 - w0, d8 = w8_1 - w0;
  EXPECT_LT(((d8 - d32).abs().max() / d32.abs().max()).item<double>(), 0.05);
  auto [w32, l32] = run(false, 300);
  auto [w8, l8] = run(true, 300);
  const double start = (torch::matmul(A, w0) - target).pow(2).mean().item<double>();
  EXPECT_LT(l32, 0.05 * start);
  EXPECT_LT(l8, 0.05 * start);
  EXPECT_LT(std::abs(l8 - l32), 0.02 * start) << l8 << " vs " << l32;
}

// bfloat16 weights under updates of 1/40 of their last bit: stochastic
// rounding moves them on average by the float32 run's amount; rounding to
// nearest (the control, a plain copy) would leave them where they were.
TEST(LowPrecisionState, Bfloat16WeightsMoveUnderTinyUpdates) {
  torch::manual_seed(6);
  const int64_t n = 20000;
  auto w0 = torch::ones({n}); // bfloat16's step at 1 is 2^-7
  const double lr = std::ldexp(1.0, -7) / 40;
  auto run = [&](torch::ScalarType dtype, bool q8) {
    auto w = w0.to(dtype).clone().requires_grad_(true);
    OptimizerOptions oo;
    oo.adam_8bit = q8;
    oo.seed = 11;
    Optimizers opt({{"w", {{"w", w}}, lr, 0.0, false}}, oo);
    for (int s = 0; s < 20; ++s) {
      w.mutable_grad() = torch::ones({n}, torch::TensorOptions().dtype(dtype));
      opt.step(1.0, s);
    }
    return w.detach().to(torch::kFloat64);
  };
  auto full = run(torch::kFloat32, false);
  const double moved = (w0.to(torch::kFloat64) - full).mean().item<double>();
  EXPECT_NEAR(moved, 20 * lr, 1e-3 * 20 * lr); // sign(g) steps of lr
  for (bool q8 : {false, true}) {
    auto half = run(torch::kBFloat16, q8);
    const double m = (w0.to(torch::kFloat64) - half).mean().item<double>();
    EXPECT_NEAR(m, moved, 0.1 * moved) << (q8 ? "8-bit" : "float32 moments");
  }
  // The control: round to nearest loses every step.
  auto w = w0.to(torch::kBFloat16);
  auto nearest = (w.to(torch::kFloat32) - lr).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(nearest, w));
}

TEST(LowPrecisionState, EightBitStateRoundTripsAndRefusesTheOtherKind) {
  torch::manual_seed(8);
  auto make = [](torch::Tensor w, bool q8) {
    OptimizerOptions oo;
    oo.adam_8bit = q8;
    return Optimizers({{"g", {{"w", w}}, 1e-2, 0.0, false}}, oo);
  };
  auto w1 = torch::randn({300}).requires_grad_(true); // two blocks, padded
  auto w2 = w1.detach().clone().requires_grad_(true);
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i)
    grads.push_back(torch::randn({300}));
  Optimizers o1 = make(w1, true), o2 = make(w2, true);
  for (int s = 0; s < 3; ++s) {
    w1.mutable_grad() = grads[size_t(s)].clone();
    o1.step(1.0, s);
  }
  std::map<std::string, torch::Tensor> saved;
  for (auto& [k, v] : o1.state())
    saved[k] = v.clone();
  EXPECT_TRUE(saved.count("w.exp_avg.q8"));
  EXPECT_EQ(saved.at("w.exp_avg_sq.q8").scalar_type(), torch::kByte);
  EXPECT_EQ(saved.at("w.exp_avg.absmax").numel(), 2);
  EXPECT_FALSE(saved.count("w.exp_avg"));
  {
    torch::NoGradGuard ng;
    w2.copy_(w1);
  }
  o2.load(saved);
  for (int s = 3; s < 6; ++s) {
    w1.mutable_grad() = grads[size_t(s)].clone();
    w2.mutable_grad() = grads[size_t(s)].clone();
    o1.step(1.0, s);
    o2.step(1.0, s);
  }
  EXPECT_TRUE(torch::equal(w1, w2));
  // 8-bit state into a 32-bit run, and the reverse: a clear error.
  Optimizers o32 = make(w2, false);
  try {
    o32.load(saved);
    FAIL() << "loaded 8-bit state into float32 AdamW";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("adamw_8bit"), std::string::npos) << e.what();
  }
  w2.mutable_grad() = grads[0].clone();
  o32.step(1.0, 0);
  std::map<std::string, torch::Tensor> saved32;
  for (auto& [k, v] : o32.state())
    saved32[k] = v.clone();
  try {
    make(w2, true).load(saved32);
    FAIL() << "loaded float32 state into 8-bit AdamW";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("32-bit"), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace orchard::train
