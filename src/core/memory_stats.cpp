#include "core/memory_stats.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/torch_compat.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#if defined(ORCHARD_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/detail/MPSHooksInterface.h>
#endif

namespace orchard {
namespace {

uint64_t g_mps_peak = 0;

// A "Vm...:  1234 kB" line of /proc/self/status, in bytes; 0 if absent.
uint64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0)
      return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}

} // namespace

MemoryReading read_memory(const c10::Device& device) {
  MemoryReading r;
  if (device.is_cuda()) {
    r.what = "CUDA allocator";
#if defined(ORCHARD_WITH_CUDA)
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        device.index() < 0 ? 0 : device.index());
    const auto& all = stats.allocated_bytes[0]; // StatType::AGGREGATE
    r.current = uint64_t(all.current);
    r.peak = uint64_t(all.peak);
#endif
    return r;
  }
  if (device.is_mps()) {
    r.what = "MPS driver";
#if TORCH_VERSION_MAJOR >= 2
    if (compat::mps_available()) {
      r.current =
          uint64_t(at::detail::getMPSHooks().getDriverAllocatedMemory());
      g_mps_peak = std::max(g_mps_peak, r.current);
      r.peak = g_mps_peak;
    }
#endif
    return r;
  }
  r.what = "process RSS";
  r.current = proc_status_bytes("VmRSS");
  r.peak = proc_status_bytes("VmHWM");
  if (r.peak == 0) { // not Linux: getrusage's peak (bytes on macOS)
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
#if defined(__APPLE__)
    r.peak = uint64_t(ru.ru_maxrss);
#else
    r.peak = uint64_t(ru.ru_maxrss) * 1024;
#endif
  }
  return r;
}

bool is_out_of_memory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e))
    return true;
  const std::string m = e.what_without_backtrace();
  return m.find("out of memory") != std::string::npos ||
      m.find("Out of memory") != std::string::npos;
}

void fix_host_allocator() {
#if defined(__GLIBC__)
  // Setting the threshold also turns off glibc's dynamic adjustment of it
  // (mallopt(3)); 4 MB keeps small tensors and buffers on the heap.
  constexpr int kMmapThreshold = 4 << 20;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
#endif
}

void trim_host_heap(const c10::Device& device) {
#if defined(__GLIBC__)
  if (device.is_cpu())
    malloc_trim(0);
#endif
}

bool reset_peak_memory(const c10::Device& device) {
  if (device.is_cuda()) {
#if defined(ORCHARD_WITH_CUDA)
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        device.index() < 0 ? 0 : device.index());
    return true;
#else
    return false;
#endif
  }
  if (device.is_mps()) {
    g_mps_peak = 0;
    return true;
  }
  // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux 4.0+).
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return bool(clear);
}

} // namespace orchard
