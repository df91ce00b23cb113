#include "train/step_trace.h"

#include "core/error.h"
#include "core/torch_compat.h"

#if ORCHARD_KINETO_TRACE
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#endif

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace orchard::train {

StepTrace::StepTrace() {
  const char* path = std::getenv("ORCHARD_TRACE");
  const char* step = std::getenv("ORCHARD_TRACE_STEP");
  if (!path || !step)
    return;
  // N, or N-M for the steps N to M (the gaps between steps show).
  char* end = nullptr;
  const long long first = std::strtoll(step, &end, 10);
  long long last = first;
  if (end != step && *end == '-') {
    const char* second = end + 1;
    last = std::strtoll(second, &end, 10);
    if (end == second)
      last = 0;
  }
  if (end == step || *end != '\0' || first < 1 || last < first)
    throw UserError(
        std::string("ORCHARD_TRACE_STEP='") + step +
        "' is not a step number (1 or more) or range (N-M, M at least N). "
        "Set it to the step or steps to trace, or unset it.");
  if (!std::ofstream(path, std::ios::app))
    throw UserError(
        std::string("ORCHARD_TRACE='") + path +
        "' cannot be written (a missing folder or no permission). Point it "
        "at a file in a folder that exists, or unset it.");
  if (!ORCHARD_KINETO_TRACE)
    throw UserError(
        "ORCHARD_TRACE needs libtorch 2.x (its Kineto profiler); this build "
        "has libtorch " +
        compat::torch_version() + ". Unset ORCHARD_TRACE.");
  path_ = path;
  // Several processes: rank 0 writes PATH, rank N PATH.rankN.
  if (const char* rank = std::getenv("RANK"); rank && std::string(rank) != "0")
    path_ += std::string(".rank") + rank;
  first_ = first - 1;
  last_ = last - 1;
}

void StepTrace::begin(int64_t step) {
  if (step != first_)
    return;
#if ORCHARD_KINETO_TRACE
  namespace kp = torch::profiler::impl;
  kp::ProfilerConfig cfg(kp::ProfilerState::KINETO);
  const std::set<kp::ActivityType> act = {
      kp::ActivityType::CPU, kp::ActivityType::CUDA};
  torch::autograd::profiler::prepareProfiler(cfg, act);
  torch::autograd::profiler::enableProfiler(cfg, act);
  on_ = true;
#endif
}

void StepTrace::end(int64_t step) {
  if (step != last_ || !on_)
    return;
#if ORCHARD_KINETO_TRACE
  on_ = false;
  try { // a trace that cannot be saved does not stop the training
    torch::autograd::profiler::disableProfiler()->save(path_);
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "warning: the step's trace was not saved to %s: %s\n",
        path_.c_str(),
        e.what());
  }
#endif
}

} // namespace orchard::train
