#include "core/device.h"

#include "core/error.h"

#include <cstdlib>
#include <sstream>

namespace orchard {
namespace {

DeviceInfo cuda_device(const MachineFacts& m, int index, std::string why) {
  DeviceInfo d;
  d.device = c10::Device(c10::DeviceType::CUDA, static_cast<int8_t>(index));
  d.kind = "cuda";
  d.name = m.cuda[index].name;
  d.total_memory = m.cuda[index].total_bytes;
  d.free_memory = m.cuda[index].free_bytes;
  d.compute_capability = m.cuda[index].compute_capability;
  d.why = std::move(why);
  return d;
}

DeviceInfo mps_device(const MachineFacts& m, std::string why) {
  DeviceInfo d;
  d.device = c10::Device(c10::DeviceType::MPS);
  d.kind = "mps";
  d.name = m.mps_chip.empty() ? "Apple GPU (MPS)" : m.mps_chip + " (MPS)";
  d.total_memory = m.ram_total_bytes;
  d.free_memory = m.ram_available_bytes;
  d.unified_memory = true;
  d.why = std::move(why);
  return d;
}

DeviceInfo cpu_device(const MachineFacts& m, std::string why) {
  DeviceInfo d;
  d.device = c10::Device(c10::DeviceType::CPU);
  d.kind = "cpu";
  d.name = "CPU" + (m.arch.empty() ? "" : " (" + m.arch + ")");
  d.total_memory = m.ram_total_bytes;
  d.free_memory = m.ram_available_bytes;
  d.why = std::move(why);
  return d;
}

std::string why_no_cuda(const MachineFacts& m) {
  if (!m.cuda_built)
    return "this libtorch was built without CUDA (Debian's libtorch is "
           "CPU-only; build against a CUDA PyTorch: ./orchard.sh build picks "
           "it up when `python3 -c 'import torch'` works)";
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"))
    return std::string("no CUDA GPU is visible (CUDA_VISIBLE_DEVICES='") + v +
        "')";
  return "no CUDA GPU was found (check `nvidia-smi` and the driver)";
}

std::string why_no_mps(const MachineFacts& m) {
  if (m.rosetta)
    return "this process runs under Rosetta 2 (x86_64), which cannot reach "
           "Metal; rebuild with the arm64 Homebrew in /opt/homebrew";
  if (m.os != "macos")
    return "MPS exists only on macOS with Apple Silicon";
  if (!m.mps_built)
    return "this libtorch was built without MPS (install Homebrew's "
           "pytorch on an arm64 Mac)";
  return "macOS reports no Metal device (MPS needs macOS 12.3+ on Apple "
         "Silicon)";
}

[[noreturn]] void unavailable(
    const std::string& request,
    const std::string& reason,
    const MachineFacts& m) {
  throw UserError(
      "Device '" + request + "' is not available: " + reason +
      ".\n  Available devices: " + available_devices(m) +
      ". Use --device auto to pick the best one.");
}

} // namespace

DeviceInfo resolve_device(const std::string& request, const MachineFacts& m) {
  if (request.empty() || request == "auto") {
    if (!m.cuda.empty())
      return cuda_device(m, 0, "auto: CUDA is available");
    if (m.mps_available)
      return mps_device(m, "auto: Apple Silicon GPU through MPS");
    std::string why = "auto: no CUDA GPU";
    why += m.os == "macos" ? " and MPS is not available" : " or MPS found";
    return cpu_device(m, why);
  }
  if (request == "cpu")
    return cpu_device(m, "requested");
  if (request == "mps") {
    if (!m.mps_available)
      unavailable(request, why_no_mps(m), m);
    return mps_device(m, "requested");
  }
  if (request == "cuda" || request.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (request.size() > 5) {
      std::string digits = request.substr(5);
      char* end = nullptr;
      long v = std::strtol(digits.c_str(), &end, 10);
      if (digits.empty() || *end != '\0' || v < 0)
        throw UserError(
            "--device '" + request +
            "' is not a valid CUDA device; write cuda or cuda:N with N a GPU "
            "index (0, 1, …).");
      index = static_cast<int>(v);
    }
    if (m.cuda.empty())
      unavailable(request, why_no_cuda(m), m);
    if (index >= static_cast<int>(m.cuda.size()))
      unavailable(
          request,
          "this machine has " + std::to_string(m.cuda.size()) +
              " CUDA GPU(s), numbered from 0",
          m);
    return cuda_device(m, index, "requested");
  }
  throw UserError(
      "--device '" + request +
      "' is not a device; use auto, cuda, cuda:N, mps or cpu.\n  Available "
      "devices: " +
      available_devices(m) + ".");
}

std::string available_devices(const MachineFacts& m) {
  std::ostringstream out;
  for (size_t i = 0; i < m.cuda.size(); ++i)
    out << "cuda:" << i << " (" << m.cuda[i].name << "), ";
  if (m.mps_available)
    out << "mps (" << (m.mps_chip.empty() ? "Apple GPU" : m.mps_chip) << "), ";
  out << "cpu";
  return out.str();
}

std::string using_device_line(const DeviceInfo& d) {
  return "Using device: " + d.name + " (" + d.why + ")";
}

std::vector<std::string> platform_notes(const MachineFacts& m) {
  std::vector<std::string> notes;
  if (m.rosetta)
    notes.push_back(
        "Warning: Orchard is running under Rosetta 2 (an x86_64 build on "
        "Apple Silicon). MPS is unreachable and the CPU path is 2-3x slower. "
        "Fix: install the arm64 Homebrew (/opt/homebrew), then "
        "`rm -rf build && arch -arm64 ./orchard.sh build`.");
  if (m.mps_available && m.mps_fallback)
    notes.push_back(
        "PYTORCH_ENABLE_MPS_FALLBACK=1: operations MPS lacks run on the CPU "
        "(slower, but they do not fail).");
  else if (m.mps_available)
    notes.push_back(
        "PYTORCH_ENABLE_MPS_FALLBACK is not set: an operation MPS lacks "
        "stops the run; set PYTORCH_ENABLE_MPS_FALLBACK=1 to run it on the "
        "CPU instead.");
  return notes;
}

void check_distributed_supported(const DeviceInfo& d, int world_size) {
  if (world_size <= 1)
    return;
  if (d.kind == "mps")
    throw UserError(
        "Distributed training is not supported on MPS (WORLD_SIZE=" +
        std::to_string(world_size) +
        "): PyTorch has no collective backend for Apple GPUs.\n  Run a single "
        "process (unset WORLD_SIZE).");
}

DeviceInfo device_of_local_rank(
    const DeviceInfo& d,
    const MachineFacts& m,
    int local_rank) {
  if (!d.device.is_cuda())
    return d;
  const int gpus = static_cast<int>(m.cuda.size());
  // One GPU visible to a rank past the first: its launcher gave each
  // process its own (Slurm's --gpus-per-task, CUDA_VISIBLE_DEVICES per
  // rank). Where it did not, the ranks find they share it when they join
  // (dist::init) and say so.
  if (gpus == 1 && local_rank > 0)
    return cuda_device(
        m,
        0,
        d.why + ", LOCAL_RANK=" + std::to_string(local_rank) +
            " on the one GPU this process sees");
  if (local_rank < 0 || local_rank >= gpus)
    throw UserError(
        "LOCAL_RANK=" + std::to_string(local_rank) + " but this machine has " +
        std::to_string(gpus) + " GPU(s): start at most " +
        std::to_string(gpus) + " processes per node (--nproc-per-node " +
        std::to_string(gpus) + "), or set CUDA_VISIBLE_DEVICES.");
  return cuda_device(
      m, local_rank, d.why + ", LOCAL_RANK=" + std::to_string(local_rank));
}

} // namespace orchard
