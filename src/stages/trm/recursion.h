// Deep supervision with adaptive halting (ACT) for the tiny recursive
// model: the training batch's carry, the loss of one supervision step,
// evaluation over held-out puzzles, and a trained model loaded back for
// `orchard solve` and `orchard eval`.
//
// Training (upstream's ACT loop): global_batch_size slots each hold a
// puzzle in flight and its latent state (z_H, z_L). Every optimizer step
// runs one supervision step on every slot; a slot that halts (the Q-head,
// or halt_max_steps) takes the next puzzle of the shuffled training rows
// at the following step, the others continue from their detached state.
// The carry is checkpointed, so a resumed run continues with the same
// puzzles in flight.
//
// Loss of a step, summed over slots and divided by their number:
//   mean over cells of stable-max cross-entropy (float64)
//   + 0.5 * BCE(q_halt, whole answer right) (+ BCE(q_continue, target)).
#pragma once

#include "data/puzzles.h"
#include "models/trm.h"
#include "runs/checkpoint.h"
#include "runs/load.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace orchard::trm {

// Loss and per-puzzle results of one supervision step.
struct StepLoss {
  torch::Tensor loss;  // scalar: the sum over the slots (q_halt's dtype)
  torch::Tensor exact; // (B) bool: every supervised cell right
  torch::Tensor cells; // (B) share of supervised cells right
  torch::Tensor lm;    // (B) mean cell loss (float64, detached)
};

// `target_continue` undefined without the continue loss.
StepLoss act_loss(
    const models::TrmStepOutput& out,
    const torch::Tensor& labels,
    const torch::Tensor& target_continue = {});

// The training rows in a shuffled order per epoch (seeded by seed and the
// epoch, so a resume draws the same rows).
class RowStream {
 public:
  RowStream(int64_t rows, uint64_t seed);
  std::vector<int64_t> next(int64_t count);
  nlohmann::json state() const;
  void restore(const nlohmann::json& j);
  double epochs_done() const; // rows drawn / rows

 private:
  void shuffle();
  int64_t rows_;
  uint64_t seed_;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;
};

// What the last optimizer step's halted puzzles scored.
struct TrainMetrics {
  int64_t halted = 0;
  double exact = 0, cells = 0, steps = 0; // sums over the halted
};

class ActTrainer {
 public:
  // `slots` puzzles in flight in this process. With several processes
  // (dist) every rank holds `slots` of the world's slots, rank r those from
  // r * slots; the halted slots of all ranks take the next rows of one
  // shared stream in slot order, so the run does not depend on the number
  // of processes.
  ActTrainer(
      models::Trm model,
      data::PuzzleSet train,
      int64_t slots,
      uint64_t seed,
      torch::Device device);

  // The mean loss of slots [k * micro, (k + 1) * micro) for the k-th
  // micro-step of the current optimizer step; after the last one the new
  // carry replaces the old.
  torch::Tensor micro_step(int64_t micro);

  // The carry and the data position, for checkpoints and for redoing a
  // step after running out of memory (restore drops a half-done step).
  nlohmann::json data_state() const;
  void restore_data(const nlohmann::json& j);
  runs::NamedTensors carry_tensors() const;
  void restore_carry(const std::map<std::string, torch::Tensor>& saved);

  // Takes the last step's metrics (zeroed for the next).
  TrainMetrics take_metrics();
  double epochs_done() const {
    return stream_.epochs_done();
  }

 private:
  struct Carry {
    torch::Tensor z_H, z_L, steps, halted, inputs, labels, ids;
    // `halted` on the CPU, read at the step's one host sync: which slots
    // take new rows is known without waiting for the GPU.
    torch::Tensor halted_cpu;
  };
  // t on the device; from pinned memory without a host sync on CUDA.
  torch::Tensor to_device(const torch::Tensor& t) const;
  // At a step's start: the rows every rank's halted slots take (one
  // collective with several processes), and where this rank's begin.
  void draw_step_rows();
  Carry fresh() const;

  models::Trm model_;
  data::PuzzleSet train_;
  int64_t slots_;
  torch::Device device_;
  RowStream stream_;
  Carry now_, next_;
  int64_t done_slots_ = 0; // of the current step
  int rank_ = 0, world_ = 1;
  std::vector<int64_t> step_rows_; // drawn for the step, all ranks' slots
  size_t rows_used_ = 0;           // this rank's next one
  torch::Tensor step_minimum_;     // exploration's, this rank's slots
  TrainMetrics metrics_, pending_;
};

// Held-out metrics after running every puzzle for halt_max_steps steps.
struct EvalStats {
  int64_t puzzles = 0;
  double exact = 0, cells = 0, q_halt_accuracy = 0, loss = 0;
  std::vector<double> exact_by_step; // after step 1, 2, ...
  nlohmann::json to_json() const;
};

// The first `count` puzzles of `set` in batches of `batch`; call with
// gradients off and the model in eval mode (autocast as the caller sets).
EvalStats evaluate(
    models::Trm& model,
    const data::PuzzleSet& set,
    int64_t count,
    int64_t batch,
    torch::Device device);

// A trained TRM: a run folder (its newest good checkpoint) or a
// checkpoint folder; the EMA weights when present.
struct TrainedTrm {
  models::Trm model{nullptr};
  nlohmann::json state; // state.json: "trm", "puzzles", ...
  std::string checkpoint_dir;
  std::string data; // the run's data
  bool ema = false;
};
TrainedTrm load_trm(const std::string& path, torch::Device device);
// Whether `path` is a stage=trm run or checkpoint folder (for commands that
// take any model).
bool is_trm_checkpoint(const std::string& path);
// A TRM trained on conversations, for `orchard generate` and `orchard
// chat` (models/trm_language_model.h) with the tokenizer and template its
// data was made with; UserError for one trained on puzzles.
runs::LoadedModel load_trm_chat(const std::string& path, torch::Device device);

// One answer: the cells after the step where the Q-head first says halt
// (or halt_max_steps), and that step.
struct Solution {
  std::vector<int64_t> tokens;
  int64_t steps = 0;
  bool halted_by_q = false;
};
std::vector<Solution> solve(
    models::Trm& model,
    const torch::Tensor& inputs,
    const torch::Tensor& puzzle_ids,
    torch::Device device);

} // namespace orchard::trm
