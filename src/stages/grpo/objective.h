// GRPO's objective as TRL computes it (trl/trainer/grpo_trainer.py, 1.x):
// group-relative advantages from rewards, and the clipped policy loss with
// an optional KL term, normalised per `loss_type`. Pure tensor arithmetic:
// it knows nothing of models, rollouts or rewards' meaning; the stage
// (src/stages/grpo) hands it log-probabilities and rewards.
//
// Dimension letters: B completions in a micro-batch, T completion positions
// (padded), G completions per prompt (num_generations).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

namespace orchard::grpo {

// scale_rewards: group (divide by each group's std), batch (by the whole
// batch's std), none (no division; advantages are r - group mean).
enum class ScaleRewards { group, batch, none };
// loss_type; dapo is TRL's default.
enum class LossType { grpo, bnpo, dr_grpo, dapo };
// importance_sampling_level: a ratio per token, or one per sequence (the
// mean log-ratio over its active tokens; GSPO).
enum class ImportanceLevel { token, sequence };

ScaleRewards parse_scale_rewards(const std::string& name);
LossType parse_loss_type(const std::string& name);
ImportanceLevel parse_importance_level(const std::string& name);

struct Advantages {
  torch::Tensor values;   // (B,) float32: (r - group mean) [/ (std + 1e-4)]
  torch::Tensor std_zero; // (B,) bool: the std used (or logged) is 0
};

// rewards (B,) with B a multiple of G, groups of G consecutive rows. The std
// has Bessel's correction (torch.std), as TRL's nanstd. G = 1 gives a std of
// 0 (TRL's case for a single generation).
Advantages group_advantages(
    const torch::Tensor& rewards,
    int64_t G,
    ScaleRewards scale);

struct LossOptions {
  LossType type = LossType::dapo;
  ImportanceLevel level = ImportanceLevel::token;
  double epsilon_low = 0.2;  // epsilon
  double epsilon_high = 0.2; // epsilon_high (defaults to epsilon)
  std::optional<double> delta; // upper bound on the unclipped ratio
  double beta = 0.0;           // KL coefficient
  int64_t max_completion_length = 256; // dr_grpo's denominator
  // dapo: the active completion tokens of the whole generation batch (all
  // micro-batches of the optimizer step): TRL's num_items_in_batch.
  double generation_batch_tokens = 1.0;
  // grpo, bnpo, dr_grpo divide each micro-batch's loss by this (TRL's
  // current_gradient_accumulation_steps); dapo does not.
  int64_t accumulation_steps = 1;
};

struct LossParts {
  torch::Tensor loss;        // scalar, differentiable in logps
  torch::Tensor policy_loss; // the loss before the accumulation division, detached
  // Means over active tokens (detached scalars), as TRL logs them.
  torch::Tensor kl;          // undefined with beta = 0
  torch::Tensor clip_low;    // ratio < 1 - eps_low where A < 0
  torch::Tensor clip_high;   // ratio > 1 + eps_high where A > 0
  torch::Tensor clip_region; // either
};

// logps (B, T): the policy's per-token log-probabilities of the completion
// tokens (with gradient); old_logps: the rollout policy's (undefined: equal
// to logps.detach(), the num_iterations = 1 case, ratio 1); ref_logps: the
// reference's (needed when beta != 0); advantages (B,); mask (B, T): 1 on
// active completion tokens (0 on padding and on masked truncated
// completions). Per token:
//   r = exp(log-ratio) (sequence level: exp of the masked mean log-ratio)
//   l = -min(min(r, delta) A, clip(r, 1 - eps_low, 1 + eps_high) A)
//       + beta (exp(ref - logp) - (ref - logp) - 1)
// then grpo: per-sequence masked mean, then the batch mean; bnpo: the sum
// over active tokens / their count; dr_grpo: the sum / (B
// max_completion_length); dapo: the sum / generation_batch_tokens.
LossParts policy_loss(
    const torch::Tensor& logps,
    const torch::Tensor& old_logps,
    const torch::Tensor& ref_logps,
    const torch::Tensor& advantages,
    const torch::Tensor& mask,
    const LossOptions& options);

} // namespace orchard::grpo
