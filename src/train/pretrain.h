// GPT pretraining: `orchard train`.
//
// The loop owns gradient accumulation, clipping, the learning-rate
// schedule, EMA, evaluation (validation loss and bits per byte),
// checkpoints, resume and signals; the data and the model come from
// data_cache.h and models/gpt.h. Resume is exact: weights, optimizer
// moments, step, data position and RNG states are restored, so a run
// killed at any moment and started again ends with the same weights (bit
// for bit on the CPU) as one never interrupted.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "train/pretrain_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::train {

struct PretrainResult {
  std::string run_dir;
  int64_t step = 0, total = 0;
  double val_loss = 0, val_bpb = 0, unigram_loss = 0;
  bool interrupted = false; // stopped by SIGINT/SIGTERM after saving
  bool already_done = false;
  std::vector<std::string> val_shards; // for samples after training
};

PretrainResult run_pretraining(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device);

} // namespace orchard::train
