// The memory a fine-tuning run needs (finetune.h): the estimate by part,
// the micro-batch plan against the budget, and the table `orchard plan`
// prints. Checked against `orchard plan --probe` (bench/RESULTS.md).
#include "train/finetune.h"

#include "core/dtype.h"
#include "dist/world.h"
#include "models/hf/family.h"
#include "train/low_precision_state.h"
#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace orchard::train {
namespace {

// A layer's projections as the model's family defines them.
int64_t projection_weights(const models::HfModelConfig& m) {
  int64_t n = 0;
  for (const auto& p : models::family_of(m).layer_projections(m))
    n += p.in * p.out;
  return n;
}

// `spec` from lora_spec(), whose target names are normalized.
int64_t lora_parameter_count(
    const models::HfModelConfig& m,
    const models::LoraSpec& spec) {
  const auto& targets = spec.target_modules;
  int64_t per_layer = 0;
  for (const auto& p : models::family_of(m).layer_projections(m))
    if (std::find(targets.begin(), targets.end(), p.name) != targets.end())
      per_layer += spec.r * (p.in + p.out);
  return per_layer * m.num_hidden_layers;
}

// Projections, two norms a layer, the final norm, the embedding and an
// untied head (biases left out: a few thousand parameters).
int64_t model_parameter_count(const models::HfModelConfig& m) {
  const int64_t C = m.hidden_size;
  const int64_t layer = projection_weights(m) + 2 * C;
  return m.num_hidden_layers * layer +
      m.vocab_size * C * (m.tie_word_embeddings ? 1 : 2) + C;
}

} // namespace

FinetuneMemory finetune_memory(
    const models::HfModelConfig& m,
    const FinetuneConfig& cfg,
    torch::ScalarType base_dtype,
    int64_t B,
    c10::DeviceType device,
    int processes) {
  FinetuneMemory r;
  const bool lora = cfg.stage == "lora";
  const double b =
      double(dtype_bytes(lora ? base_dtype : full_weights_dtype(cfg)));
  const double act_b = double(dtype_bytes(base_dtype));
  const double params = double(model_parameter_count(m));
  const double T = double(cfg.max_seq_len), C = double(m.hidden_size);
  const double I = double(m.intermediate_size), L = double(m.num_hidden_layers);
  const double kv = double(m.num_key_value_heads * m.head_dim);
  r.weights = params * b;
  if (lora && cfg.load_in_4bit) {
    // The layers' projections at half a byte a weight plus one absmax per
    // 64 weights; embeddings, norms (and an untied lm_head) as they were;
    // one projection expanded at a time.
    const double proj = L * double(projection_weights(m));
    r.weights = (params - proj) * b + proj * (0.5 + b / 64) +
        C * I * (b + 4); // the largest expanded matrix and its indices
  }
  const double trained =
      lora ? double(lora_parameter_count(m, lora_spec(cfg))) : params;
  if (lora)
    r.trainable = trained * 4;
  r.gradients = trained * (lora ? 4 : b);
  // Two float32 moments, or two bytes and a float32 scale per 256 values.
  r.optimizer = finetune_optimizer_options(cfg).adam_8bit
      ? trained * (2 + 8.0 / double(kBlock))
      : trained * 8;
  const int world = processes > 0 ? processes : dist::size();
  if (world > 1) {
    // The averager's flat buckets, allocated once (and again in bfloat16
    // where float32 gradients are sent in it; on CUDA only, counted alike).
    const bool again =
        cfg.grad_reduce_dtype == "bfloat16" && (lora ? 4 : b) == 4;
    // Where the copy engines may average them (float32, not
    // grad_average=nccl; on CUDA only, counted alike): their scratch, the
    // largest bucket's share from every other rank (sharded, a bucket is
    // up to the cap a rank).
    const double scratch =
        copy_engines_may_average(
            (lora ? 4 : b) == 4, cfg.grad_reduce_dtype, cfg.grad_average)
        ? copy_engine_scratch(
              r.gradients,
              double(cfg.bucket_cap_mb << 20) *
                  (cfg.zero_stage >= 1 ? world : 1),
              world)
        : 0.0;
    r.gradients = r.gradients * (again ? 2.5 : 2) + scratch;
    if (cfg.zero_stage >= 1)
      r.optimizer /= double(world);
  }
  // Per token and layer, what the backward keeps: the norms' float32
  // inputs, q/k/v and their rotations, attention output, the MLP's four
  // intermediate vectors; LoRA with dropout adds each adapter's dropped
  // input and its mask. (Float32 adapters on a half base share the base's
  // inputs; without dropout they keep only rank-r products.) One layer's
  // backward adds two MLP-wide temporaries. Against `orchard plan --probe`
  // on one H100 (Llama 3.2 3B's shape, LoRA, bf16): 1024-4096 tokens a
  // micro-batch, 334 KB a token measured with checkpointing, 344 KB here.
  const double layer = (2 * C * 4) + (4 * C + 4 * kv) * act_b + 5 * I * act_b +
      (lora && cfg.lora_dropout > 0 ? (6 * C + I) * (act_b + 1) : 0.0);
  const double backward = 2 * I * act_b;
  // Where the attention keeps its scores for the backward (Debian's 1.13
  // on the CPU: explicit attention; MPS: PyTorch's math SDPA), two float32
  // values a score and layer. With them `orchard plan --probe` on the CPU
  // (1.13; the fixture Llama and Qwen2, 16 x 256 tokens, with and without
  // checkpointing) is within -8.4 to +14.3 %, against -25.5 to -30.6 %
  // without (bench/RESULTS.md, 2026-12-01). Fused attention (CUDA) keeps
  // none.
  const double scores = attention_keeps_no_scores(device)
      ? 0.0
      : 8.0 * double(m.num_attention_heads) * T;
  const double tokens = double(B) * T;
  r.activations = cfg.gradient_checkpointing
      ? tokens * (L * C * act_b + layer + scores + backward) // + one layer
      : tokens * (L * (layer + scores) + backward);
  // The loss: chunks of 2^24 logits in float32 (logits, softmax, gradient)
  // plus the final hidden states in float32.
  const double rows =
      std::min(tokens, std::floor(double(1 << 24) / double(m.vocab_size)));
  const double loss =
      rows * double(m.vocab_size) * (act_b + 12) + tokens * C * 4;
  r.logits = loss;
  if (lora) {
    // A frozen head's loss takes its gradient chunk by chunk in the forward
    // and frees the chunks before the backward starts: it counts only where
    // it needs more than the backward does (a large vocabulary, few tokens).
    const double before_backward =
        tokens * L * (cfg.gradient_checkpointing ? C * act_b : layer + scores) +
        loss;
    r.logits = std::max(0.0, before_backward - r.activations);
  }
  // Full fine-tuning: the optimizer step's temporaries and allocator
  // slack (within 0.5 % of the H100's peak for the 3B shape). LoRA's step
  // touches only the adapters: a twentieth of them and cuBLAS's workspace.
  r.workspace = lora ? 0.05 * r.trainable + 64.0 * (1 << 20)
                     : 0.05 * r.weights + 256.0 * (1 << 20);
  // LoRA with dropout: measured on the H100 at 113 MB more for the 3B
  // shape whatever the tokens (the adapters' per-projection copies in the
  // base dtype and their gradients, by the size).
  if (lora && cfg.lora_dropout > 0)
    r.workspace += trained * 2 * act_b;
  return r;
}

FinetunePlan plan_finetune(
    const models::HfModelConfig& mc,
    const FinetuneConfig& cfg,
    torch::ScalarType dtype,
    const DeviceInfo& device) {
  FinetunePlan p;
  const MemoryBudget budget = memory_budget(device, cfg.memory_fraction);
  p.budget = budget.bytes;
  p.budget_why = budget.why;
  for (int64_t b : {1, 2, 4, 8, 16}) {
    FinetunePlan::Row r{
        b, finetune_memory(mc, cfg, dtype, b, device.device.type()), false};
    r.fits = r.memory.total() <= double(budget.bytes);
    p.rows.push_back(r);
  }
  const int64_t rows = finetune_rows_per_step(cfg); // checks divisibility
  if (cfg.device_batch_size) {
    const int64_t b = *cfg.device_batch_size;
    p.choice = {
        b, finetune_memory(mc, cfg, dtype, b, device.device.type()), false};
    p.choice.fits = p.choice.memory.total() <= double(budget.bytes);
    p.why = "device_batch_size=" + std::to_string(b) + " as set; " +
        (p.choice.fits ? "it fits" : "it does not fit");
    return p;
  }
  // The effective batch is the recipe: the micro-batch must divide it.
  p.choice = p.rows.front();
  for (const auto& r : p.rows)
    if (r.fits && rows % r.batch == 0)
      p.choice = r;
  p.why = p.choice.fits
      ? "the largest micro-batch that divides the " + std::to_string(rows) +
          " rows per step and whose estimate fits the budget"
      : "nothing fits, not even one row: lower max_seq_length, keep "
        "gradient_checkpointing=true, use dtype=bfloat16, or a smaller model";
  return p;
}

std::string finetune_plan_table(const FinetunePlan& p) {
  std::string s =
      "Budget: " + format_mb(double(p.budget)) + " (" + p.budget_why + ")\n\n";
  char line[256];
  std::snprintf(
      line,
      sizeof line,
      "%6s %10s %12s %12s %10s %10s %12s  %s\n",
      "batch",
      "weights",
      "trained+opt",
      "activations",
      "loss",
      "workspace",
      "total",
      "fits");
  s += line;
  for (const auto& r : p.rows) {
    const auto& m = r.memory;
    std::snprintf(
        line,
        sizeof line,
        "%6lld %10s %12s %12s %10s %10s %12s  %s\n",
        (long long)r.batch,
        format_mb(m.weights).c_str(),
        format_mb(m.trainable + m.gradients + m.optimizer).c_str(),
        format_mb(m.activations).c_str(),
        format_mb(m.logits).c_str(),
        format_mb(m.workspace).c_str(),
        format_mb(m.total()).c_str(),
        r.fits ? "yes" : "no");
    s += line;
  }
  s += "\nChoice: device_batch_size=" + std::to_string(p.choice.batch) + " (" +
      format_mb(p.choice.memory.total()) + "): " + p.why + ".\n";
  return s;
}

} // namespace orchard::train
