// A trained GPT from its run folder, and where each stage keeps its runs.
//
// Runs live in runs/<stage>/<name> (runs/base/d4, runs/mid/d4,
// runs/sft/d4): `-i sft` names the sft stage's run (the one with the newest
// checkpoint when there are several), `--checkpoint DIR` a run or
// checkpoint folder. mid and sft start from the previous stage's model,
// loaded here; generation (src/infer) loads through here too.
#pragma once

#include "models/gpt.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::train {

// The stages in pipeline order and the one each starts from ("" for base).
const std::vector<std::string>& stage_names();
std::string previous_stage(const std::string& stage);

// runs/<stage>/<name>.
std::string stage_run_dir(const std::string& stage, const std::string& name);

// The run `-i STAGE [--run NAME]` names: runs/<stage>/<name>, or without a
// name the run of that stage with the newest checkpoint. UserError saying
// which runs exist (or how to make one) when there is none.
std::string find_stage_run(const std::string& stage, const std::string& name);

struct TrainedModel {
  models::Gpt model{nullptr};
  models::GptConfig config;
  std::string tokenizer_dir;
  std::string checkpoint_dir;
  int64_t step = 0;
  nlohmann::json state; // the checkpoint's state.json
};

// The newest good checkpoint of a run folder, or a checkpoint folder; the
// EMA weights when the checkpoint has them and `prefer_ema`.
TrainedModel load_trained(
    const std::string& run_or_checkpoint,
    bool prefer_ema = true);

} // namespace orchard::train
