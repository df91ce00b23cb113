#include "stages/grpo/plan.h"

#include <cmath>
#include <cstdio>
#include <numeric>

namespace orchard::grpo {

std::string finetune_kind(const GrpoConfig& cfg) {
  if (cfg.finetune != "auto")
    return cfg.finetune;
  return cfg.checkpoint.empty() ? "lora" : "full";
}

train::FinetuneConfig as_finetune(const GrpoConfig& cfg) {
  train::FinetuneConfig ft = cfg;
  ft.stage = finetune_kind(cfg);
  return ft;
}

// GRPO's memory on top of fine-tuning's: the rollouts' KV cache and the
// log-probability pass's logits (and a frozen reference for finetune=full
// with beta > 0).
namespace {

GrpoMemory grpo_memory(
    const models::HfModelConfig& mc,
    const GrpoConfig& cfg,
    torch::ScalarType dtype,
    int64_t micro,
    c10::DeviceType device) {
  train::FinetuneConfig ft = as_finetune(cfg);
  ft.max_seq_len = cfg.max_prompt_length + cfg.max_completion_length;
  GrpoMemory m;
  m.finetune = train::finetune_memory(mc, ft, dtype, micro, device);
  const double kv_bytes = finetune_kind(cfg) == "full"
      ? double(torch::elementSize(train::full_weights_dtype(ft)))
      : double(torch::elementSize(dtype));
  const int64_t head_dim =
      mc.head_dim > 0 ? mc.head_dim : mc.hidden_size / mc.num_attention_heads;
  m.kv_cache = 2.0 *
      double(mc.num_hidden_layers * mc.num_key_value_heads * head_dim) *
      kv_bytes * double(grpo_generation_batch(cfg)) * double(ft.max_seq_len);
  // The completion positions' logits, a chunk of about 4M at a time
  // (models/hf/model.h's token_logprobs): the logits, their softmax and
  // gradient in float32.
  const double rows = std::min(
      double(micro) * double(cfg.max_completion_length),
      std::max(1.0, std::floor(double(1 << 22) / double(mc.vocab_size))));
  m.logps = 3.0 * 4.0 * rows * double(mc.vocab_size);
  if (finetune_kind(cfg) == "full" && cfg.beta != 0.0)
    m.reference = m.finetune.weights;
  return m;
}

} // namespace

torch::ScalarType grpo_dtype(const GrpoConfig& cfg, const DeviceInfo& device) {
  return train::finetune_dtype(as_finetune(cfg), device);
}

GrpoPlanRows plan_rows(
    const models::HfModelConfig& mc,
    const GrpoConfig& cfg,
    const DeviceInfo& device) {
  const auto dtype = grpo_dtype(cfg, device);
  GrpoPlanRows p;
  p.budget = train::memory_budget(device, cfg.memory_fraction);
  const int64_t g =
      std::gcd(grpo_rows_per_step(cfg), grpo_generation_batch(cfg));
  for (int64_t b = 1; b <= std::min<int64_t>(g, 16); ++b) {
    if (g % b != 0)
      continue;
    GrpoPlanRows::Row r{
        b, grpo_memory(mc, cfg, dtype, b, device.device.type()), false};
    r.fits = r.memory.total() <= double(p.budget.bytes);
    p.rows.push_back(r);
  }
  p.choice = p.rows.front();
  for (const auto& r : p.rows)
    if (cfg.device_batch_size ? r.batch == *cfg.device_batch_size : r.fits)
      p.choice = r;
  if (cfg.device_batch_size && p.choice.batch != *cfg.device_batch_size)
    p.choice = {
        *cfg.device_batch_size,
        grpo_memory(
            mc, cfg, dtype, *cfg.device_batch_size, device.device.type()),
        false};
  return p;
}

std::string plan_table(const GrpoPlanRows& p) {
  std::string s = "Budget: " + train::format_mb(double(p.budget.bytes)) + " (" +
      p.budget.why + ")\n\n";
  char line[256];
  std::snprintf(
      line,
      sizeof line,
      "%6s %12s %12s %10s %10s %10s %12s  %s\n",
      "batch",
      "weights",
      "trained+opt",
      "training",
      "KV cache",
      "log-probs",
      "total",
      "fits");
  s += line;
  for (const auto& r : p.rows) {
    const auto& f = r.memory.finetune;
    std::snprintf(
        line,
        sizeof line,
        "%6lld %12s %12s %10s %10s %10s %12s  %s\n",
        (long long)r.batch,
        train::format_mb(f.weights + r.memory.reference).c_str(),
        train::format_mb(f.trainable + f.gradients + f.optimizer).c_str(),
        train::format_mb(f.activations + f.logits + f.workspace).c_str(),
        train::format_mb(r.memory.kv_cache).c_str(),
        train::format_mb(r.memory.logps).c_str(),
        train::format_mb(r.memory.total()).c_str(),
        r.fits ? "yes" : "no");
    s += line;
  }
  return s;
}

} // namespace orchard::grpo
