// The knobs every training stage shares, declared once.
//
// A stage's config section (PretrainConfig for base/mid/sft,
// FinetuneConfig for lora/full; GRPO and TRM next) is this struct plus the
// stage's own keys. Each shared knob is one field and one schema option
// (add_training_options), whichever stage reads it; a section only chooses
// its defaults (in its constructor) and how the knob is spelt in its
// config.yaml: nanochat's names for the GPT stages (num_iterations,
// max_seq_len, grad_clip, eval_every, save_every, lr), transformers'
// TrainingArguments names for fine-tuning (max_steps, max_seq_length,
// max_grad_norm, eval_steps, save_steps, learning_rate). The other
// spelling is always accepted as an alias, so no user's YAML breaks.
#pragma once

#include "core/config.h"

#include <cstdint>
#include <optional>
#include <string>

namespace orchard::train {

struct TrainingConfig {
  // Data
  std::string data_dir; // "": $ORCHARD_HOME or ~/.cache/orchard

  // Batch
  int64_t max_seq_len = 256;                // tokens per row
  std::optional<int64_t> device_batch_size; // auto: the memory plan's
  double memory_fraction = 0.8; // share of usable memory the plan fills

  // Length: optimizer steps, or passes over the training data.
  std::optional<int64_t> num_iterations = 100;
  std::optional<double> epochs;

  // Optimization
  std::optional<double> lr; // the peak rate (auto: the stage's)
  int64_t warmup_steps = 0;
  double warmdown_ratio = 0.2; // share of the steps decaying to zero
  double weight_decay = 0.0;
  double grad_clip = 1.0; // 0 turns clipping off
  int64_t zero_stage = 0;  // 1: optimizer state sharded over the processes
  // With several processes, the dtype the gradients are averaged in:
  // float32, or bfloat16 (half the bytes sent).
  std::string grad_reduce_dtype = "float32";
  int64_t bucket_cap_mb = 100; // gradients sent at once (DDP's bucket_cap_mb)
  // With several processes on CUDA, what moves the gradients: auto, nccl
  // or copy_engines (dist/world.h's AveragingOptions::Mover).
  std::string grad_average = "auto";
  std::string dtype = "auto";
  int64_t seed = 42;

  // Run folder, evaluation, checkpoints
  std::string run;             // "": the stage's default name
  std::string run_dir;         // "": runs/<stage>/<run>
  std::string resume = "auto"; // auto | never | a checkpoint folder
  int64_t eval_every = 50;     // 0: only at the end
  int64_t eval_tokens = 16384;
  int64_t save_every = 25; // 0: only at the end
  int64_t save_total_limit = 3;
};

// Which names a section writes in its config.yaml (the other spelling is
// an alias).
enum class Spelling { nanochat, transformers };

// Declares the shared knobs in `schema`; `base` finds the TrainingConfig
// inside the section struct the schema is applied to.
void add_training_options(
    config::Schema& schema,
    Spelling spelling,
    TrainingConfig* (*base)(void*));

// `base` for a section struct C derived from TrainingConfig.
template <class C>
TrainingConfig* training_part(void* section) {
  return static_cast<C*>(section);
}

} // namespace orchard::train
