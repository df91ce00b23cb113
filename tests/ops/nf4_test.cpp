// 4-bit NF4 weights (models/nf4.h): the codes against a brute-force nearest
// level, the packing, the product and its input gradient against autograd
// on the expanded matrix, and a Llama loaded in 4 bits against the same
// model with its projections replaced by their expansion.
#include "ops/nf4.h"
#include "core/error.h"
#include "lora_test_util.h"
#include "models/hf/model.h"
#include "models/lora.h"
#include "ops/op_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace orchard {
namespace {

const std::string kHf = std::string(ORCHARD_FIXTURES) + "/hf";

using test::max_diff;

TEST(Nf4, LevelsAreTheSixteenAscendingFromMinusOneToOne) {
  const auto& l = ops::nf4_levels();
  ASSERT_EQ(l.size(), 16u);
  EXPECT_EQ(l.front(), -1.0f);
  EXPECT_EQ(l.back(), 1.0f);
  EXPECT_EQ(l[7], 0.0f);
  for (size_t i = 1; i < l.size(); ++i)
    EXPECT_LT(l[i - 1], l[i]);
}

TEST(Nf4, EachWeightBecomesTheNearestLevelTimesItsBlocksAbsmax) {
  torch::manual_seed(0);
  auto w = torch::randn({48, 96}) * 0.02;
  w.index_put_({3, 7}, 0.5); // an outlier sets its block's scale
  auto q = ops::quantize_nf4(w);
  EXPECT_EQ(q.codes.scalar_type(), torch::kUInt8);
  EXPECT_EQ(q.codes.numel(), w.numel() / 2);
  EXPECT_EQ(q.absmax.numel(), w.numel() / 64);
  auto deq = ops::dequantize_nf4(q);
  ASSERT_EQ(deq.sizes(), w.sizes());
  // Brute force in float64: per block, the level nearest to w / absmax.
  auto blocks = w.reshape({-1, 64}).to(torch::kFloat64);
  auto absmax = std::get<0>(blocks.abs().max(1, true));
  auto levels = torch::tensor(ops::nf4_levels()).to(torch::kFloat64);
  auto dist =
      (blocks.div(absmax).unsqueeze(-1) - levels.view({1, 1, 16})).abs();
  auto nearest = levels.index_select(0, dist.argmin(-1).reshape({-1}))
                     .view(blocks.sizes());
  auto want = (nearest * absmax).view(w.sizes());
  EXPECT_LT(max_diff(deq, want), 1e-6);
  EXPECT_LT(max_diff(q.absmax, absmax.view({-1})), 1e-7);
  // The outlier is represented exactly (it is its block's absmax).
  EXPECT_FLOAT_EQ(deq.index({3, 7}).item<float>(), 0.5f);
}

TEST(Nf4, TwoCodesAByteTheFirstInTheHighNibble) {
  // One block: the levels in order, then reversed, four times over.
  const auto& l = ops::nf4_levels();
  std::vector<float> v;
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 16; ++i)
      v.push_back(l[size_t(r == 0 ? i : 15 - i)]);
  auto w = torch::tensor(v).repeat({2}).view({1, 64});
  auto q = ops::quantize_nf4(w);
  EXPECT_EQ(q.codes[0].item<int>(), 0 * 16 + 1);
  EXPECT_EQ(q.codes[7].item<int>(), 14 * 16 + 15);
  EXPECT_EQ(q.codes[8].item<int>(), 15 * 16 + 14);
  EXPECT_TRUE(torch::equal(ops::dequantize_nf4(q), w));
}

TEST(Nf4, ProductAndInputGradientEqualTheExpandedMatrix) {
  torch::manual_seed(1);
  auto q = ops::quantize_nf4(torch::randn({32, 64}));
  auto x = torch::randn({5, 64}, torch::requires_grad());
  auto x2 = x.detach().clone().requires_grad_(true);
  auto y = ops::nf4_linear(x, q);
  auto w = ops::dequantize_nf4(q);
  auto y2 = at::mm(x2, w.t());
  EXPECT_LT(max_diff(y, y2), 1e-6);
  auto g = torch::randn({5, 32});
  y.backward(g);
  y2.backward(g);
  EXPECT_LT(max_diff(x.grad(), x2.grad()), 1e-6);
}

TEST(Nf4, BadShapesAreClearErrors) {
  EXPECT_THROW(ops::quantize_nf4(torch::randn({3, 5})), UserError);
  EXPECT_THROW(ops::quantize_nf4(torch::randn({64})), UserError);
}

TEST(Nf4, AFourBitLlamaEqualsItsExpandedProjectionsAndTrainsAdapters) {
  models::LoadOptions four;
  four.load_in_4bit = true;
  auto q = models::load_hf_model(kHf + "/llama", four);
  auto ref = models::load_hf_model(kHf + "/llama", {});
  int64_t quantised = 0;
  {
    torch::NoGradGuard no_grad;
    auto qp = q->projections();
    auto rp = ref->projections();
    for (size_t i = 0; i < qp.size(); ++i) {
      ASSERT_TRUE(qp[i].second->q4.defined()) << qp[i].first;
      EXPECT_EQ(qp[i].second->weight.numel(), 0) << qp[i].first;
      // The reference gets the same values in full precision.
      rp[i].second->weight.copy_(qp[i].second->full_weight());
      ++quantised;
    }
  }
  EXPECT_EQ(quantised, 7 * q->config.num_hidden_layers);
  auto ids = torch::randint(q->config.vocab_size, {2, 12});
  q->eval();
  ref->eval();
  {
    torch::NoGradGuard no_grad;
    EXPECT_LT(max_diff(q->forward(ids), ref->forward(ids)), 1e-5);
  }
  // LoRA on the 4-bit base, with checkpointing: the adapters' gradients
  // equal the full-precision twin's.
  auto grads = [&](models::Llama& m, bool ckpt) {
    models::LoraSpec spec;
    spec.r = 2;
    test::add_random_lora(m, spec, torch::kFloat32, 3);
    m->gradient_checkpointing = ckpt;
    m->train();
    m->loss(ids, ids).backward();
    return test::adapter_grads(m);
  };
  auto gq = grads(q, true), gr = grads(ref, false);
  ASSERT_EQ(gq.size(), gr.size());
  for (size_t i = 0; i < gq.size(); ++i)
    EXPECT_LT(max_diff(gq[i], gr[i]), 1e-5) << i;
}

} // namespace
} // namespace orchard
