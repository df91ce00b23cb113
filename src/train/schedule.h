// Batch arithmetic and the learning-rate schedule.
#pragma once

#include <cstdint>
#include <string>

namespace orchard::train {

// total_batch_size / (device_batch_size * max_seq_len * world_size), or a
// UserError with the message users know plus the nearest valid values.
int64_t grad_accum_steps(
    int64_t total_batch_size,
    int64_t device_batch_size,
    int64_t max_seq_len,
    int64_t world_size = 1);

// Multiplier of the peak learning rate at `step` (0-based) of `total`:
// linear warmup over `warmup` steps, constant, then a linear warmdown over
// the last `warmdown_ratio` of the steps to `final_fraction` (nanochat's
// schedule: warmup 0, warmdown 0.2, final 0).
double lr_multiplier(
    int64_t step,
    int64_t total,
    int64_t warmup,
    double warmdown_ratio,
    double final_fraction = 0.0);

} // namespace orchard::train
