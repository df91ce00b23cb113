// The training loop every stage shares (base now; mid, SFT, LoRA, GRPO and
// TRM configure it rather than copy it).
//
// A stage hands the Trainer a TrainingTask: the model whose parameters are
// checkpointed, the loss of the next micro-batch, an evaluation, the data
// position to save and restore, and optional samples. The Trainer owns
// everything else: gradient accumulation, mixed precision (autocast and
// float16 loss scaling), gradient clipping, the learning-rate schedule,
// the optimizers' steps, EMA of the weights, periodic evaluation, samples,
// checkpoints and pruning, exact resume (weights, EMA, optimizer state, RNG
// states, data position, loss scale), SIGINT/SIGTERM (finish the step,
// save, exit cleanly), the progress line, train.log and metrics.jsonl.
#pragma once

#include "dist/world.h"
#include "runs/checkpoint.h"
#include "train/batch_schedule.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/step_graph.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace orchard::train {

// Prints to the terminal and appends to the run's train.log.
// Rank 0 makes the run folder and runs `write` (its config.yaml); every
// rank waits until it has (a single process just does both).
void make_run_folder(
    const std::string& dir,
    const std::function<void()>& write = {});

class RunLog {
 public:
  explicit RunLog(const std::string& path);
  void operator()(const std::string& line);
  void file_only(const std::string& line);

 private:
  std::ofstream file_;
};

struct EvalResult {
  double loss = 0; // the validation loss: best-checkpoint choice, progress
  std::vector<std::pair<std::string, double>> metrics; // {"val_bpb", 1.2}
  std::string summary; // "val loss 3.21, 1.05 bits per byte"
};

struct TrainingTask {
  std::shared_ptr<torch::nn::Module> model;
  // The mean loss of the next micro-batch (forward only; the Trainer runs
  // it under autocast and calls backward).
  std::function<torch::Tensor()> micro_step;
  // Optional, for CUDA graphs: micro_step in two parts, the next
  // micro-batch's inputs on the device (the data read and copied) and the
  // loss of given inputs (the forward only: no data, no host reads, no
  // shapes but the inputs'). A task with both can have its step's forward
  // and backward captured as one CUDA graph (train/step_graph.h);
  // micro_step must equal loss_of(next_inputs()).
  std::function<std::vector<torch::Tensor>()> next_inputs;
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> loss_of;
  // Every micro-step of every rank has the same shapes (a GPT's B x T
  // windows): several processes may then gather an embedding's rows
  // rather than all-reduce its gradient (dist/world.h).
  bool same_shapes_on_every_rank = false;
  // Trained tensors read only by products in the compute dtype (autocast
  // rounds them to it first: a GPT's projections and lm_head, not its
  // embedding): with zero_stage=1 on one CUDA host, the other ranks
  // receive their updated pieces in that dtype (dist::Shardable::low).
  std::vector<torch::Tensor> read_in_compute_dtype;
  // Embeddings (ops::embedding's weights): with several processes and
  // same_shapes_on_every_rank, their gradient may be made from every
  // rank's gathered rows; with zero_stage=1 they are then not sharded
  // (dist::Shardable::everywhere).
  std::vector<torch::Tensor> embeddings;
  // An evaluation of the weights in place (the EMA weights when EMA is on),
  // under autocast and without gradients.
  std::function<EvalResult()> evaluate;
  // Optional: print samples after `step` (same weights as evaluate).
  std::function<void(int64_t step)> sample;
  std::function<nlohmann::json()> data_state;
  std::function<void(const nlohmann::json&)> restore_data;
  // Changes the sequences per micro-step (out-of-memory recovery, resume
  // of a run that recovered); the data position carries over. Optional:
  // without it an out-of-memory error ends the run after saving.
  std::function<void(int64_t micro_batch)> set_micro_batch;
  // Optional: a stage's own figures after each step, added to its line in
  // metrics.jsonl (GRPO's rewards), and a short note for the progress line.
  std::function<std::map<std::string, double>()> step_metrics;
  std::function<std::string()> progress_note;
  // Written into every state.json (model shape, tokenizer, ...).
  nlohmann::json describe = nlohmann::json::object();
  // Optional: tensors a stage keeps beside the trained weights, saved in
  // every checkpoint under their own names and handed back on resume:
  // `model_tensors` into model.safetensors (buffers the saved model needs:
  // TRM's initial states), `state_tensors` into optimizer.safetensors
  // (TRM's ACT carry: the puzzles in flight and their latent states).
  std::function<runs::NamedTensors()> model_tensors, state_tensors;
  // With several processes: each rank's state_tensors are its own rows
  // (TRM's slots), stacked over the ranks in rank order into the
  // checkpoint, which rank 0 writes.
  bool state_per_rank = false;
  std::function<void(const runs::Checkpoint&)> restore_tensors;
  // With EMA on: evaluate the raw weights too after each evaluation, their
  // metrics logged with a "raw_" prefix (a short run's EMA lags).
  bool evaluate_raw_too = false;
};

struct TrainerOptions {
  std::string run_dir;
  torch::Device device{torch::kCPU};
  Precision precision;
  int64_t total_steps = 1;
  int64_t micro_batch = 1;     // sequences per micro-step
  int64_t grad_accum = 1;      // micro-steps per optimizer step
  int64_t tokens_per_step = 0; // for tokens/s
  // A step that grows (train/batch_schedule.h): step s takes
  // multiple_at(s) times grad_accum micro-steps of tokens_per_step's unit,
  // where tokens_per_step and grad_accum are the schedule's unit.
  BatchSchedule batch_schedule;
  double grad_clip = 1.0; // 0: off
  // 1: with several processes, each rank keeps the optimizer state of its
  // share of the parameters only (ZeRO-1, train/sharded_optimizer.h);
  // 0: every rank keeps all of it.
  int zero_stage = 0;
  // With several processes: the dtype gradients are averaged in (bfloat16
  // sends half the bytes; dist/world.h's GradientAverager).
  torch::ScalarType grad_reduce_dtype = torch::kFloat32;
  int64_t bucket_cap_mb = 100; // a bucket of gradients sent at once
  // What moves them on CUDA (grad_average).
  dist::AveragingOptions::Mover grad_average =
      dist::AveragingOptions::Mover::automatic;
  int64_t warmup_steps = 0;
  double warmdown_ratio = 0.2;
  bool ema = false;
  double ema_rate = 0.999;
  int64_t eval_every = 0, sample_every = 0, save_every = 0;
  int64_t save_total_limit = 3;
  bool keep_best = false;
  std::string resume = "auto"; // auto | never | a checkpoint folder
  // On CUDA (libtorch 2.x), for a task with next_inputs and loss_of, one
  // process and no float16 loss scaling: the step's forward and backward
  // captured as a CUDA graph after one eager step and replayed from then
  // on (again after the micro-batch or accumulation changes).
  bool cuda_graphs = true;
};

// The signal (SIGINT, SIGTERM, SIGHUP) that stopped the last
// Trainer::run() after it saved; 0 when none did. With several processes,
// a rank that was not signalled itself stops with the others and takes the
// signal they were sent. Commands exit with 128 + it, as a shell expects of
// a program stopped by a signal.
int last_stop_signal();

// How Orchard names a signal it stops for: "SIGINT (Ctrl-C)", "SIGTERM",
// "SIGHUP (the terminal closed)", "signal N".
std::string signal_name(int sig);

// Several processes: the signal the ranks stop for, from the sums over the
// ranks of "was signalled" (0 or 1) and of the signal's number. Ranks sent
// different signals (a mean that is none of them) stop for SIGTERM.
int agreed_stop_signal(double signalled, double signal_sum);

// The tensors a run trains (those that require gradients: a LoRA run's
// adapters, not its frozen base), in the model's order.
std::vector<torch::Tensor> trained_tensors(const torch::nn::Module& model);

struct TrainerResult {
  int64_t step = 0, total = 0;
  EvalResult final_eval;
  std::string checkpoint_dir;     // the final (or the interrupt's) checkpoint
  bool interrupted = false;       // stopped by SIGINT/SIGTERM after saving
  bool already_done = false;      // the run was complete before this call
  int64_t skipped_steps = 0;      // float16 steps whose gradients overflowed
  int64_t micro_batch = 0;        // at the end (smaller after out-of-memory)
  uint64_t peak_memory_bytes = 0; // core/memory_stats.h's peak
  double train_seconds = 0;       // steps, evaluations, samples; over resumes
};

class Trainer {
 public:
  Trainer(
      TrainerOptions options,
      TrainingTask task,
      Optimizers& optimizers,
      RunLog& log);

  // Restores the newest good checkpoint (per options.resume); returns the
  // step training continues from. Call before run(); run() calls it when
  // it was not called.
  int64_t resume();
  TrainerResult run();

  // Runs `fn` with the weights evaluation uses (EMA when on; the raw ones
  // with `raw`) in place, in eval mode, without gradients.
  void with_eval_weights(const std::function<void()>& fn, bool raw = false);

  // The micro-batch and accumulation in use (after resume() they are the
  // checkpoint's when it ran with another micro-batch).
  int64_t micro_batch() const {
    return opt_.micro_batch;
  }
  int64_t grad_accum() const {
    return opt_.grad_accum;
  }

 private:
  void save(int64_t step, bool complete, const EvalResult* eval);
  // With several processes: the gradient averager (sharded, and this
  // rank's optimizer, with zero_stage=1), made once.
  void make_averager();
  // The optimizer that steps this rank's parameters: its pieces' with
  // zero_stage=1 and several processes, else the stage's.
  Optimizers& stepper() {
    return shard_optimizers_ ? *shard_optimizers_ : optimizers_;
  }
  // With several processes: rank 0's weights (and EMA) on every rank.
  void same_weights_everywhere();
  void take_step(int64_t step, double& loss, double& grad_norm, bool& applied);
  // The forward and backward of `accum` micro-steps (the task's
  // micro_step each, or loss_of on `inputs` when given) and, on the
  // device, {gradient norm after unscaling, loss[, stop flag]}.
  torch::Tensor gradients(
      int64_t accum,
      double scale,
      const std::vector<std::vector<torch::Tensor>>* inputs);
  // gradients() through the step graph: the first eligible step runs
  // eagerly as its warm-up, the next is captured, the rest replay it.
  // Undefined when the step cannot use a graph.
  torch::Tensor graph_gradients(int64_t accum, double scale);
  void drop_graph();

  // After an out-of-memory error in step `step`: frees the caches, lowers
  // the micro-batch to its largest proper divisor (half, when even) and
  // raises accumulation to match (UserError at one sequence), and rewinds
  // the data to `data_at_start`.
  void recover_from_oom(
      int64_t step,
      const nlohmann::json& data_at_start,
      const std::string& what);

  TrainerOptions opt_;
  TrainingTask task_;
  Optimizers& optimizers_;
  RunLog& log_;
  LossScaler scaler_;
  std::vector<torch::Tensor> ema_;
  // Several processes: the gradients averaged during the last backward.
  std::unique_ptr<dist::GradientAverager> averager_;
  std::unique_ptr<Optimizers> shard_optimizers_; // zero_stage=1
  std::string shard_note_; // what sharding does, said at the first step
  // zero_stage=1: the parameters every rank steps whole (their TensorImpl).
  std::unordered_set<const void*> everywhere_;
  std::optional<int64_t> start_;
  double best_val_ = std::numeric_limits<double>::infinity();
  int64_t best_step_ = -1;
  double last_val_ = std::numeric_limits<double>::quiet_NaN();
  int64_t skipped_ = 0;
  // Tests only (ORCHARD_TEST_OOM_ROWS=N): a micro-step of more than N rows
  // fails as out of memory after taking its data, so the recovery runs end
  // to end from the command line on any machine. 0: off.
  int64_t test_oom_rows_ = 0;
  double seconds_ = 0;       // in steps, carried across resumes
  uint64_t peak_memory_ = 0; // the highest of every part of the run
  std::string last_checkpoint_;
  bool stop_agreed_ = false; // several processes: some rank was signalled
  int stop_signal_ = 0;      // and with which signal (agreed_stop_signal)
  // Several processes: whether this rank was signalled and with which
  // signal, on the device, filled before each step (a CUDA graph reads it
  // as it is then).
  torch::Tensor stop_flag_;
  int stop_flag_holds_ = 0; // the signal stop_flag_ was last filled with
  // CUDA graphs (options.cuda_graphs): the graph, the buffers it reads
  // (one list of inputs per micro-step) and its output, and the micro-
  // batch and accumulation it was made for.
  std::unique_ptr<StepGraph> graph_;
  std::vector<std::vector<torch::Tensor>> graph_inputs_;
  torch::Tensor graph_read_;
  int64_t graph_micro_ = 0, graph_accum_ = 0;
  bool graphs_off_ = false; // a capture failed: eager for the rest
  std::string note_;        // said after the step that set it
};

} // namespace orchard::train
