// What a GRPO run's settings become once the machine and the run folder
// are known: the folder itself, and weights_dtype / optim made concrete.
#pragma once

#include "core/device.h"
#include "stages/grpo/config.h"

#include <string>

namespace orchard::grpo {

// The run folder `cfg` trains in: run_dir=, or runs/grpo/<source>-<env>.
std::string grpo_run_dir(const GrpoConfig& cfg);

// `given` with weights_dtype and optim auto made concrete. When `run_dir`
// holds checkpoints (and resume is not never), the keys left at auto take
// what that run began with, so it resumes in its own precision on any
// machine: its newest checkpoint's state.json says, or for a run
// checkpointed before state.json carried them, its config.yaml. Otherwise
// train::resolve_auto_precision decides from the policy's stored dtype on
// `device` (an Orchard GPT, checkpoint=, is stored in float32). `why` gets
// the reason ("" when nothing was auto). UserError when the policy is not
// exactly one of model= and checkpoint=.
GrpoConfig resolved(
    const GrpoConfig& given,
    const DeviceInfo& device,
    std::string* why = nullptr,
    const std::string& run_dir = "");

} // namespace orchard::grpo
