// The precision policy per device, float16 loss scaling, and autocast: the
// guard switches matrix products to the low precision and back, and a
// model under it agrees with float32 within bfloat16's accuracy.
#include "train/precision.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "models/gpt.h"

#include "test_util.h"

#include <gtest/gtest.h>

namespace orchard::train {
namespace {

using test::device_of;

TEST(Precision, AutoIsBfloat16OnModernGpusAndFloat32Elsewhere) {
  EXPECT_EQ(
      resolve_precision("auto", device_of("cuda", 90)).compute,
      torch::kBFloat16);
  EXPECT_EQ(
      resolve_precision("auto", device_of("cuda", 80)).compute,
      torch::kBFloat16);
  EXPECT_EQ(
      resolve_precision("auto", device_of("cuda", 0)).compute,
      torch::kBFloat16);
  auto volta = resolve_precision("auto", device_of("cuda", 70));
  EXPECT_EQ(volta.compute, torch::kFloat32);
  EXPECT_NE(volta.why.find("float16"), std::string::npos) << volta.why;
  EXPECT_EQ(
      resolve_precision("auto", device_of("mps")).compute, torch::kFloat32);
  EXPECT_EQ(
      resolve_precision("auto", device_of("cpu")).compute, torch::kFloat32);
  EXPECT_FALSE(resolve_precision("auto", device_of("cuda", 90)).loss_scaling);
}

TEST(Precision, ExplicitChoicesAndWhatEachDeviceRefuses) {
  auto f16 = resolve_precision("float16", device_of("cuda", 70));
  EXPECT_EQ(f16.compute, torch::kFloat16);
  EXPECT_TRUE(f16.loss_scaling);
  EXPECT_EQ(
      resolve_precision("bfloat16", device_of("cpu")).compute,
      torch::kBFloat16);
  EXPECT_EQ(
      resolve_precision("float32", device_of("cuda", 90)).compute,
      torch::kFloat32);
  if (!compat::kTorch2) { // 1.13: no CPU float16 and no MPS autocast
    try {
      resolve_precision("float16", device_of("cpu"));
      FAIL();
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("dtype=bfloat16"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(resolve_precision("bfloat16", device_of("mps")), UserError);
  }
  EXPECT_THROW(resolve_precision("float64", device_of("cpu")), UserError);
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScaler s(true);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 32768.0);
  for (int64_t i = 0; i < LossScaler::kGrowthInterval - 1; ++i)
    EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 65536.0);
  LossScaler t(true);
  t.load(s.state());
  EXPECT_EQ(t.scale(), 65536.0);
  LossScaler off(false);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_FALSE(off.update(false)); // a non-finite step is still skipped
}

TEST(Autocast, GuardSwitchesMatmulsToBfloat16AndRestores) {
  auto a = torch::randn({8, 8}), b = torch::randn({8, 8});
  {
    compat::AutocastGuard g(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    {
      compat::AutocastGuard nested(torch::kCPU, torch::kBFloat16);
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
  compat::AutocastGuard off(torch::kCPU, torch::kFloat32);
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
}

TEST(Autocast, GptLossAndGradientsAgreeWithFloat32) {
  models::GptConfig c;
  c.vocab_size = 64;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = c.n_kv_head = 2;
  c.max_seq_len = 16;
  torch::manual_seed(3);
  models::Gpt model(c);
  {
    torch::NoGradGuard ng; // non-zero output layers, so every gradient flows
    for (auto& p : model->parameters())
      if (p.abs().sum().item<double>() == 0)
        p.normal_(0, 0.02);
  }
  auto x = torch::randint(0, 64, {2, 16}), y = torch::randint(0, 64, {2, 16});
  auto grads_of = [&](torch::ScalarType dt) {
    for (auto& p : model->parameters())
      p.mutable_grad() = torch::Tensor();
    torch::Tensor loss;
    {
      compat::AutocastGuard g(torch::kCPU, dt);
      loss = model->loss(x, y);
    }
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    loss.backward();
    std::vector<torch::Tensor> g{loss.detach()};
    for (auto& p : model->parameters())
      g.push_back(p.grad().clone());
    return g;
  };
  auto f32 = grads_of(torch::kFloat32), bf16 = grads_of(torch::kBFloat16);
  // bfloat16 keeps 8 bits of mantissa: relative error around 2^-8 per
  // product, a few times that after a network.
  EXPECT_NEAR(bf16[0].item<double>(), f32[0].item<double>(), 0.02);
  for (size_t i = 1; i < f32.size(); ++i) {
    double rel = (bf16[i] - f32[i]).norm().item<double>() /
        (f32[i].norm().item<double>() + 1e-12);
    EXPECT_LT(rel, 0.1) << "parameter " << i;
    EXPECT_EQ(bf16[i].scalar_type(), torch::kFloat32); // master weights
  }
}

} // namespace
} // namespace orchard::train

namespace orchard::train {
namespace {

// On a CUDA build with a GPU: the same guard on CUDA tensors, bf16 and fp16.
TEST(AutocastCuda, GuardSwitchesCudaMatmuls) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device";
  auto a = torch::randn({8, 8}, torch::kCUDA),
       b = torch::randn({8, 8}, torch::kCUDA);
  for (auto dt : {torch::kBFloat16, torch::kFloat16}) {
    compat::AutocastGuard g(torch::kCUDA, dt);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), dt);
    // CPU tensors are untouched by CUDA autocast.
    EXPECT_EQ(torch::matmul(a.cpu(), b.cpu()).scalar_type(), torch::kFloat32);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
}

} // namespace
} // namespace orchard::train
