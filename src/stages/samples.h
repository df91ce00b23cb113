// Samples from a model as it trains and once it is trained: answers to
// held-out questions (chat stages) or continuations of held-out documents
// (base), for the progress output and the run report.
#pragma once

#include "runs/load.h"
#include "train/pretrain.h"
#include "train/report.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::stages {

// Where samples come from: a .chat file of held-out conversations, else
// the validation shards.
using train::SampleSource;

// `count` samples (temperature 0.7, seeded by `seed`); `note` says what
// they are.
std::vector<train::Sample> draw_samples(
    const runs::LoadedModel& model,
    const SampleSource& source,
    int count,
    int64_t seed,
    std::string* note = nullptr);

// The end of a stage's train(). A run that was complete before this
// command gives back its saved result and samples (report.md stays as it
// was written). Otherwise `draw` fills the samples, they are printed, and
// report.md and result.json are written.
train::StageReport finish_stage(
    train::StageReport report,
    const DeviceInfo& device,
    const std::function<void(train::StageReport&)>& draw);

// Prints samples as "Q: / A: / (reference: ...)" or "[prompt]continuation".
void print_samples(const std::vector<train::Sample>& samples);

} // namespace orchard::stages
