// What the machine has: accelerators, memory, and the platform quirks that
// change how Orchard must run (Rosetta, the MPS CPU fallback).
//
// Detection produces a plain `MachineFacts` value. Everything downstream
// (device choice, the memory planner, `orchard doctor`) reads only that value,
// so tests can hand in a 16 GB Apple Silicon Mac or an 80 GB CUDA box, and the
// command line can plan for a machine it is not on
// (`--assume-device mps --memory-gb 64`).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace orchard {

constexpr uint64_t kGiB = 1024ull * 1024 * 1024;

struct GpuFacts {
  std::string name; // "NVIDIA H100 80GB HBM3"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int compute_capability = 0; // 90 for sm_90; 0 when unknown
};

struct MachineFacts {
  std::string os;   // "linux", "macos", other
  std::string arch; // "x86_64", "arm64"

  // System memory. `ram_total_bytes` is what this process may use: the cgroup
  // limit when one is set, otherwise physical RAM (or MEMORY_SIZE).
  uint64_t ram_total_bytes = 0;
  uint64_t ram_available_bytes = 0;
  std::string ram_source; // "/proc/meminfo", "cgroup v2 limit", ...

  std::vector<GpuFacts> cuda; // one entry per visible CUDA device
  bool cuda_built = false;    // libtorch compiled with CUDA

  bool mps_available = false;
  bool mps_built = false; // running a libtorch with the MPS backend
  std::string mps_chip;   // "Apple M2 Max"

  // macOS on Apple Silicon running an x86_64 build through Rosetta 2: MPS is
  // unreachable and everything runs several times slower.
  bool rosetta = false;
  // PYTORCH_ENABLE_MPS_FALLBACK=1: ops missing on MPS run on the CPU instead
  // of failing.
  bool mps_fallback = false;

  bool simulated = false; // built from --assume-device, not detected
};

// Reads environment variables; tests substitute a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Where /proc and /sys are read from; tests point `root` at a temporary folder
// holding fake meminfo and cgroup files.
struct MemoryProbeInputs {
  std::string root = "/";
  EnvLookup env = process_env();
};

struct SystemMemory {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
  std::string source;
};

// Linux: the cgroup v2 (memory.max) or v1 (memory.limit_in_bytes) limit when
// set and smaller than physical RAM, else MemTotal from /proc/meminfo.
// macOS: `sysctl hw.memsize`. MEMORY_SIZE=<GB> overrides both.
SystemMemory probe_system_memory(const MemoryProbeInputs& in = {});

// Everything, from the real machine.
MachineFacts probe_machine();

// A machine Orchard is not on: `kind` is "cuda", "mps" or "cpu"; memory in GB
// is unified memory for mps, GPU memory for cuda and RAM for cpu.
MachineFacts simulated_machine(const std::string& kind, double memory_gb);

std::string format_bytes(uint64_t bytes); // "15.6 GiB"

// Where prepared data (tokenizers, shards, corpora) is cached: $ORCHARD_HOME,
// else ~/.cache/orchard (XDG_CACHE_HOME respected).
std::string default_data_dir(const EnvLookup& env = process_env());

// Threads for CPU tensor work: OMP_NUM_THREADS when set, else every core the
// process may run on, shared among LOCAL_WORLD_SIZE processes when that is
// set (several processes on one node). Debian's libtorch otherwise starts
// with one thread.
// Returns the count applied.
int configure_cpu_threads(const EnvLookup& env = process_env());

// glibc's malloc keeps freed memory for the next step: blocks up to 256 MiB
// come from its heap (not a fresh mmap each time), and the heap is given
// back to the system only when 1 GiB or more is free at its top. Without
// this, every CPU step faults its activations' pages in again (the TRM
// quick preset spent two thirds of its time there). Nothing elsewhere
// (macOS's allocator keeps its own). Returns whether it was applied.
bool configure_allocator();

} // namespace orchard
