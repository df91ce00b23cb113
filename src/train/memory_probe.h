// Measuring what the planner predicts: the peak memory of real training
// steps (forward, backward, optimizer) of a GPT at a given micro-batch, on
// a device (core/memory_stats.h says what is read there). Used by `orchard
// plan --probe` and bench/memory_probe.cpp; fine-tuning's in
// train/finetune.h (measure_finetune_peak).
#pragma once

#include "models/gpt.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"

#include <cstdint>
#include <functional>

namespace orchard::train {

struct ProbeResult {
  double measured = 0;  // bytes above the baseline before the model existed
  double predicted = 0; // estimate_memory(...).total()
  MemoryEstimate estimate;
};

// Readies `dev` for a measurement (its context and kernels loaded, freed
// host memory handed back, the peak reset) and returns the memory in use,
// which the measured peak is taken above.
uint64_t probe_baseline(const c10::Device& dev);

// Two optimizer steps of `accum` micro-steps of `loss` (under autocast to
// `compute`) and their backward; returns the device's peak during the
// second, which has the optimizer's state.
uint64_t peak_of_two_steps(
    const std::function<torch::Tensor()>& loss,
    Optimizers& optimizers,
    int64_t accum,
    torch::ScalarType compute,
    const c10::Device& dev);

// Builds the model (with settings.gradient_checkpointing), takes two
// optimizer steps of `accum` micro-steps of `batch` random sequences, and
// reads the peak of the second step. UserError-free: an out-of-memory
// error propagates as c10::Error for the caller to report.
ProbeResult measure_step_peak(
    models::GptConfig config,
    const PlanSettings& settings,
    int64_t batch,
    int64_t accum,
    const c10::Device& device);

} // namespace orchard::train
