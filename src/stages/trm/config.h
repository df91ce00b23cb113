// The settings of `orchard train stage=trm`, spelt as upstream TRM's
// Hydra config (arch.H_cycles, arch.L_cycles, global_batch_size, epochs,
// eval_interval, lr, lr_warmup_steps, puzzle_emb_lr, ema, ...) on top of
// the knobs every stage shares (train/training_config.h).
//
// Differences from upstream, on purpose:
// - An epoch is one pass over the training rows (augmented copies
//   included); upstream's is one example per puzzle group. num_iterations
//   (steps) may be given instead.
// - A slot of the batch takes a new puzzle only when it halts; upstream
//   draws a whole batch every step and drops the puzzles of slots still
//   running.
// - The continue target (no_ACT_continue=false) runs an extra step of the
//   network without gradients, as the paper describes.
// - data= empty generates Sudoku or mazes (generate.*) instead of reading
//   the hub.
#pragma once

#include "core/config.h"
#include "models/trm.h"
#include "train/training_config.h"

#include <cstdint>
#include <optional>
#include <string>

namespace orchard::trm {

struct TrmStageConfig : train::TrainingConfig {
  TrmStageConfig() {
    num_iterations.reset();
    epochs = 1000;
    lr = 1e-4;
    warmup_steps = 2000;
    warmdown_ratio = 0; // upstream: constant after warmup (lr_min_ratio 1)
    weight_decay = 0.1;
    grad_clip = 0; // upstream does not clip
    eval_every = 0;
    save_every = 500;
  }
  std::string stage = "trm";
  std::string data; // a folder (train.*, test.*) or a puzzle file
  // Chat data (.chat): the tokenizer it was made with, and the template
  // family (as `orchard data chat --chat-template`; "": the folder's own).
  std::string tokenizer, chat_template;

  // When data= is empty: puzzles generated once into data_dir.
  std::string generate_task = "sudoku"; // sudoku | maze
  int64_t generate_size = 9;
  int64_t generate_count = 1000;
  std::string generate_difficulty = "auto";
  int64_t generate_augment = 0;

  int64_t global_batch_size = 768;
  std::optional<double> eval_interval; // epochs between evaluations
  int64_t eval_size = 1000;            // held-out puzzles per evaluation
  double beta1 = 0.9, beta2 = 0.95;
  double puzzle_emb_lr = 1e-2;
  double puzzle_emb_weight_decay = 0.1;
  bool ema = false;
  double ema_rate = 0.999;
  std::string optimizer = "adam_atan2";   // adam_atan2 | adamw
  std::optional<int64_t> puzzle_emb_ndim; // auto: hidden_size
  models::TrmConfig arch;
};

const config::Schema& trm_schema();

} // namespace orchard::trm
