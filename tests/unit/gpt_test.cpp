// The GPT: sizes from depth, gradients against float64 finite differences,
// overfitting one batch, fused vs explicit attention, KV cache, seeding.
#include "models/gpt.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "models/lora.h"
#include "ops/fused_train.h"
#include "train/pretrain_config.h"

#include <gtest/gtest.h>

namespace orchard::models {
namespace {

GptConfig tiny(int64_t kv_heads = 1) {
  GptConfig c;
  c.vocab_size = 11;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 2;
  c.n_kv_head = kv_heads;
  c.max_seq_len = 8;
  return c;
}

TEST(Gpt, SizesFromDepth) {
  PretrainConfig p;
  p.depth = 6;
  GptConfig c = resolve_gpt_config(p, 32768);
  EXPECT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.n_embd, 384);
  EXPECT_EQ(c.n_head, 3);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.n_kv_head, 3);
  EXPECT_EQ(c.vocab_size, 32768);
  EXPECT_EQ(c.tag(), "d6");
  p.depth = 1;
  EXPECT_EQ(resolve_gpt_config(p, 100).n_head, 1);
  p.arch.n_embd = 100;
  p.arch.n_head = 3;
  EXPECT_THROW(resolve_gpt_config(p, 100), UserError); // not divisible
  p.arch.n_head = 2;
  p.arch.n_kv_head = 3;
  EXPECT_THROW(resolve_gpt_config(p, 100), UserError); // kv heads
  p.arch.n_kv_head.reset();
  p.arch.vocab_size = 50;
  EXPECT_THROW(resolve_gpt_config(p, 100), UserError); // smaller vocab
}

TEST(Gpt, ParameterCount) {
  GptConfig c = tiny();
  Gpt m(c);
  const int64_t C = 16, V = 11, L = 2, kv = 1 * 8;
  int64_t per_layer = C * C + 2 * C * kv + C * C + 2 * 4 * C * C;
  EXPECT_EQ(m->num_parameters(), V * C + L * per_layer + C * V);
}

// Autograd against central differences in float64, on a model whose zero
// initialisations are replaced by random weights (so every path carries
// gradient), with grouped-query attention and an ignored target.
TEST(Gpt, GradientsMatchFiniteDifferences) {
  torch::manual_seed(0);
  Gpt m(tiny(1));
  m->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters())
      p.normal_(0.0, 0.5);
  }
  auto idx = torch::randint(0, 11, {2, 6}, torch::kLong);
  auto targets = torch::randint(0, 11, {2, 6}, torch::kLong);
  targets[0][3] = -1;
  auto loss = m->loss(idx, targets);
  loss.backward();
  const double h = 1e-6;
  int checked = 0;
  for (auto& named : m->named_parameters()) {
    auto p = named.value();
    auto flat = p.data().view({-1});
    auto grad = p.grad().view({-1});
    for (int k = 0; k < 4; ++k) {
      int64_t i = (k * 7919) % flat.numel();
      double orig = flat[i].item<double>();
      torch::NoGradGuard g;
      flat[i] = orig + h;
      double up = m->loss(idx, targets).item<double>();
      flat[i] = orig - h;
      double down = m->loss(idx, targets).item<double>();
      flat[i] = orig;
      double numeric = (up - down) / (2 * h);
      double analytic = grad[i].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << named.key() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 40);
}

// loss() (the chunked soft-capped cross-entropy) is the cross-entropy of
// forward()'s logits, in value and in every weight's gradient.
TEST(Gpt, LossIsTheCrossEntropyOfTheLogits) {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
    Gpt m(tiny(2));
    m->to(dtype);
    {
      torch::NoGradGuard g;
      for (auto& p : m->parameters())
        p.normal_(0.0, 1.0); // logits of several units: the cap bends them
    }
    auto idx = torch::randint(0, 11, {3, 8}, torch::kLong);
    auto targets = torch::randint(0, 11, {3, 8}, torch::kLong);
    targets[1][2] = -1;
    auto logits = m->forward(idx);
    auto want = torch::nn::functional::cross_entropy(
        logits.view({-1, 11}),
        targets.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
    want.backward();
    std::map<std::string, torch::Tensor> grads;
    for (auto& p : m->named_parameters()) {
      grads[p.key()] = p.value().grad().clone();
      p.value().mutable_grad() = torch::Tensor();
    }
    auto got = m->loss(idx, targets);
    EXPECT_NEAR(got.item<double>(), want.item<double>(), tol);
    got.backward();
    for (auto& p : m->named_parameters())
      EXPECT_TRUE(
          torch::allclose(p.value().grad(), grads.at(p.key()), tol, tol))
          << p.key() << " " << dtype << ": max diff "
          << (p.value().grad() - grads.at(p.key())).abs().max().item<double>();
  }
}

TEST(Gpt, OverfitsOneBatch) {
  torch::manual_seed(1);
  Gpt m(tiny(2));
  auto idx = torch::randint(0, 11, {2, 8}, torch::kLong);
  auto targets = torch::randint(0, 11, {2, 8}, torch::kLong);
  torch::optim::AdamW opt(
      m->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0));
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    auto loss = m->loss(idx, targets);
    if (step == 0)
      first = loss.item<double>();
    last = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_NEAR(first, std::log(11.0), 1e-3); // zero lm_head: uniform logits
  EXPECT_LT(last, 0.05);
}

// LoRA wraps the GPT's projections as it wraps a Hugging Face model's
// (models/lora_linear.h): a zero B changes nothing, trained A and B give
// exactly the model whose weights are W + (alpha / r) B A (computed here in
// float64), only the adapters train, and they are saved under PEFT's keys
// with the GPT's module paths.
TEST(Gpt, LoraWrapsItsProjections) {
  torch::manual_seed(7);
  const GptConfig c = tiny(1);
  Gpt m(c);
  m->to(torch::kFloat64);
  {
    torch::NoGradGuard g; // nonzero everywhere, so every path counts
    for (auto& p : m->parameters())
      p.normal_(0.0, 0.3);
  }
  auto idx = torch::randint(0, c.vocab_size, {2, 8});
  auto before = m->forward(idx);
  LoraSpec spec;
  spec.r = 2;
  spec.alpha = 4;
  spec.target_modules = {"c_q", "c_v", "c_fc", "c_proj"}; // c_proj: both
  EXPECT_EQ(m->add_lora(spec, torch::kFloat64), 5 * c.n_layer);
  // Equal up to rounding: without adapters q, k and v come from one
  // stacked product and the CPU's fused rotary + QK-norm, with them from
  // three products and the plain ops.
  EXPECT_LT((m->forward(idx) - before).abs().max().item<double>(), 1e-12);
  int64_t trainable = 0;
  for (const auto& p : m->named_parameters())
    if (p.value().requires_grad()) {
      ++trainable;
      EXPECT_NE(p.key().find(".lora_"), std::string::npos) << p.key();
    }
  EXPECT_EQ(trainable, 2 * 5 * c.n_layer);

  Gpt merged(c);
  merged->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    auto from = m->named_parameters();
    for (auto& p : merged->named_parameters())
      p.value().copy_(from[p.key()]);
    auto target = merged->projections();
    auto adapted = m->projections();
    for (size_t i = 0; i < adapted.size(); ++i) {
      auto& proj = adapted[i].second;
      if (!proj->has_lora())
        continue;
      proj->lora_B->weight.normal_(0.0, 0.5);
      target[i].second->weight.copy_(
          proj->weight +
          2.0 * torch::matmul(proj->lora_B->weight, proj->lora_A->weight));
    }
  }
  auto got = m->forward(idx), want = merged->forward(idx);
  EXPECT_GT((got - before).abs().max().item<double>(), 1e-3);
  EXPECT_TRUE(torch::allclose(got, want, 1e-10, 1e-10))
      << (got - want).abs().max().item<double>();

  auto saved = adapter_tensors(m);
  ASSERT_EQ(saved.size(), size_t(2 * 5 * c.n_layer));
  EXPECT_EQ(saved[0].first, "base_model.model.blocks.0.attn.c_q.lora_A.weight");
  // A name none of the GPT's projections has: refused, naming it.
  Gpt other(c);
  LoraSpec llama_names;
  llama_names.target_modules = {"q_proj"};
  EXPECT_THROW(other->add_lora(llama_names, torch::kFloat32), UserError);
}

TEST(Gpt, KvCacheGivesTheSameLogits) {
  torch::manual_seed(3);
  Gpt m(tiny(1));
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters())
      p.normal_(0.0, 0.3);
  }
  torch::NoGradGuard g;
  auto idx = torch::randint(0, 11, {1, 8}, torch::kLong);
  auto full = m->forward(idx);
  KvCache cache;
  auto prefill = m->forward(idx.narrow(1, 0, 5), &cache);
  EXPECT_EQ(cache.length(), 5);
  std::vector<torch::Tensor> parts = {prefill};
  for (int64_t t = 5; t < 8; ++t)
    parts.push_back(m->forward(idx.narrow(1, t, 1), &cache));
  auto incremental = torch::cat(parts, 1);
  EXPECT_TRUE(torch::allclose(incremental, full, 1e-4, 1e-5))
      << (incremental - full).abs().max().item<double>();
  EXPECT_THROW(
      m->forward(idx.narrow(1, 0, 1), &cache), UserError); // past max_seq_len
}

TEST(Gpt, InitialisationFollowsTheSeed) {
  torch::manual_seed(7);
  Gpt a(tiny());
  torch::manual_seed(7);
  Gpt b(tiny());
  torch::manual_seed(8);
  Gpt c(tiny());
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i]));
    any_differs |= !torch::equal(pa[i], pc[i]);
  }
  EXPECT_TRUE(any_differs);
  // Zero-initialised projections, as nanochat does.
  EXPECT_EQ(a->lm_head->weight.abs().sum().item<double>(), 0.0);
}

} // namespace
} // namespace orchard::models

namespace orchard::models {
namespace {

// A model of config c in `dtype` whose zero-initialised layers (the
// projections back to the residual, the head) get weights too.
Gpt perturbed(const GptConfig& c, torch::ScalarType dtype) {
  torch::manual_seed(11);
  Gpt m(c);
  m->to(dtype);
  torch::NoGradGuard ng;
  for (auto& p : m->parameters())
    p.add_(torch::randn_like(p) * 0.1);
  return m;
}

// A second model of config c holding `from`'s weights.
Gpt twin(const Gpt& from, const GptConfig& c, torch::ScalarType dtype) {
  Gpt m(c);
  m->to(dtype);
  torch::NoGradGuard ng;
  auto a = from->parameters(), b = m->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    b[i].copy_(a[i]);
  return m;
}

// The loss of one batch, under bfloat16 autocast on the CPU or not, and
// its backward.
double loss_and_backward(
    Gpt& m,
    const torch::Tensor& x,
    const torch::Tensor& y,
    bool bf16) {
  torch::Tensor loss;
  {
    compat::AutocastGuard g(
        torch::kCPU, bf16 ? torch::kBFloat16 : torch::kFloat32);
    loss = m->loss(x, y);
  }
  loss.backward();
  return loss.item<double>();
}

// Every parameter of b has a gradient within tol of a's.
void expect_same_gradients(const Gpt& a, const Gpt& b, double tol) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i].value().grad().defined()) << pa[i].key();
    EXPECT_TRUE(
        torch::allclose(pa[i].value().grad(), pb[i].value().grad(), tol, tol))
        << pa[i].key() << ": largest difference "
        << (pa[i].value().grad() - pb[i].value().grad())
               .abs()
               .max()
               .item<double>();
  }
}

// Checkpointed blocks give the same loss and the same gradient of every
// parameter as the plain forward (float64: equal to rounding), also under
// bfloat16 autocast, where the recomputation must re-enter autocast.
TEST(Gpt, GradientCheckpointingGivesTheSameGradients) {
  for (bool bf16 : {false, true}) {
    auto c = tiny(1);
    auto dtype = bf16 ? torch::kFloat32 : torch::kFloat64;
    Gpt plain = perturbed(c, dtype);
    c.gradient_checkpointing = true;
    Gpt ckpt = twin(plain, c, dtype);
    auto x = torch::randint(0, 11, {3, 8}), y = torch::randint(0, 11, {3, 8});
    double l1 = loss_and_backward(plain, x, y, bf16);
    double l2 = loss_and_backward(ckpt, x, y, bf16);
    EXPECT_DOUBLE_EQ(l1, l2) << "bf16 " << bf16;
    expect_same_gradients(plain, ckpt, bf16 ? 1e-6 : 1e-12);
  }
}

// In training q, k and v come from one product over the three weights
// concatenated: the same loss and the same gradient of each of the three
// (and of everything else) as three products, in float64 to rounding and
// under bfloat16 autocast to bfloat16's rounding; with grouped-query
// attention (2 query heads, 1 key/value head), so the three differ in
// size.
TEST(Gpt, OneQkvProductTrainsAsThreeProducts) {
  for (bool bf16 : {false, true}) {
    auto c = tiny(1);
    auto dtype = bf16 ? torch::kFloat32 : torch::kFloat64;
    Gpt merged = perturbed(c, dtype);
    Gpt three = twin(merged, c, dtype);
    for (auto& b : *three->blocks)
      b->as<BlockImpl>()->attn->merge_qkv_in_training = false;
    auto x = torch::randint(0, 11, {3, 8}), y = torch::randint(0, 11, {3, 8});
    double l1 = loss_and_backward(merged, x, y, bf16);
    double l2 = loss_and_backward(three, x, y, bf16);
    EXPECT_NEAR(l1, l2, bf16 ? 1e-3 : 1e-12) << "bf16 " << bf16;
    expect_same_gradients(merged, three, bf16 ? 2e-2 : 1e-12);
  }
}

// On CUDA the step runs the fused kernels (ops/fused_train.h: one q/k/v
// product with rotary and QK-norm, ReLU squared, each residual add with
// the norm after it): in float32 the same loss and gradients as the plain
// ops on the CPU, to float32 rounding; under bfloat16 autocast to
// bfloat16's. Heads of 128 and a width of 256, which the kernels take;
// grouped-query attention.
TEST(Gpt, FusedCudaKernelsTrainAsThePlainOps) {
  const auto probe = torch::cuda::is_available()
      ? torch::ones({128}, torch::Device(torch::kCUDA, 0))
      : torch::Tensor();
  if (!probe.defined() ||
      !ops::residual_add_rms_norm_is_fused(probe, probe, torch::kFloat32))
    GTEST_SKIP() << "SKIPPED: no CUDA device, or built without the CUDA "
                    "kernels (ORCHARD_CUDA)";
  GptConfig c;
  c.vocab_size = 300;
  c.n_layer = 2;
  c.n_embd = 256;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.max_seq_len = 24;
  const torch::Device cuda(torch::kCUDA, 0);
  for (bool bf16 : {false, true}) {
    Gpt cpu = perturbed(c, torch::kFloat32);
    Gpt gpu = twin(cpu, c, torch::kFloat32);
    gpu->to(cuda);
    auto x = torch::randint(0, 300, {3, 24}),
         y = torch::randint(0, 300, {3, 24});
    double want = loss_and_backward(cpu, x, y, bf16);
    torch::Tensor loss;
    {
      compat::AutocastGuard g(
          torch::kCUDA, bf16 ? torch::kBFloat16 : torch::kFloat32);
      loss = gpu->loss(x.to(cuda), y.to(cuda));
    }
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), want, bf16 ? 2e-2 : 1e-5)
        << "bf16 " << bf16;
    auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      const auto g = pg[i].value().grad().to(torch::kCPU);
      const auto w = pc[i].value().grad();
      const double rel =
          (g - w).norm().item<double>() / w.norm().item<double>();
      EXPECT_LT(rel, bf16 ? 3e-2 : 1e-4) << pc[i].key() << " bf16 " << bf16;
    }
  }
}
} // namespace
} // namespace orchard::models
