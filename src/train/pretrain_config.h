// The pretraining run's settings: the first config schema (the main-job
// issue implements the training that reads it; later stages add theirs).
//
// Field names are nanochat's and modded-nanogpt's where users already type
// them (depth, device_batch_size, total_batch_size, num_iterations); the
// architecture block also accepts the Hugging Face config.json names as
// aliases (arch.hidden_size for arch.n_embd, ...).
#pragma once

#include "core/config.h"
#include "models/gpt.h"
#include "train/training_config.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard {

// The defaults are `orchard train` with no arguments: the quick run that
// `./orchard.sh quickstart` trains (d4, 100 Muon steps of 4096 tokens; a few
// minutes on a 2-core CPU). configs/overnight.yaml is the larger one.
// One document in 200 of data_paths validates, by default.
constexpr double kDefaultValFraction = 0.005;

struct PretrainConfig : train::TrainingConfig {
  // The shared knobs (train/training_config.h) at their defaults for the
  // GPT stages: 256-token rows, 100 steps, warmdown over the last 20 %,
  // evaluation every 50 and a checkpoint every 25 steps.

  // Stage: base (pretraining from scratch), mid (continue a base model on
  // conversations mixed with plain text, loss on every token) or sft
  // (conversations, loss on the assistant's tokens only).
  std::string stage = "base";
  // mid and sft start from this: auto = the newest checkpoint of the stage
  // before (runs/base/<run> for mid, runs/mid/<run> for sft); or a run or
  // checkpoint folder.
  std::string init = "auto";
  std::vector<std::string> chat_data; // mid/sft: [] = WordNet's chats
  double mid_text_ratio = 0.3;        // mid: share of plain-text tokens
  bool pack = true; // sft: whole conversations back to back in each row
  std::optional<double> lr_scale; // all learning rates x this (auto: 1;
                                  // sft 0.2)

  // Model
  int64_t depth = 4;
  models::ArchConfig arch;

  // Data
  std::vector<std::string> data_paths;       // empty: the default corpus
  double val_fraction = kDefaultValFraction; // of data_paths' documents

  // Batch
  int64_t total_batch_size = 4096; // tokens per optimizer step
  // A step that grows during training (train/batch_schedule.h): tokens per
  // step of each stage, and the steps after which later stages begin
  // (empty: equal parts). Replaces total_batch_size.
  std::vector<std::string> batch_schedule;
  std::vector<std::string> batch_schedule_steps;
  std::string gradient_checkpointing = "auto"; // auto | true | false

  // Length: num_iterations, epochs (shared) or target_tokens (a later
  // source wins over an earlier one; the default num_iterations loses to
  // any of them set); num_iterations=auto with the others unset means one
  // pass over the training data.
  std::optional<int64_t> target_tokens;
  // `orchard pipeline`: the steps of the mid and sft stages (base takes
  // num_iterations, epochs or target_tokens).
  int64_t mid_iterations = 40;
  int64_t sft_iterations = 40;
  // `orchard pipeline`: GRPO steps of the rl stage on WordNet's questions
  // after sft (0, the default: no rl stage).
  int64_t rl_iterations = 0;

  // Optimization: three parameter groups (matrices, embedding, lm_head);
  // `optimizer=muon` gives the matrices Muon, the others AdamW; lr (shared)
  // is the matrices' rate (auto: 3e-3 AdamW, 0.02 Muon).
  std::string optimizer = "muon";
  double embedding_lr = 3e-2;
  double unembedding_lr = 3e-3;
  bool ema = false;
  double ema_rate = 0.999;
  // CUDA: the step's forward and backward as a CUDA graph (base, mid).
  bool cuda_graphs = true;

  // Data preparation
  std::string tokenizer; // "": one trained on the data, cached in data_dir

  // Evaluation, checkpoints (beyond the shared knobs)
  bool keep_best = false;
  std::optional<int64_t>
      split_tokens; // final train/val loss (auto: eval_tokens)
  int64_t sample_every = 50;
};

const config::Schema& pretrain_schema();

// The model these settings describe (depth, arch.*, max_seq_len) for a
// tokenizer of `vocab_size` tokens; models::resolve_gpt_config's checks.
models::GptConfig resolve_gpt_config(
    const PretrainConfig& cfg,
    int64_t vocab_size);

} // namespace orchard
