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

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard {

// The defaults are `orchard train` with no arguments: the quick run that
// `./orchard.sh quickstart` trains (d4, 100 Muon steps of 4096 tokens; a few
// minutes on a 2-core CPU). configs/overnight.yaml is the larger one.
struct PretrainConfig {
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
  std::vector<std::string> data_paths; // empty: the default corpus
  std::string data_dir;                // "": $ORCHARD_HOME or ~/.cache/orchard
  double val_fraction = 0.005;         // of data_paths' documents held out

  // Batch
  int64_t max_seq_len = 256;
  std::optional<int64_t> device_batch_size;    // auto: the memory planner's
  int64_t total_batch_size = 4096;             // tokens per optimizer step
  std::string gradient_checkpointing = "auto"; // auto | true | false
  double memory_fraction = 0.8; // share of usable memory the planner fills

  // Length: one of these (a later source wins over an earlier one; the
  // default num_iterations loses to any of them set); num_iterations=auto
  // with the others unset means one pass over the training data.
  std::optional<int64_t> num_iterations = 100;
  std::optional<double> epochs;
  std::optional<int64_t> target_tokens;
  // `orchard pipeline`: the steps of the mid and sft stages (base takes
  // num_iterations, epochs or target_tokens).
  int64_t mid_iterations = 40;
  int64_t sft_iterations = 40;

  // Optimization: three parameter groups (matrices, embedding, lm_head);
  // `optimizer=muon` gives the matrices Muon, the others AdamW.
  std::string optimizer = "muon";
  std::optional<double> lr; // the matrices' (auto: 3e-3 AdamW, 0.02 Muon)
  double embedding_lr = 3e-2;
  double unembedding_lr = 3e-3;
  int64_t warmup_steps = 0;
  double warmdown_ratio = 0.2;
  double weight_decay = 0.0;
  double grad_clip = 1.0;
  std::string dtype = "auto";
  bool ema = false;
  double ema_rate = 0.999;
  int64_t seed = 42;

  // Data preparation
  std::string tokenizer; // "": one trained on the data, cached in data_dir

  // Run folder, evaluation, checkpoints
  std::string resume = "auto"; // auto | never | a checkpoint folder
  bool keep_best = false;
  std::string run;     // "": the model tag, e.g. d6
  std::string run_dir; // "": runs/<run>
  int64_t eval_every = 50;
  int64_t eval_tokens = 16384;
  std::optional<int64_t>
      split_tokens; // final train/val loss (auto: eval_tokens)
  int64_t sample_every = 50;
  int64_t save_every = 25;
  int64_t save_total_limit = 3;
};

const config::Schema& pretrain_schema();

// The model these settings describe (depth, arch.*, max_seq_len) for a
// tokenizer of `vocab_size` tokens; models::resolve_gpt_config's checks.
models::GptConfig resolve_gpt_config(
    const PretrainConfig& cfg,
    int64_t vocab_size);

} // namespace orchard
