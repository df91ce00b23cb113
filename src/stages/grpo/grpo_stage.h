// `orchard train stage=grpo`: GRPO with reward functions (grpo_stage.cpp).
#pragma once

#include "stages/stage.h"

namespace orchard::stages {

const Stage& grpo_stage();

} // namespace orchard::stages
