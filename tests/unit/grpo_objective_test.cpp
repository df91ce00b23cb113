// GRPO's advantages and loss (stages/grpo/objective.h) against a plain
// computation written here in loops over doubles from TRL's formulas
// (grpo_trainer.py: _generate_and_score_completions and _compute_loss),
// for every loss_type, scale_rewards, importance level, beta 0 and > 0,
// clipping on and off, padded and masked (truncated) completions.
#include "core/error.h"
#include "stages/grpo/objective.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace orchard::grpo {
namespace {

using Rows = std::vector<std::vector<double>>;

Rows rows_of(const torch::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  Rows r(size_t(c.size(0)), std::vector<double>(size_t(c.size(1))));
  for (int64_t b = 0; b < c.size(0); ++b)
    for (int64_t i = 0; i < c.size(1); ++i)
      r[size_t(b)][size_t(i)] = c[b][i].item<double>();
  return r;
}

std::vector<double> advantages_by_hand(
    const std::vector<double>& r,
    size_t G,
    ScaleRewards scale) {
  auto mean_std = [](const std::vector<double>& v, size_t from, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i)
      m += v[from + i];
    m /= double(n);
    double s = 0;
    for (size_t i = 0; i < n; ++i)
      s += (v[from + i] - m) * (v[from + i] - m);
    return std::pair{m, n > 1 ? std::sqrt(s / double(n - 1)) : 0.0};
  };
  const auto [batch_mean, batch_std] = mean_std(r, 0, r.size());
  (void)batch_mean;
  std::vector<double> a(r.size());
  for (size_t g = 0; g < r.size() / G; ++g) {
    const auto [m, s] = mean_std(r, g * G, G);
    for (size_t i = g * G; i < (g + 1) * G; ++i) {
      a[i] = r[i] - m;
      if (scale == ScaleRewards::group)
        a[i] /= s + 1e-4;
      else if (scale == ScaleRewards::batch)
        a[i] /= batch_std + 1e-4;
    }
  }
  return a;
}

double loss_by_hand(
    const Rows& logp,
    const Rows& old,
    const Rows& ref,
    const std::vector<double>& A,
    const Rows& mask,
    const LossOptions& o) {
  const size_t B = logp.size(), T = logp[0].size();
  double total = 0, active = 0, mean_of_seqs = 0;
  for (size_t b = 0; b < B; ++b) {
    double seq_log = 0, n = 0;
    for (size_t t = 0; t < T; ++t) {
      seq_log += mask[b][t] * (logp[b][t] - old[b][t]);
      n += mask[b][t];
    }
    seq_log /= std::max(n, 1.0);
    double seq_sum = 0;
    for (size_t t = 0; t < T; ++t) {
      const double lr = o.level == ImportanceLevel::token ? logp[b][t] - old[b][t] : seq_log;
      const double ratio = std::exp(lr);
      const double clipped = std::clamp(ratio, 1 - o.epsilon_low, 1 + o.epsilon_high);
      const double unclipped = o.delta ? std::min(ratio, *o.delta) : ratio;
      double l = -std::min(unclipped * A[b], clipped * A[b]);
      if (o.beta != 0) {
        const double d = ref[b][t] - logp[b][t];
        l += o.beta * (std::exp(d) - d - 1);
      }
      seq_sum += mask[b][t] * l;
    }
    total += seq_sum;
    active += n;
    mean_of_seqs += seq_sum / std::max(n, 1.0);
  }
  switch (o.type) {
    case LossType::grpo:
      return mean_of_seqs / double(B) / double(o.accumulation_steps);
    case LossType::bnpo:
      return total / std::max(active, 1.0) / double(o.accumulation_steps);
    case LossType::dr_grpo:
      return total / double(B * size_t(o.max_completion_length)) /
          double(o.accumulation_steps);
    case LossType::dapo:
      return total / std::max(o.generation_batch_tokens, 1.0);
  }
  return 0;
}

TEST(GrpoObjective, AdvantagesAreTrlsGroupNormalisation) {
  // Groups of 4: one varied, one with equal rewards (std 0), one mixed.
  const std::vector<double> r = {1.0, 0.0, 0.5, 0.25, 0.7, 0.7, 0.7, 0.7, 2.0, -1.0, 0.0, 0.0};
  auto t = torch::tensor(r, torch::kFloat64);
  for (auto scale : {ScaleRewards::group, ScaleRewards::batch, ScaleRewards::none}) {
    auto got = group_advantages(t, 4, scale);
    auto want = advantages_by_hand(r, 4, scale);
    for (size_t i = 0; i < r.size(); ++i)
      EXPECT_NEAR(got.values[int64_t(i)].item<double>(), want[i], 1e-5) << i;
  }
  // The equal group's advantages are 0 and its std is flagged.
  auto g = group_advantages(t, 4, ScaleRewards::group);
  for (int64_t i = 4; i < 8; ++i) {
    EXPECT_EQ(g.values[i].item<double>(), 0.0);
    EXPECT_TRUE(g.std_zero[i].item<bool>());
  }
  EXPECT_FALSE(g.std_zero[0].item<bool>());
  // One generation per prompt: std 0, advantage 0 (TRL's G = 1 case).
  auto single = group_advantages(torch::tensor({0.3, 0.9}), 1, ScaleRewards::group);
  EXPECT_EQ(single.values.abs().sum().item<double>(), 0.0);
  EXPECT_THROW(group_advantages(t, 5, ScaleRewards::group), std::invalid_argument);
}

TEST(GrpoObjective, LossMatchesTrlsFormulasForEveryType) {
  torch::manual_seed(3);
  const int64_t B = 6, T = 7, G = 3;
  auto logp = (-torch::rand({B, T}, torch::kFloat64) * 3).requires_grad_(true);
  // Old log-probabilities near the current ones (ratios near 1: no clip)
  // and far from them (ratios beyond 1 +- 0.2: clipping active).
  auto near = logp.detach() + torch::randn({B, T}, torch::kFloat64) * 0.01;
  auto far = logp.detach() + torch::randn({B, T}, torch::kFloat64) * 0.6;
  auto ref = logp.detach() + torch::randn({B, T}, torch::kFloat64) * 0.3;
  // Completions of different lengths (padding), and row 4 truncated and
  // masked whole (mask_truncated_completions).
  auto mask = torch::ones({B, T}, torch::kFloat64);
  mask.index_put_({0, torch::indexing::Slice(5)}, 0);
  mask.index_put_({2, torch::indexing::Slice(2)}, 0);
  mask.index_put_({4}, 0);
  // The advantages by hand (group_advantages, in float32, is checked
  // above): the loss is then compared in float64 throughout.
  const auto hand_A = advantages_by_hand({1.0, 0.0, 0.3, 0.9, 0.9, 0.1}, G, ScaleRewards::group);
  auto A = torch::tensor(hand_A, torch::kFloat64);
  int checked = 0;
  for (auto type : {LossType::grpo, LossType::bnpo, LossType::dr_grpo, LossType::dapo})
    for (auto level : {ImportanceLevel::token, ImportanceLevel::sequence})
      for (double beta : {0.0, 0.04})
        for (bool clipping : {false, true})
          for (bool with_delta : {false, true}) {
            LossOptions o;
            o.type = type;
            o.level = level;
            o.beta = beta;
            o.epsilon_high = 0.28;
            if (with_delta)
              o.delta = 1.3;
            o.max_completion_length = 8;
            o.generation_batch_tokens = 61;
            o.accumulation_steps = 2;
            const auto& old = clipping ? far : near;
            auto parts = policy_loss(logp, old, ref, A, mask, o);
            const double want = loss_by_hand(
                rows_of(logp), rows_of(old), rows_of(ref), hand_A, rows_of(mask), o);
            EXPECT_NEAR(parts.loss.item<double>(), want, 1e-9 + 1e-6 * std::abs(want))
                << int(type) << " level " << int(level) << " beta " << beta
                << " clipping " << clipping << " delta " << with_delta;
            EXPECT_EQ(parts.kl.defined(), beta != 0);
            if (level == ImportanceLevel::token && !with_delta) {
              EXPECT_EQ(parts.clip_region.item<double>() > 0, clipping);
            }
            ++checked;
          }
  EXPECT_EQ(checked, 64);
}

TEST(GrpoObjective, WithoutOldLogpsTheRatioIsOneAndTheGradientIsTheAdvantage) {
  // num_iterations = 1: old = current (detached). The loss's gradient in a
  // token's log-probability is -A / (active tokens) under dapo (d ratio /
  // d logp = 1 at ratio 1), and 0 on masked tokens.
  auto logp = torch::tensor({{-1.0, -2.0, -0.5}, {-0.3, -0.7, -1.1}}, torch::kFloat64)
                  .requires_grad_(true);
  auto mask = torch::tensor({{1.0, 1.0, 0.0}, {1.0, 1.0, 1.0}}, torch::kFloat64);
  auto A = torch::tensor({0.5, -1.5}, torch::kFloat64);
  LossOptions o;
  o.generation_batch_tokens = 5;
  auto parts = policy_loss(logp, {}, {}, A, mask, o);
  EXPECT_NEAR(parts.loss.item<double>(), -(0.5 * 2 - 1.5 * 3) / 5, 1e-12);
  parts.loss.backward();
  auto g = logp.grad();
  EXPECT_NEAR(g[0][0].item<double>(), -0.5 / 5, 1e-12);
  EXPECT_NEAR(g[1][2].item<double>(), 1.5 / 5, 1e-12);
  EXPECT_EQ(g[0][2].item<double>(), 0.0);
  EXPECT_EQ(parts.clip_region.item<double>(), 0.0);
}

TEST(GrpoObjective, BadNamesAreUserErrorsNamingTheChoices) {
  EXPECT_EQ(parse_loss_type("dr_grpo"), LossType::dr_grpo);
  EXPECT_EQ(parse_scale_rewards("batch"), ScaleRewards::batch);
  EXPECT_EQ(parse_importance_level("sequence"), ImportanceLevel::sequence);
  try {
    parse_loss_type("ppo");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("loss_type=ppo"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("dapo"), std::string::npos);
  }
  EXPECT_THROW(parse_scale_rewards("std"), UserError);
  EXPECT_THROW(parse_importance_level("word"), UserError);
}

} // namespace
} // namespace orchard::grpo
