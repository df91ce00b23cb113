// Samples from a model as it trains and once it is trained: answers to
// held-out questions (chat stages) or continuations of held-out documents
// (base), for the progress output and the run report.
#pragma once

#include "runs/load.h"
#include "train/pretrain.h"
#include "train/report.h"

#include <cstdint>
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

// Prints samples as "Q: / A: / (reference: ...)" or "[prompt]continuation".
void print_samples(const std::vector<train::Sample>& samples);

} // namespace orchard::stages
