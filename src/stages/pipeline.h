// `orchard pipeline`: tokenizer -> data -> base -> mid -> sft -> rl ->
// report (rl: GRPO on WordNet's questions, stages/grpo; rl_iterations=0
// leaves it out),
// running only what is missing. Each stage runs as `orchard train
// stage=...` would; a stage whose final checkpoint exists is done, one with
// any other checkpoint resumes from it.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "stages/stage.h"

#include <memory>
#include <string>
#include <vector>

namespace orchard::stages {

struct PipelineStage {
  std::string name;                   // base, mid, sft, rl
  std::unique_ptr<Settings> settings; // the pipeline's, with its length
  std::string run_dir;
  bool done = false;
  std::string status; // "done at step 40", "partial at step 25: ..."
};

struct Pipeline {
  std::string name;       // the run name shared by every stage ("d4")
  std::string custom_run; // run= as given ("" when the default)
  std::vector<PipelineStage> stages;
};

// Each stage's settings and where its run stands. UserError for settings
// the pipeline cannot honour (stage=, run_dir=, init=).
Pipeline plan_pipeline(const config::Sources& sources);

// The status table printed before anything runs.
std::string pipeline_status(const Pipeline& pipeline);

// Trains the stages not done, writes runs/report-<name>.md and prints the
// chat exchanges of the result and what to run next. Returns false when a
// stage was interrupted (it says how to resume).
bool run_pipeline(const Pipeline& pipeline, const DeviceInfo& device);

} // namespace orchard::stages
