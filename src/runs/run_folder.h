// Where each stage keeps its runs, and which run a command means.
//
// Runs live in runs/<stage>/<name> (runs/base/d4, runs/mid/d4,
// runs/sft/d4, runs/lora/Llama-3.2-3B): `-i sft` names the sft stage's run
// (the one with the newest checkpoint when there are several),
// `--checkpoint DIR` a run or checkpoint folder.
#pragma once

#include <string>
#include <vector>

namespace orchard::runs {

// The GPT pipeline's stages in order and the one each starts from ("" for
// base).
const std::vector<std::string>& pipeline_stages();
std::string previous_stage(const std::string& stage);

// runs/<stage>/<name>.
std::string stage_run_dir(const std::string& stage, const std::string& name);

// The run `-i STAGE [--run NAME]` names: runs/<stage>/<name>, or without a
// name the run of that stage with the newest checkpoint. UserError saying
// which runs exist (or how to make one) when there is none.
std::string find_stage_run(const std::string& stage, const std::string& name);

// A folder's own name ("Llama-3.2-3B" for "models/Llama-3.2-3B/").
std::string folder_name(const std::string& path);

} // namespace orchard::runs
