// The GPT stages: base (pretraining from scratch on text), mid (from base,
// conversations mixed with text, loss on every token) and sft (from mid,
// conversations, loss on the answers). Their section is PretrainConfig
// (train/pretrain_config.h); training is train/pretrain.h's run_training.
#pragma once

#include "stages/stage.h"

namespace orchard::stages {

const Stage& base_stage();
const Stage& mid_stage();
const Stage& sft_stage();

} // namespace orchard::stages
