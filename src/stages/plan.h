// `orchard plan --probe`: the measured peak of real training steps beside
// the stage's prediction.
#pragma once

#include "stages/stage.h"

#include <nlohmann/json.hpp>

namespace orchard::stages {

// Measures each of plan.probe_batches; an out-of-memory error ends that
// batch's measurement and is reported, anything else propagates. Prints
// each line as it comes (`json` false), or returns them for the JSON.
nlohmann::json run_probes(const Plan& plan, bool json);

} // namespace orchard::stages
