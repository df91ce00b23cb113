// Seconds on a monotonic clock, for timing steps, stages and timeouts.
#pragma once

#include <chrono>

namespace orchard {

inline double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

} // namespace orchard
