// GRPO's memory plan: fine-tuning's (weights, trained parameters and
// their optimizer state, activations) plus the rollouts' KV cache for the
// whole generation batch, the log-probability pass's logits and, for a
// full fine-tune with beta > 0, the frozen reference. `orchard plan
// stage=grpo` prints it; the stage picks its micro-batch from it.
#pragma once

#include "core/device.h"
#include "models/hf/config.h"
#include "stages/grpo/config.h"
#include "train/finetune.h"
#include "train/memory_plan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::grpo {

// lora or full: finetune=auto is LoRA for a Hugging Face model, full for an
// Orchard GPT.
std::string finetune_kind(const GrpoConfig& cfg);

// The fine-tuning part of `cfg` with its stage (lora|full) set as
// finetune_kind says: what the fine-tuning helpers (dtypes, memory,
// optimizer) read.
train::FinetuneConfig as_finetune(const GrpoConfig& cfg);

// The weights' dtype fine-tuning would use for these settings.
torch::ScalarType grpo_dtype(const GrpoConfig& cfg, const DeviceInfo& device);

struct GrpoMemory {
  train::FinetuneMemory finetune;
  double kv_cache = 0, logps = 0, reference = 0;
  double total() const {
    return finetune.total() + kv_cache + logps + reference;
  }
};

// Each micro-batch dividing both the rows per step and the generation
// batch (up to 16), its memory and whether it fits the device's budget;
// the choice (per_device_train_batch_size when set, else the largest that
// fits).
struct GrpoPlanRows {
  struct Row {
    int64_t batch = 0;
    GrpoMemory memory;
    bool fits = false;
  };
  std::vector<Row> rows;
  Row choice;
  train::MemoryBudget budget;
};
GrpoPlanRows plan_rows(
    const models::HfModelConfig& mc,
    const GrpoConfig& cfg,
    const DeviceInfo& device);

// The rows as the table `orchard plan` prints.
std::string plan_table(const GrpoPlanRows& plan);

} // namespace orchard::grpo
