// How much memory training uses on a device, now and at its peak:
//   CUDA  the caching allocator's bytes in live tensors (exact)
//   MPS   the Metal driver's allocation for this process (PyTorch's
//         torch.mps.driver_allocated_memory); no peak is kept by the
//         driver, so the peak is the largest value read
//   CPU   the process's resident set (VmRSS, peak VmHWM on Linux; the
//         peak can be reset through /proc/self/clear_refs)
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

namespace orchard {

struct MemoryReading {
  uint64_t current = 0, peak = 0;
  std::string what; // "CUDA allocator", "MPS driver", "process RSS"
};

MemoryReading read_memory(const c10::Device& device);

// Makes host memory use repeatable (glibc): blocks of 4 MB and more are
// mapped and unmapped on their own instead of glibc raising its threshold as
// the run frees large blocks, which left the resident set of the same step
// 25 % higher or lower depending on what the process had done before. The
// planner's CPU figures were calibrated with it and `plan --probe` calls
// it. Training does not: every large tensor then costs fresh pages at every
// step, which made `orchard train` 2.4x slower on a 2-core CPU (42 % of
// its time in page faults) than glibc's own adaptive threshold.
void fix_host_allocator();

// On the CPU (glibc), hands memory freed by earlier work back to the
// system, so the resident set starts from what is really in use; a no-op
// elsewhere.
void trim_host_heap(const c10::Device& device);

// Starts a new peak from the current value (where the device allows it;
// returns false where it cannot, e.g. RSS on macOS).
bool reset_peak_memory(const c10::Device& device);

// Whether a libtorch error is a device allocation failure: CUDA's and MPS's
// allocators throw c10::OutOfMemoryError; older paths a c10::Error saying so.
bool is_out_of_memory(const c10::Error& e);

} // namespace orchard
