// What a checkpoint needs beyond the weights: the AdamW moments and step
// counts, and the random number generators' states, as named tensors.
#pragma once

#include "train/checkpoint.h"

#include <torch/torch.h>

#include <map>
#include <string>

namespace orchard::train {

// Per parameter (by its name in `model`): "<name>.exp_avg",
// "<name>.exp_avg_sq", "<name>.step".
NamedTensors adamw_state(
    const torch::optim::AdamW& opt,
    const torch::nn::Module& model);
// UserError when the checkpoint's optimizer does not match the model.
void load_adamw_state(
    torch::optim::AdamW& opt,
    const torch::nn::Module& model,
    const std::map<std::string, torch::Tensor>& saved);

// "rng.cpu" (and "rng.cuda.N" when CUDA is in use).
NamedTensors rng_state();
void load_rng_state(const std::map<std::string, torch::Tensor>& saved);

} // namespace orchard::train
