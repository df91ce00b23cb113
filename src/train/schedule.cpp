#include "train/schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace orchard::train {

int64_t grad_accum_steps(
    int64_t total,
    int64_t device_batch,
    int64_t seq_len,
    int64_t world) {
  const int64_t per_step = device_batch * seq_len * world;
  if (per_step <= 0)
    throw UserError(
        "device_batch_size, max_seq_len and the world size must be positive.");
  if (total % per_step == 0 && total >= per_step)
    return total / per_step;
  // The nearest totals that divide, and the device batch sizes that divide
  // this total.
  int64_t below = std::max(per_step, total / per_step * per_step);
  int64_t above = (total / per_step + 1) * per_step;
  std::string fits;
  for (int64_t b = 1; b <= total / seq_len / world && b <= 1024; ++b)
    if (total % (b * seq_len * world) == 0)
      fits += (fits.empty() ? "" : ", ") + std::to_string(b);
  std::string msg =
      "total_batch_size must be divisible by device_batch_size × max_seq_len" +
      std::string(world > 1 ? " × world size" : "") + ": " +
      std::to_string(total) + " is not a multiple of " +
      std::to_string(device_batch) + " × " + std::to_string(seq_len) +
      (world > 1 ? " × " + std::to_string(world) : "") + " = " +
      std::to_string(per_step) +
      ".\n  Nearest valid total_batch_size: " + std::to_string(below) +
      (below != above ? " or " + std::to_string(above) : "") + ".";
  if (!fits.empty())
    msg += "\n  Or keep total_batch_size=" + std::to_string(total) +
        " with device_batch_size one of: " + fits + ".";
  throw UserError(msg);
}

double lr_multiplier(
    int64_t step,
    int64_t total,
    int64_t warmup,
    double warmdown_ratio,
    double final_fraction) {
  if (warmup > 0 && step < warmup)
    return double(step + 1) / double(warmup);
  const int64_t warmdown =
      int64_t(std::llround(warmdown_ratio * double(total)));
  if (warmdown <= 0 || step < total - warmdown)
    return 1.0;
  const double progress = double(total - step) / double(warmdown); // 1 -> 0
  return progress + (1.0 - progress) * final_fraction;
}

} // namespace orchard::train
