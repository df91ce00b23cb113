// A developer's look at one training step: with ORCHARD_TRACE=FILE and
// ORCHARD_TRACE_STEP=N (or N-M) in the environment, the Trainer records
// step N (or steps N to M, so the GPU's idle time between steps shows),
// from its first launch to the end of its logging, as a Kineto Chrome
// trace in FILE;
// bench/trace_summary.py sums its kernels, --ops its CPU ops. libtorch 2.x
// only: on 1.13 the variables are refused with a message.
#pragma once

#include <cstdint>
#include <string>

namespace orchard::train {

class StepTrace {
 public:
  StepTrace(); // reads the environment; throws UserError on a bad value
  void begin(int64_t step);
  void end(int64_t step); // writes the file after the traced step
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

 private:
  std::string path_;
  int64_t first_ = -1, last_ = -1; // 0-based; -1: off
  bool on_ = false;
};

} // namespace orchard::train
