// When a kernel may be launched before the previous one ends (numeric.cuh:
// launch_dependent). Decided once per kernel and device.
#include "ops/cuda/numeric.cuh"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace orchard::ops::cuda {
namespace {

// Compiled as every kernel here is: what it allows, they allow.
__global__ void probe_kernel() {}

} // namespace

bool dependent_launch_usable(const void* kernel) {
  static const bool wanted = [] {
    const char* v = std::getenv("ORCHARD_PDL");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  if (!wanted)
    return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return false;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  if (auto it = known.find(key); it != known.end())
    return it->second;
  int major = 0;
  cudaFuncAttributes compiled{};
  // ptxVersion is the virtual architecture the running code came from:
  // below 90 the kernel has no griddepcontrol.wait and must not start early.
  const bool usable =
      cudaDeviceGetAttribute(
          &major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major >= 9 && cudaFuncGetAttributes(&compiled, kernel) == cudaSuccess &&
      compiled.ptxVersion >= 90 && compiled.binaryVersion >= 90;
  if (!usable)
    (void)cudaGetLastError(); // a failed query is not the launch's error
  known[key] = usable;
  return usable;
}

bool dependent_launch_active() {
  return dependent_launch_usable(reinterpret_cast<const void*>(probe_kernel));
}

} // namespace orchard::ops::cuda
