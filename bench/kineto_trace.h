// One profiled step written as a Chrome trace (bench/trace_summary.py sums
// its GPU kernels): where a step's time goes. Benchmarks built with
// ORCHARD_KINETO (libtorch 2.x) include this.
#pragma once
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>

namespace orchard::bench {
namespace kp = torch::profiler::impl;
inline void trace_start() {
  kp::ProfilerConfig cfg(kp::ProfilerState::KINETO);
  std::set<kp::ActivityType> act = {
      kp::ActivityType::CPU, kp::ActivityType::CUDA};
  torch::autograd::profiler::prepareProfiler(cfg, act);
  torch::autograd::profiler::enableProfiler(cfg, act);
}
inline void trace_stop(const char* path) {
  torch::autograd::profiler::disableProfiler()->save(path);
}
} // namespace orchard::bench
