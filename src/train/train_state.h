// The random number generators' states, as named tensors for a checkpoint
// (the optimizer's live in train/optimizer.h).
#pragma once

#include "runs/checkpoint.h"

#include <torch/torch.h>

#include <map>
#include <string>

namespace orchard::train {

// "rng.cpu", plus "rng.cuda.N" when `device` is CUDA device N (dropout and
// sampling on the GPU draw from it).
runs::NamedTensors rng_state(const torch::Device& device);
void load_rng_state(
    const std::map<std::string, torch::Tensor>& saved,
    const torch::Device& device);

} // namespace orchard::train
