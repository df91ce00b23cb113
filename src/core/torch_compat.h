// Differences between the libtorch versions Orchard builds against: Debian 12's
// 1.13 (CPU, what CI has) and PyTorch 2.x (CUDA; Homebrew on macOS). Every
// `#if` on the torch version lives here, so the rest of the code reads as if
// there were one libtorch.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdint>
#include <string>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/mps.h>
#endif

// Not a compile-time difference, but one of linking: PyTorch 2.x's
// libtorch.so exports std::filesystem::remove_all, which then replaces the
// system libstdc++'s at run time and crashes. core/files.h's remove_tree is
// the replacement; never call std::filesystem::remove_all.

namespace orchard::compat {

constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

inline std::string torch_version() {
  return TORCH_VERSION;
}

// MPS: 1.13 has no torch::mps namespace; the global context knows whether the
// MPS backend was compiled in and a Metal device exists.
inline bool mps_available() {
#if TORCH_VERSION_MAJOR >= 2
  return torch::mps::is_available();
#else
  return at::hasMPS();
#endif
}

// Whether this libtorch was compiled with the MPS backend at all (true on
// Homebrew's arm64 pytorch even when no Metal device is usable).
inline bool mps_built() {
  return at::hasMPS() || mps_available();
}

inline void mps_synchronize() {
#if TORCH_VERSION_MAJOR >= 2
  if (mps_available())
    torch::mps::synchronize();
#endif
}

// Waits for queued work on `device` so wall-clock timings mean something.
inline void synchronize(const torch::Device& device) {
  if (device.is_cuda())
    torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
  else if (device.is_mps())
    mps_synchronize();
}

} // namespace orchard::compat
