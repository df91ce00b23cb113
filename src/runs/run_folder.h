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

// A stage that starts from another model records it ("init" in its
// checkpoints' state.json). When that model has been trained further since,
// the run is stale: it must be trained again, never continued or reported
// as done.
//
// The checkpoint folder the run's newest checkpoint was trained from; ""
// when the run has no checkpoint or records none.
std::string trained_from(const std::string& run_dir);

// Whether two paths name the same folder (relative or absolute).
bool same_folder(const std::string& a, const std::string& b);

// Moves a run folder aside to the first free "<run_dir>.old-N" and returns
// that name: a stale run is kept, never deleted.
std::string set_aside(const std::string& run_dir);

// A run trained from another starting model than `init` is stale:
// continuing it would mix two parents. Sets it aside and returns the
// message saying so ("" when the run is not stale; `stage` names what
// trains again).
std::string set_aside_if_stale(
    const std::string& run_dir,
    const std::string& init,
    const std::string& stage);

// A folder's own name ("Llama-3.2-3B" for "models/Llama-3.2-3B/").
std::string folder_name(const std::string& path);

} // namespace orchard::runs
