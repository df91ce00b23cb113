// GPT training: `orchard train [stage=base|mid|sft]`.
//
// This file configures the shared Trainer (train/trainer.h) for the GPT
// stages: the data (data_cache.h, stage_data.h), the model (models/gpt.h;
// mid and sft load the previous stage's, trained_model.h), the parameter
// groups and optimizer, the length (num_iterations, epochs or
// target_tokens), the precision, and an evaluation of validation loss and
// bits per byte. Resume is exact: a run killed at any moment and started
// again ends with the same weights (bit for bit on the CPU) as one never
// interrupted.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "models/gpt.h"
#include "train/batch_schedule.h"
#include "train/memory_plan.h"
#include "train/precision.h"
#include "train/pretrain_config.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace orchard::train {

// What a stage's training produced, whichever the stage.
struct TrainResult {
  std::string stage, run_dir, tokenizer_dir;
  int64_t step = 0, total = 0;
  double val_loss = 0, val_bpb = 0, unigram_loss = 0;
  double train_split_loss = 0, val_split_loss = 0; // split_tokens each
  bool interrupted = false; // stopped by SIGINT/SIGTERM after saving
  bool already_done = false;
  double train_seconds = 0;       // over every resume of the run
  uint64_t peak_memory_bytes = 0; // likewise
  std::string checkpoint_dir;
  std::string init_dir;                // mid/sft: the model started from
  std::string data_description;        // "WordNet glosses (...)"
  std::vector<std::string> val_shards; // base/mid: for samples
  std::string chat_val;                // mid/sft: held-out conversations
  // lora/full: the adapter (PEFT) or model folder written at the end; the
  // micro-batch at the end; the trained and all parameters.
  std::string output_dir;
  int64_t micro_batch = 0, trainable_parameters = 0, parameters = 0;
  // Rows a stage adds to its results table (grpo: held-out reward and
  // success before and after training).
  std::vector<std::pair<std::string, std::string>> report_rows;
};

struct TrainerResult;
// The Trainer's outcome into a stage's result: step, interruption,
// seconds, peak memory, final validation loss, micro-batch, checkpoint.
void copy_trainer_result(const TrainerResult& from, TrainResult& to);

// What samples are drawn from: continuations of held-out documents (base)
// or answers to held-out questions (mid, sft).
struct SampleSource {
  std::vector<std::string> val_shards;
  std::string chat_val; // "" for base
};

// Prints samples from the model as it trains (`sample_every`); given by the
// caller because generation lives in a higher layer (src/infer).
using SampleHook = std::function<void(
    const models::Gpt& model,
    const std::string& tokenizer_dir,
    const SampleSource& source,
    int64_t step)>;

// Optimizer steps for the settings: num_iterations, else target_tokens,
// else epochs (auto: 1) passes of `windows_per_epoch` sequences. When
// several are set, the one from the later source wins (command line over
// environment over --config over preset); two from the same source are a
// UserError.
// With a batch schedule the tokens a step carries vary; target_tokens
// and epochs then count the steps whose whole run carries that many.
int64_t resolve_num_steps(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    int64_t windows_per_epoch,
    int64_t sequences_per_step,
    const BatchSchedule& schedule = {});

// batch_schedule and batch_schedule_steps, checked against max_seq_len,
// the processes and a set device_batch_size; with a schedule,
// cfg.total_batch_size becomes its unit (the stages' greatest common
// divisor), which planning and accumulation count in. UserError for a bad
// entry, a stage that one micro-step of every process cannot divide, or
// total_batch_size set too.
BatchSchedule resolve_batch_schedule(
    PretrainConfig& cfg,
    const config::Origins& origins);

// The planner's view of these settings (sequence, precision, optimizer,
// checkpointing as set, device, fused attention).
PlanSettings plan_settings(
    const PretrainConfig& cfg,
    const Precision& precision,
    const DeviceInfo& device);

// The micro-batch plan `orchard train` follows and `orchard plan` prints:
// the planner's choice, or with device_batch_size set, that size and
// whether it is predicted to fit. UserError when a set size does not
// divide total_batch_size.
BatchPlan plan_for(
    const PretrainConfig& cfg,
    const models::GptConfig& model,
    const Precision& precision,
    const DeviceInfo& device);

// One stage (cfg.stage): base trains a new model on text; mid and sft
// start from the previous stage's model (cfg.init) and train on
// conversations (train/stage_data.h). The run folder is
// runs/<stage>/<run or model tag> unless run_dir is set.
TrainResult run_training(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device,
    const SampleHook& sample = {});

} // namespace orchard::train
