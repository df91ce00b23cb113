// Checkpoints: runs/<name>/checkpoints/step_000500/ holding
//   model.safetensors      the weights (and ema.* when EMA is on)
//   optimizer.safetensors  optimizer moments, RNG states
//   state.json             step, data position, config, metrics; written
//                          last, so its presence marks a complete checkpoint
// A checkpoint is written into a hidden temporary folder, every file
// fsynced, then the folder is renamed into place: a crash leaves either the
// whole checkpoint or none. Loading takes the newest checkpoint that
// validates; a damaged newer one is reported and skipped, and pruning never
// deletes the newest good checkpoint.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orchard::runs {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct Checkpoint {
  std::string dir; // .../checkpoints/step_000500
  int64_t step = 0;
  std::map<std::string, torch::Tensor> model, optimizer;
  nlohmann::json state;
};

// "step_000500" for 500.
std::string checkpoint_name(int64_t step);

// Writes the checkpoint of `step` under <run_dir>/checkpoints atomically.
// Returns its folder.
std::string save_checkpoint(
    const std::string& run_dir,
    int64_t step,
    const NamedTensors& model,
    const NamedTensors& optimizer,
    nlohmann::json state);

// Loads one checkpoint folder; UserError naming what is damaged.
Checkpoint load_checkpoint(const std::string& dir);

// The newest checkpoint of a run that loads (its files' checksums match);
// each damaged newer one adds a line to `skipped` (what was wrong, and that
// an older one is used). With `move_damaged_aside` (a run that will train
// on and save again), a damaged one is renamed to damaged-step_NNNNNN:
// kept for a look, never overwritten by the next save.
std::optional<Checkpoint> latest_checkpoint(
    const std::string& run_dir,
    std::vector<std::string>* skipped = nullptr,
    bool move_damaged_aside = false);

// Complete checkpoint folders (state.json present), oldest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(
    const std::string& run_dir);

// Keeps the newest `keep` checkpoints (0: all), plus `also_keep` (the best by
// validation loss) and always the newest that loads. Removes leftovers of
// interrupted saves. Returns the folders removed.
std::vector<std::string> prune_checkpoints(
    const std::string& run_dir,
    int64_t keep,
    std::optional<int64_t> also_keep = std::nullopt);

} // namespace orchard::runs
