// Device choice: `--device auto|cuda|cuda:N|mps|cpu` resolved against the
// facts of a machine (detected or simulated). `auto` prefers CUDA, then MPS,
// then the CPU, and the result always carries a sentence saying why, which
// every command prints as `Using device: <name> (<why>)`.
#pragma once

#include "core/machine.h"

#include <c10/core/Device.h>

#include <string>
#include <vector>

namespace orchard {

struct DeviceInfo {
  c10::Device device{c10::DeviceType::CPU};
  std::string kind; // "cuda", "mps" or "cpu"
  std::string name; // "NVIDIA H100 80GB HBM3", "Apple M2 Max", "CPU (x86_64)"
  std::string why;  // "auto: CUDA is available"
  uint64_t total_memory = 0; // memory the device computes from
  uint64_t free_memory = 0;
  bool unified_memory = false; // MPS: the GPU shares system RAM
  int compute_capability = 0;  // CUDA: 80 for sm_80 (Ampere); 0 unknown
};

// Throws UserError (exit 2) for a malformed request or an unavailable device;
// the message lists what this machine does have.
DeviceInfo resolve_device(const std::string& request, const MachineFacts& m);

// "cuda:0 (NVIDIA H100 80GB HBM3), cpu"
std::string available_devices(const MachineFacts& m);

// "Using device: NVIDIA H100 80GB HBM3 (auto: CUDA is available)"
std::string using_device_line(const DeviceInfo& d);

// Warnings about the platform to print before work starts: Rosetta, the MPS
// CPU fallback. Each says what it costs and how to fix it.
std::vector<std::string> platform_notes(const MachineFacts& m);

// Multi-process training on MPS: PyTorch has no collective backend for
// Apple GPUs. Throws UserError there when world_size > 1.
void check_distributed_supported(const DeviceInfo& d, int world_size);

// Of several processes on one host, the one with this LOCAL_RANK: on CUDA,
// GPU `local_rank` with its own name and memory (what the memory planner
// reads), or the only GPU a process sees (each rank given its own by
// CUDA_VISIBLE_DEVICES, as Slurm's --gpus-per-task does), else `d`
// unchanged. Throws UserError when this host has too few GPUs for that
// rank.
DeviceInfo device_of_local_rank(
    const DeviceInfo& d,
    const MachineFacts& m,
    int local_rank);

} // namespace orchard
