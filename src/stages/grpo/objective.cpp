#include "stages/grpo/objective.h"

#include "core/error.h"

#include <stdexcept>

namespace orchard::grpo {

namespace {

[[noreturn]] void unknown(
    const std::string& key,
    const std::string& value,
    const std::string& choices) {
  throw UserError(
      key + "=" + value + " is not one of " + choices + ". Set " + key +
      " to one of them.");
}

// Mean of x over the active tokens of mask, detached (0 with none).
torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  return ((x * mask).sum() / mask.sum().clamp_min(1.0)).detach();
}

} // namespace

ScaleRewards parse_scale_rewards(const std::string& name) {
  if (name == "group" || name == "true")
    return ScaleRewards::group;
  if (name == "batch")
    return ScaleRewards::batch;
  if (name == "none" || name == "false")
    return ScaleRewards::none;
  unknown("scale_rewards", name, "group, batch, none");
}

LossType parse_loss_type(const std::string& name) {
  if (name == "grpo")
    return LossType::grpo;
  if (name == "bnpo")
    return LossType::bnpo;
  if (name == "dr_grpo")
    return LossType::dr_grpo;
  if (name == "dapo")
    return LossType::dapo;
  unknown("loss_type", name, "dapo, grpo, dr_grpo, bnpo");
}

ImportanceLevel parse_importance_level(const std::string& name) {
  if (name == "token")
    return ImportanceLevel::token;
  if (name == "sequence")
    return ImportanceLevel::sequence;
  unknown("importance_sampling_level", name, "token, sequence");
}

Advantages group_advantages(
    const torch::Tensor& rewards,
    int64_t G,
    ScaleRewards scale) {
  if (rewards.dim() != 1 || G < 1 || rewards.size(0) % G != 0)
    throw std::invalid_argument(
        "[group_advantages] rewards must be (B,) with B a multiple of G");
  const int64_t B = rewards.size(0);
  auto r = rewards.to(torch::kFloat32);
  auto groups = r.view({B / G, G});
  auto mean = groups.mean(1).repeat_interleave(G);
  torch::Tensor std;
  if (scale == ScaleRewards::batch)
    std = B > 1 ? r.std().expand({B}) : torch::zeros_like(r);
  else
    std = G > 1 ? groups.std(1).repeat_interleave(G) : torch::zeros_like(r);
  auto a = r - mean;
  if (scale != ScaleRewards::none)
    a = a / (std + 1e-4);
  return {a, std.eq(0)};
}

LossParts policy_loss(
    const torch::Tensor& logps,
    const torch::Tensor& old_logps,
    const torch::Tensor& ref_logps,
    const torch::Tensor& advantages,
    const torch::Tensor& mask_in,
    const LossOptions& o) {
  if (logps.dim() != 2 || mask_in.sizes() != logps.sizes() ||
      advantages.dim() != 1 || advantages.size(0) != logps.size(0))
    throw std::invalid_argument(
        "[policy_loss] logps and mask must be (B, T) and advantages (B,)");
  if (o.beta != 0.0 && !ref_logps.defined())
    throw std::invalid_argument("[policy_loss] beta != 0 needs ref_logps");
  const auto mask = mask_in.to(logps.scalar_type());
  const auto old = old_logps.defined() ? old_logps : logps.detach();
  const auto A = advantages.to(logps.scalar_type()).unsqueeze(1); // (B, 1)
  auto log_ratio = logps - old; // (B, T)
  torch::Tensor log_w = o.level == ImportanceLevel::token
      ? log_ratio
      : ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).unsqueeze(1);
  auto ratio = torch::exp(log_w); // (B, T) or (B, 1)
  auto clipped = torch::clamp(ratio, 1 - o.epsilon_low, 1 + o.epsilon_high);
  auto unclipped = o.delta ? torch::clamp_max(ratio, *o.delta) : ratio;
  auto per_token = -torch::min(unclipped * A, clipped * A);
  LossParts parts;
  if (o.beta != 0.0) {
    auto d = ref_logps - logps;
    auto kl = torch::exp(d) - d - 1;
    per_token = per_token + o.beta * kl;
    parts.kl = masked_mean(kl, mask);
  }
  per_token = per_token.expand_as(logps);
  const auto active = per_token * mask;
  torch::Tensor loss;
  double divide = 1.0;
  switch (o.type) {
    case LossType::grpo:
      loss = (active.sum(-1) / mask.sum(-1).clamp_min(1.0)).mean();
      divide = double(o.accumulation_steps);
      break;
    case LossType::bnpo:
      loss = active.sum() / mask.sum().clamp_min(1.0);
      divide = double(o.accumulation_steps);
      break;
    case LossType::dr_grpo:
      loss = active.sum() / double(logps.size(0) * o.max_completion_length);
      divide = double(o.accumulation_steps);
      break;
    case LossType::dapo:
      loss = active.sum() / std::max(o.generation_batch_tokens, 1.0);
      break;
  }
  parts.policy_loss = loss.detach();
  parts.loss = loss / divide;
  const auto r = ratio.detach().expand_as(logps);
  const auto a = A.expand_as(logps);
  auto low = (r < 1 - o.epsilon_low) & (a < 0);
  auto high = (r > 1 + o.epsilon_high) & (a > 0);
  parts.clip_low = masked_mean(low.to(mask.scalar_type()), mask);
  parts.clip_high = masked_mean(high.to(mask.scalar_type()), mask);
  parts.clip_region = masked_mean((low | high).to(mask.scalar_type()), mask);
  return parts;
}

} // namespace orchard::grpo
