// `orchard train stage=trm`: the tiny recursive model (trm_stage.cpp).
#pragma once

#include "stages/stage.h"

namespace orchard::stages {

const Stage& trm_stage();

} // namespace orchard::stages
