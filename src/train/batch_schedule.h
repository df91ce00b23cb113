// A batch that grows during training: modded-nanogpt's batch-size schedule
// (its `train_bs_schedule`, which the seed guide for Apple Silicon tells
// users to shrink or grow to fit their Mac). Small optimizer steps while
// the loss falls fast, larger ones later, each stage a number of tokens
// per step. The micro-batch, and so the memory, stays the same: a larger
// step takes more accumulation micro-steps.
//
// Stages split training into equal parts by default (three stages: thirds,
// as modded-nanogpt's schedule), or begin at given steps:
//   batch_schedule=[2*2048*8, 4*2048*8, 6*2048*8]
//   batch_schedule=[32768,65536] batch_schedule_steps=[300]
// Steps are counted from 0 here; in messages from 1, as the progress line
// counts them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::train {

class BatchSchedule {
 public:
  BatchSchedule() = default; // off: every step the same size

  // From the config's lists: `tokens` (each an integer or a product such as
  // 2*2048*8) and `starts` (the steps after which each later stage begins;
  // empty for equal parts). UserError naming the key for a bad item, a
  // count of starts that is not one less than the stages, or starts that
  // do not increase.
  static BatchSchedule parse(
      const std::vector<std::string>& tokens,
      const std::vector<std::string>& starts);

  bool on() const {
    return !tokens_.empty();
  }
  size_t stages() const {
    return tokens_.size();
  }
  const std::vector<int64_t>& tokens() const {
    return tokens_;
  }
  // The stage of step `step` (0-based) in a run of `total` steps.
  size_t stage_at(int64_t step, int64_t total) const;
  int64_t tokens_at(int64_t step, int64_t total) const;
  // The greatest common divisor of the stages' tokens: every step is a
  // whole number of these.
  int64_t unit() const;
  // How many units step `step` takes (1 when the schedule is off).
  int64_t multiple_at(int64_t step, int64_t total) const {
    return on() ? tokens_at(step, total) / unit() : 1;
  }
  // Tokens of the first `steps` steps of a run of `total` steps.
  int64_t tokens_through(int64_t steps, int64_t total) const;
  // The fewest steps whose whole run carries at least `tokens`.
  int64_t steps_for(int64_t tokens) const;
  // "16384 tokens a step for steps 1-33, 32768 for 34-66, 49152 for 67-100".
  std::string describe(int64_t total) const;

 private:
  // The first step (0-based) of stage `k` in a run of `total` steps.
  int64_t start_of(size_t k, int64_t total) const;

  std::vector<int64_t> tokens_, starts_;
};

} // namespace orchard::train
