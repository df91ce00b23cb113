// Muon and the optimizer set: Newton-Schulz against an SVD, Muon's first
// step worked by hand, AdamW against libtorch's own, and state round trips.
#include "train/optimizer.h"
#include "core/error.h"
#include "core/torch_compat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace orchard::train {
namespace {

// U V^T of G = U S V^T over the `rank` largest singular values (all when
// 0), in float64: what Newton-Schulz approximates. Five iterations leave
// singular values far below the largest near zero, so for a nearly
// low-rank G the reference is the polar factor of its dominant part.
torch::Tensor polar_factor(const torch::Tensor& g, int64_t rank = 0) {
  auto [u, s, vh] = at::linalg_svd(g.to(torch::kFloat64), false);
  (void)s;
  if (rank > 0) {
    u = u.narrow(1, 0, rank);
    vh = vh.narrow(0, 0, rank);
  }
  return torch::matmul(u, vh);
}

torch::Tensor singular_values(const torch::Tensor& x) {
  return std::get<1>(at::linalg_svd(x.to(torch::kFloat64), false));
}

TEST(NewtonSchulz, ApproximatesThePolarFactorOfWideTallAndIllConditioned) {
  torch::manual_seed(0);
  std::vector<std::pair<torch::Tensor, int64_t>> cases = {
      {torch::randn({64, 256}), 0},  // wide
      {torch::randn({256, 64}), 0},  // tall (transposed inside)
      {torch::randn({128, 128}), 0}, // square
      {torch::matmul(torch::randn({96, 4}), torch::randn({4, 96})) +
           1e-3 * torch::randn({96, 96}),
       4}}; // nearly rank 4
  for (const auto& [g, rank] : cases) {
    auto x =
        newton_schulz_orthogonalize(g, 5, torch::kFloat32).to(torch::kFloat64);
    ASSERT_EQ(x.sizes(), g.sizes());
    auto sv = singular_values(x);
    // The quintic maps every singular value that is not tiny into about
    // [0.7, 1.2] (the Muon write-up); none may exceed that band.
    EXPECT_LT(sv.max().item<double>(), 1.25) << g.sizes();
    // The direction: close to U V^T (cosine of the flattened matrices).
    auto p = polar_factor(g, rank);
    double cos = (x * p).sum().item<double>() /
        (x.norm().item<double>() * p.norm().item<double>());
    EXPECT_GT(cos, 0.9) << g.sizes();
  }
  // Well conditioned: every singular value lands in the band.
  auto sv = singular_values(
      newton_schulz_orthogonalize(torch::randn({64, 256}), 5, torch::kFloat32));
  EXPECT_GT(sv.min().item<double>(), 0.6);
}

TEST(NewtonSchulz, RejectsNonMatrices) {
  EXPECT_THROW(
      newton_schulz_orthogonalize(torch::ones({3}), 5, torch::kFloat32),
      c10::Error);
  EXPECT_THROW(
      newton_schulz_orthogonalize(
          torch::ones({2, 3, 4, 5}), 5, torch::kFloat32),
      c10::Error);
}

// A stack of same-shaped matrices is each matrix orthogonalised on its own
// (each with its own norm: the scales differ by 1000x), wide and tall.
TEST(NewtonSchulz, AStackIsEachMatrixOnItsOwn) {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (auto shape :
         {std::vector<int64_t>{24, 40}, std::vector<int64_t>{40, 24}}) {
      std::vector<torch::Tensor> gs;
      for (double scale : {1.0, 1e3, 1e-3})
        gs.push_back(scale * torch::randn(shape, torch::kFloat64));
      const auto stacked =
          newton_schulz_orthogonalize(torch::stack(gs), 5, dtype);
      ASSERT_EQ(stacked.size(0), 3);
      for (size_t k = 0; k < gs.size(); ++k) {
        const auto alone = newton_schulz_orthogonalize(gs[k], 5, dtype);
        const double diff =
            (stacked[int64_t(k)] - alone).abs().max().item<double>();
        EXPECT_LT(diff, dtype == torch::kFloat64 ? 1e-12 : 1e-5)
            << dtype << " " << shape[0] << "x" << shape[1] << " #" << k;
      }
    }
}

// Muon over matrices of which three share a shape (stacked) and one does
// not steps each exactly as Muon over that matrix alone.
TEST(Muon, StackedMatricesStepAsEachAlone) {
  torch::manual_seed(4);
  const std::vector<std::vector<int64_t>> shapes = {
      {8, 12}, {12, 8}, {8, 12}, {8, 12}};
  std::vector<torch::Tensor> together, alone;
  for (const auto& s : shapes) {
    together.push_back(torch::randn(s, torch::kFloat64).requires_grad_(true));
    alone.push_back(together.back().detach().clone().requires_grad_(true));
  }
  OptimizerOptions oo;
  oo.newton_schulz_dtype = torch::kFloat64;
  oo.muon_stack_on_cpu = true; // as on a GPU
  auto group = [](std::vector<torch::Tensor> ps, size_t first) {
    NamedTensors named;
    for (size_t i = 0; i < ps.size(); ++i)
      named.push_back({"w" + std::to_string(first + i), ps[i]});
    return ParamGroup{
        .name = "matrices",
        .params = named,
        .lr = 0.02,
        .weight_decay = 0.1,
        .muon = true};
  };
  Optimizers one({group(together, 0)}, oo);
  std::vector<Optimizers> each;
  for (size_t i = 0; i < alone.size(); ++i)
    each.emplace_back(std::vector<ParamGroup>{group({alone[i]}, i)}, oo);
  for (int64_t step = 0; step < 3; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto g = torch::randn(shapes[i], torch::kFloat64);
      together[i].mutable_grad() = g.clone();
      alone[i].mutable_grad() = g.clone();
    }
    one.step(1.0, step);
    for (auto& o : each)
      o.step(1.0, step);
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_LT((together[i] - alone[i]).abs().max().item<double>(), 1e-12) << i;
  EXPECT_GT((together[0] - together[2]).abs().max().item<double>(), 1e-3);
}

// Muon's first step worked by hand, with zero Newton-Schulz iterations (the
// orthogonalisation is then G / |G|_F): momentum 0.85 at step 0, buf =
// 0.15 g, Nesterov update = 0.85 * 0.15 g + 0.15 g, and the step is -lr *
// sqrt(max(1, rows / cols)) * update / |update|.
TEST(Muon, FirstStepByHand) {
  auto w = torch::tensor({{1.0, 2.0}, {3.0, 4.0}, {5.0, 6.0}}, torch::kFloat64)
               .requires_grad_(true); // 3 x 2: aspect sqrt(1.5)
  auto g =
      torch::tensor({{0.5, -1.0}, {2.0, 0.0}, {1.0, 1.0}}, torch::kFloat64);
  OptimizerOptions o;
  o.newton_schulz_steps = 0;
  o.newton_schulz_dtype = torch::kFloat64;
  Optimizers opt({{"m", {{"w", w}}, 0.1, 0.0, /*muon=*/true}}, o);
  w.mutable_grad() = g.clone();
  auto before = w.detach().clone();
  opt.step(1.0, 0);
  const double m = 0.85;
  auto update = (1 - m) * g + m * ((1 - m) * g);
  auto want = before - 0.1 * std::sqrt(1.5) * update / (update.norm() + 1e-7);
  EXPECT_TRUE(torch::allclose(w.detach(), want, 1e-12, 1e-12)) << w << want;
  // The learning-rate multiplier scales the step; momentum is kept.
  auto state = opt.state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "w.momentum_buffer");
  EXPECT_TRUE(torch::allclose(state[0].second, (1 - m) * g));
}

TEST(Optimizers, AdamwGroupsMatchLibtorchAdamw) {
  torch::manual_seed(1);
  auto a = torch::randn({4, 3}, torch::kFloat64).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  Optimizers ours({{"m", {{"a", a}}, 0.01, 0.1, false}});
  torch::optim::AdamW ref(
      {b},
      torch::optim::AdamWOptions(0.01)
          .betas({0.8, 0.95})
          .eps(1e-10)
          .weight_decay(0.1));
  for (int s = 0; s < 5; ++s) {
    auto g = torch::randn({4, 3}, torch::kFloat64);
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    ours.step(1.0, s);
    ref.step();
  }
  EXPECT_TRUE(torch::allclose(a, b, 0, 0));
}

// libtorch's AdamW (the oracle) over two groups as the tests' Optimizers
// build them: group a at lr 0.01 with weight decay 0.1, group b at lr
// 0.003 without; beta1 0.9, eps 1e-8.
std::unique_ptr<torch::optim::AdamW> libtorch_adamw(
    std::vector<torch::Tensor> a,
    std::vector<torch::Tensor> b,
    double beta2) {
  auto opts = [&](double lr, double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr)
            .betas({0.9, beta2})
            .eps(1e-8)
            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(a), opts(0.01, 0.1));
  groups.emplace_back(std::move(b), opts(0.003, 0));
  return std::make_unique<torch::optim::AdamW>(
      std::move(groups), torch::optim::AdamWOptions(1));
}

void check_multi_tensor_adamw(int64_t slice) {
  torch::manual_seed(3);
  std::vector<std::vector<int64_t>> shapes = {{4, 3}, {7}, {2, 5, 3}, {1}};
  std::vector<torch::Tensor> ours, ref;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto dt = i < 2 ? torch::kFloat64 : torch::kFloat32; // a group each
    auto t = torch::randn(shapes[i], dt);
    ours.push_back(t.clone().requires_grad_(true));
    ref.push_back(t.clone().requires_grad_(true));
  }
  Optimizers opt(
      {{"a", {{"w0", ours[0]}, {"w1", ours[1]}}, 0.01, 0.1, false},
       {"b", {{"w2", ours[2]}, {"w3", ours[3]}}, 0.003, 0.0, false}},
      {.adam_beta1 = 0.9,
       .adam_beta2 = 0.999,
       .adam_eps = 1e-8,
       .adam_slice_elements = slice});
  auto libptr = libtorch_adamw({ref[0], ref[1]}, {ref[2], ref[3]}, 0.999);
  auto& lib = *libptr;
  for (int s = 0; s < 5; ++s) {
    for (size_t i = 0; i < ours.size(); ++i) {
      if (s == 2 && i == 1) { // w1 gets no gradient at step 2
        ours[i].mutable_grad() = torch::Tensor();
        ref[i].mutable_grad() = torch::Tensor();
        continue;
      }
      auto g = torch::randn(shapes[i], ours[i].scalar_type());
      ours[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    opt.step(s == 3 ? 0.5 : 1.0, s);
    if (s == 3) // the multiplier scales every group's lr
      for (auto& g : lib.param_groups())
        static_cast<torch::optim::AdamWOptions&>(g.options())
            .lr(static_cast<torch::optim::AdamWOptions&>(g.options()).lr() *
                0.5);
    lib.step();
    if (s == 3)
      for (auto& g : lib.param_groups())
        static_cast<torch::optim::AdamWOptions&>(g.options())
            .lr(static_cast<torch::optim::AdamWOptions&>(g.options()).lr() * 2);
  }
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_TRUE(torch::equal(ours[i], ref[i])) << i << " slice " << slice;
  std::map<std::string, torch::Tensor> state;
  for (auto& [k, v] : opt.state())
    state[k] = v;
  EXPECT_EQ(state.at("w1.step").item<int64_t>(), 4);
  EXPECT_EQ(state.at("w0.step").item<int64_t>(), 5);
}

// Several tensors of several shapes in two groups, one of which misses a
// step (no gradient: no update and its own step count afterwards), float32
// and float64: the multi-tensor update equals libtorch's per-tensor AdamW
// exactly, and each tensor keeps its own step count.
TEST(Optimizers, MultiTensorAdamwMatchesLibtorchWithASkippedTensor) {
  // Slices: every tensor together, and at most 10 elements (every tensor in
  // a slice of its own).
  for (int64_t slice : {int64_t(1) << 26, int64_t(10)})
    check_multi_tensor_adamw(slice);
}

// On CUDA, float32 AdamW tensors go through libtorch's fused kernel
// (compat::fused_adamw): five steps of two groups, one tensor missing a
// step, against libtorch's per-tensor AdamW on the same device. The kernel
// rounds differently, so equal to float32's precision, not bit for bit.
// Skipped without a GPU or on libtorch 1.13 (no fused kernel).
TEST(Optimizers, FusedCudaAdamwMatchesLibtorchAdamw) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device";
  {
    auto p = torch::zeros({2}, torch::kCUDA);
    if (!compat::fused_adamw({p}, {p.clone()}, {p.clone()}, {p.clone()}, 1,
                             0.1, 0.9, 0.99, 0.0, 1e-8))
      GTEST_SKIP() << "this libtorch has no fused AdamW";
    // With a zero gradient and no decay the step moves nothing.
    EXPECT_TRUE(torch::equal(p, torch::zeros_like(p)));
  }
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{64, 33}, {7}, {5, 3}};
  std::vector<torch::Tensor> ours, ref, start;
  for (const auto& shape : shapes) {
    auto t = torch::randn(shape, torch::kCUDA);
    start.push_back(t.clone());
    ours.push_back(t.clone().requires_grad_(true));
    ref.push_back(t.clone().requires_grad_(true));
  }
  Optimizers opt(
      {{"a", {{"w0", ours[0]}, {"w1", ours[1]}}, 0.01, 0.1, false},
       {"b", {{"w2", ours[2]}}, 0.003, 0.0, false}},
      {.adam_beta1 = 0.9, .adam_beta2 = 0.95, .adam_eps = 1e-8});
  auto lib = libtorch_adamw({ref[0], ref[1]}, {ref[2]}, 0.95);
  for (int s = 0; s < 5; ++s) {
    for (size_t i = 0; i < ours.size(); ++i) {
      if (s == 2 && i == 1) {
        ours[i].mutable_grad() = torch::Tensor();
        ref[i].mutable_grad() = torch::Tensor();
        continue;
      }
      auto g = torch::randn(shapes[i], torch::kCUDA);
      ours[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    opt.step(1.0, s);
    lib->step();
  }
  for (size_t i = 0; i < ours.size(); ++i) {
    // The update moved the weight (five steps of lr 0.01 or 0.003)...
    EXPECT_GT((ours[i] - start[i]).abs().max().item<float>(), 1e-3f) << i;
    // ...to where libtorch's AdamW moved it, to float32's precision.
    EXPECT_TRUE(torch::allclose(ours[i], ref[i], 1e-5, 1e-6))
        << i << ": max difference "
        << (ours[i] - ref[i]).abs().max().item<float>();
  }
}

// step_on_device: the clipping factor and the skip come as device scalars.
// A step with grad_scale 4 equals the host's step on the gradients divided
// by 4 (an epsilon near the gradients' size keeps the update sensitive to
// their scale, as Adam otherwise is not); a step with found_inf 1 changes
// no weight and no moment, and uncount_step() puts the counts back, so
// the next step equals the host's next step. Skipped without a GPU or on
// libtorch 1.13.
TEST(Optimizers, StepOnDeviceClipsAndSkipsAsTheHostDoes) {
  if (!torch::cuda::is_available() || !compat::has_fused_adamw())
    GTEST_SKIP() << "no CUDA device, or no fused AdamW in this libtorch";
  torch::manual_seed(9);
  const std::vector<std::vector<int64_t>> shapes = {{64, 33}, {7}};
  std::vector<torch::Tensor> dev, host;
  for (const auto& shape : shapes) {
    auto t = torch::randn(shape, torch::kCUDA);
    dev.push_back(t.clone().requires_grad_(true));
    host.push_back(t.clone().requires_grad_(true));
  }
  const OptimizerOptions oo{
      .adam_beta1 = 0.9, .adam_beta2 = 0.95, .adam_eps = 1e-2};
  Optimizers a({{"a", {{"w0", dev[0]}}, 0.01, 0.1, false},
                {"b", {{"w1", dev[1]}}, 0.003, 0.0, false}},
               oo);
  Optimizers b({{"a", {{"w0", host[0]}}, 0.01, 0.1, false},
                {"b", {{"w1", host[1]}}, 0.003, 0.0, false}},
               oo);
  auto scalar = [](float v) {
    return torch::full({1}, v, torch::TensorOptions().device(torch::kCUDA));
  };
  auto set_grads = [&](float size) {
    for (size_t i = 0; i < dev.size(); ++i) {
      auto g = torch::randn(shapes[i], torch::kCUDA) * size;
      dev[i].mutable_grad() = g.clone();
      host[i].mutable_grad() = g.clone();
    }
  };
  // Step 1: clipped by 4; unclipped, w0 would have gone elsewhere.
  set_grads(0.04f);
  auto raw = host[0].detach().clone().requires_grad_(true);
  raw.mutable_grad() = host[0].grad().clone();
  Optimizers({{"a", {{"w0", raw}}, 0.01, 0.1, false}}, oo).step(1.0, 0);
  ASSERT_TRUE(a.can_step_on_device());
  a.step_on_device(1.0, scalar(4), scalar(0));
  for (auto& t : host)
    t.mutable_grad().mul_(0.25);
  b.step(1.0, 0);
  EXPECT_TRUE(torch::allclose(dev[0], host[0], 1e-5, 1e-6));
  EXPECT_GT((dev[0] - raw).abs().max().item<float>(), 1e-4f);
  // Step 2: not finite, skipped.
  const auto before = dev[0].detach().clone();
  set_grads(0.01f);
  dev[0].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  a.step_on_device(1.0, scalar(1), scalar(1));
  a.uncount_step();
  EXPECT_TRUE(torch::equal(dev[0].detach(), before));
  // Step 3: the host's second step.
  set_grads(0.01f);
  a.step_on_device(0.5, scalar(1), scalar(0));
  b.step(0.5, 1);
  for (size_t i = 0; i < dev.size(); ++i)
    EXPECT_TRUE(torch::allclose(dev[i], host[i], 1e-5, 1e-6))
        << i << ": max difference "
        << (dev[i] - host[i]).abs().max().item<float>();
  auto sa = a.state(), sb = b.state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(torch::allclose(
        sa[i].second.to(torch::kCPU), sb[i].second.to(torch::kCPU), 1e-5, 1e-7))
        << sa[i].first;
  EXPECT_FALSE(Optimizers({{"m", {{"w0", dev[0]}}, 0.02, 0.0, true}})
                   .can_step_on_device()); // Muon: the host decides
}

TEST(Optimizers, StateRoundTripsAndContinuesIdentically) {
  torch::manual_seed(2);
  auto make = [](torch::Tensor w, torch::Tensor e) {
    return Optimizers(
        {{"matrices", {{"w", w}}, 0.02, 0.0, true},
         {"embedding", {{"e", e}}, 0.01, 0.0, false}});
  };
  auto w1 = torch::randn({8, 4}).requires_grad_(true);
  auto e1 = torch::randn({5, 4}).requires_grad_(true);
  auto w2 = w1.detach().clone().requires_grad_(true);
  auto e2 = e1.detach().clone().requires_grad_(true);
  auto grads = std::vector<torch::Tensor>{};
  for (int i = 0; i < 6; ++i)
    grads.push_back(torch::randn({8, 4})),
        grads.push_back(torch::randn({5, 4}));
  Optimizers o1 = make(w1, e1), o2 = make(w2, e2);
  for (int s = 0; s < 3; ++s) {
    w1.mutable_grad() = grads[2 * s].clone();
    e1.mutable_grad() = grads[2 * s + 1].clone();
    o1.step(1.0, s);
  }
  // o2 gets o1's weights and state, then both take the same steps.
  {
    torch::NoGradGuard ng;
    w2.copy_(w1);
    e2.copy_(e1);
  }
  std::map<std::string, torch::Tensor> saved;
  for (auto& [k, v] : o1.state())
    saved[k] = v.clone();
  EXPECT_TRUE(saved.count("w.momentum_buffer"));
  EXPECT_TRUE(saved.count("e.exp_avg_sq"));
  o2.load(saved);
  for (int s = 3; s < 6; ++s) {
    w1.mutable_grad() = grads[2 * s].clone();
    e1.mutable_grad() = grads[2 * s + 1].clone();
    w2.mutable_grad() = grads[2 * s].clone();
    e2.mutable_grad() = grads[2 * s + 1].clone();
    o1.step(1.0, s);
    o2.step(1.0, s);
  }
  EXPECT_TRUE(torch::equal(w1, w2));
  EXPECT_TRUE(torch::equal(e1, e2));
}

TEST(Optimizers, StateFromTheOtherOptimizerIsAClearError) {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  Optimizers muon({{"m", {{"w", w}}, 0.02, 0.0, true}});
  Optimizers adam({{"m", {{"w", w}}, 0.02, 0.0, false}});
  w.mutable_grad() = torch::ones({4, 4});
  adam.step(1.0, 0);
  std::map<std::string, torch::Tensor> saved;
  for (auto& [k, v] : adam.state())
    saved[k] = v;
  try {
    muon.load(saved);
    FAIL() << "loaded AdamW state into Muon";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("written by AdamW"), std::string::npos)
        << e.what();
  }
}

TEST(Optimizers, DescribeNamesEachGroup) {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  auto e = torch::randn({4, 4}).requires_grad_(true);
  Optimizers o(
      {{"matrices", {{"w", w}}, 0.02, 0.0, true},
       {"embedding", {{"e", e}}, 0.3, 0.0, false}});
  EXPECT_EQ(o.describe(), "Muon (matrices lr 0.02) + AdamW (embedding lr 0.3)");
}

} // namespace
} // namespace orchard::train
