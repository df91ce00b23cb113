// Orchard's tiny recursive model, its ACT loss and its optimizers against
// an independent PyTorch reference: tests/reference/trm_reference.py
// (written from the paper's equations, run once on a machine with PyTorch;
// its docstring says how), whose output is tests/fixtures/trm_reference.
// For three small models (the Sudoku variant with mlp_t and a padded
// two-position puzzle prefix, attention with rotary positions, attention
// with learned positions and no prefix) it checks three supervision steps
// that each start from the last one's carry: the first step's logits,
// Q-head, new carry, loss and every gradient, and the losses and every
// weight after each step's AdamATan2 + SignSGD update.
//
// The gradients are the check that only the last H-cycle has them: with
// gradients through the earlier cycles every weight's would differ.
//
// Everything runs in float64 on the CPU; the two implementations differ
// only in the order of their roundings (kTrmTol says what was seen).
#include "models/trm.h"
#include "reference_fixture.h"
#include "stages/trm/recursion.h"
#include "test_paths.h"
#include "train/optimizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

namespace orchard {
namespace {

using nlohmann::json;

const std::string kTrmDir = std::string(ORCHARD_FIXTURES) + "/trm_reference";

// On max |ours - reference| / max(1, max |ref|) (gradients: relative to
// their own largest entry). Seen: 5e-15 on libtorch 2.11 and 5e-14 on
// 1.13 (the fixtures were made with PyTorch 2.11); gradients through the
// earlier H-cycles move them by more than 1. The rotary tables are
// float32-valued in both (as Orchard stores them).
constexpr double kTrmTol = 1e-11;

using Reference = test::ReferenceFixture;
using test::scaled_diff;

Reference load_reference(const std::string& variant) {
  return test::load_reference_fixture(
      kTrmDir + "/" + variant + ".model.safetensors",
      kTrmDir + "/" + variant + ".reference.safetensors");
}

double gradient_diff(const torch::Tensor& a, const torch::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (a - want).abs().max().item<double>() / scale;
}

// Orchard's model in float64 with the fixture's weights and initial states.
models::Trm load_model(const Reference& ref) {
  models::Trm model(models::trm_config_from_json(ref.config.at("model")));
  model->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  size_t set = 0;
  auto copy = [&](const std::string& key, torch::Tensor t) {
    auto it = ref.weights.find(key);
    if (it == ref.weights.end()) {
      ADD_FAILURE() << "the fixture has no " << key;
      return;
    }
    EXPECT_EQ(t.sizes(), it->second.sizes()) << key;
    t.copy_(it->second);
    ++set;
  };
  for (auto& p : model->named_parameters())
    copy(p.key(), p.value());
  copy("H_init", model->H_init);
  copy("L_init", model->L_init);
  EXPECT_EQ(set, ref.weights.size()); // every fixture tensor used
  return model;
}

void check_variant(const std::string& variant) {
  SCOPED_TRACE(variant);
  const Reference ref = load_reference(variant);
  auto model = load_model(ref);
  model->train();
  const json& o = ref.config.at("optim");
  train::NamedTensors network, embeddings;
  for (const auto& p : model->named_parameters())
    (p.key() == "puzzle_emb" ? embeddings : network)
        .push_back({p.key(), p.value()});
  std::vector<train::ParamGroup> groups = {
      {.name = "network",
       .params = network,
       .lr = o.at("lr").get<double>(),
       .weight_decay = o.at("weight_decay").get<double>(),
       .rule = "adam_atan2"}};
  if (!embeddings.empty())
    groups.push_back(
        {.name = "puzzle_emb",
         .params = embeddings,
         .lr = o.at("puzzle_emb_lr").get<double>(),
         .weight_decay = o.at("puzzle_emb_weight_decay").get<double>(),
         .rule = "sign_sgd"});
  train::OptimizerOptions oo;
  oo.adam_beta1 = o.at("beta1").get<double>();
  oo.adam_beta2 = o.at("beta2").get<double>();
  train::Optimizers optimizers(std::move(groups), oo);

  const auto& inputs = ref.at("inputs");
  const auto& labels = ref.at("labels");
  const auto& ids = ref.at("puzzle_ids");
  const int64_t B = inputs.size(0);
  ASSERT_GT((labels == -100).sum().item<int64_t>(), 0); // ignored cells seen
  auto [z_H, z_L] = model->initial_carry(B);
  double worst = 0;
  std::string worst_at;
  auto see = [&](double d, const std::string& at) {
    if (d >= worst) {
      worst = d;
      worst_at = at;
    }
    return d;
  };
  const int64_t steps = ref.config.at("steps").get<int64_t>();
  for (int64_t k = 0; k < steps; ++k) {
    const std::string s = "step" + std::to_string(k);
    optimizers.zero_grad();
    auto out = model->step(z_H, z_L, inputs, ids);
    const auto loss = trm::act_loss(out, labels).loss / double(B);
    ASSERT_EQ(loss.scalar_type(), torch::kFloat64);
    EXPECT_LT(see(scaled_diff(loss, ref.at(s + ".loss")), s + ".loss"), kTrmTol)
        << loss.item<double>() << " vs " << ref.at(s + ".loss").item<double>();
    loss.backward();
    if (k == 0) {
      EXPECT_LT(
          see(scaled_diff(out.logits, ref.at("step0.logits")), "logits"),
          kTrmTol);
      EXPECT_LT(
          see(scaled_diff(out.q_halt, ref.at("step0.q_halt")), "q_halt"),
          kTrmTol);
      EXPECT_LT(
          see(scaled_diff(out.q_continue, ref.at("step0.q_continue")),
              "q_continue"),
          kTrmTol);
      EXPECT_LT(see(scaled_diff(out.z_H, ref.at("step0.z_H")), "z_H"), kTrmTol);
      EXPECT_LT(see(scaled_diff(out.z_L, ref.at("step0.z_L")), "z_L"), kTrmTol);
      for (const auto& p : model->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        const auto& want = ref.at("grad." + p.key());
        ASSERT_GT(want.abs().max().item<double>(), 0) << p.key();
        EXPECT_LT(
            see(gradient_diff(p.value().grad(), want), "grad." + p.key()),
            kTrmTol)
            << p.key();
      }
    }
    optimizers.step(1.0, k);
    z_H = out.z_H;
    z_L = out.z_L;
  }
  for (const auto& p : model->named_parameters()) {
    const auto& want = ref.at("final." + p.key());
    EXPECT_LT(see(scaled_diff(p.value(), want), "final." + p.key()), kTrmTol)
        << p.key();
    // Every weight moved (else a group left out of the update would pass).
    EXPECT_GT(scaled_diff(want, ref.weights.at(p.key())), 1e-4) << p.key();
  }
  std::printf(
      "[trm_reference] %s: max scaled diff %.2e (%s)\n",
      variant.c_str(),
      worst,
      worst_at.c_str());
}

TEST(TrmReference, SudokuVariantWithTokenMixingMlpMatchesPytorch) {
  check_variant("mlp_t");
}

TEST(TrmReference, AttentionWithRotaryPositionsMatchesPytorch) {
  check_variant("rope");
}

TEST(TrmReference, AttentionWithLearnedPositionsAndNoPrefixMatchesPytorch) {
  check_variant("learned");
}

} // namespace
} // namespace orchard
