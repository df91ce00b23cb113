// GPT pretraining: `orchard train`.
//
// This file configures the shared Trainer (train/trainer.h) for the base
// stage: the data (data_cache.h), the model (models/gpt.h), the parameter
// groups and optimizer, the length (num_iterations, epochs or
// target_tokens), the precision, and an evaluation of validation loss and
// bits per byte. Resume is exact: a run killed at any moment and started
// again ends with the same weights (bit for bit on the CPU) as one never
// interrupted.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "models/gpt.h"
#include "train/memory_plan.h"
#include "train/precision.h"
#include "train/pretrain_config.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::train {

struct PretrainResult {
  std::string run_dir;
  int64_t step = 0, total = 0;
  double val_loss = 0, val_bpb = 0, unigram_loss = 0;
  double train_split_loss = 0, val_split_loss = 0; // split_tokens each
  bool interrupted = false; // stopped by SIGINT/SIGTERM after saving
  bool already_done = false;
  std::vector<std::string> val_shards; // for samples after training
};

// Prints samples from the model as it trains (`sample_every`); given by the
// caller because generation lives in a higher layer (src/infer).
using SampleHook = std::function<void(
    const models::Gpt& model,
    const std::string& tokenizer_dir,
    const std::vector<std::string>& val_shards,
    int64_t step)>;

// Optimizer steps for the settings: num_iterations, else target_tokens,
// else epochs (auto: 1) passes of `windows_per_epoch` sequences. When
// several are set, the one from the later source wins (command line over
// environment over --config over preset); two from the same source are a
// UserError.
int64_t resolve_num_steps(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    int64_t windows_per_epoch,
    int64_t sequences_per_step);

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

PretrainResult run_pretraining(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device,
    const SampleHook& sample = {});

} // namespace orchard::train
