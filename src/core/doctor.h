// `orchard doctor`: is this machine ready to train, and if not, what to fix.
//
// It measures (matrix-product speed, a tiny training step on each device
// compared with the CPU) and then `diagnose` turns the measurements and the
// machine facts into problems, each with its fix. `diagnose` is pure, so
// tests feed it a Mac under Rosetta or a CPU on the reference BLAS.
#pragma once

#include "core/device.h"
#include "core/machine.h"

#include <optional>
#include <string>
#include <vector>

namespace orchard {

// Below this a 1024x1024 float32 matrix product on the CPU means the
// reference BLAS or something as slow. Measured on a 2-core x86_64 CI
// machine (2026-11-22): OpenBLAS (OpenMP) 246 GFLOP/s, the reference BLAS
// 5.7. A single modern core with OpenBLAS or Accelerate clears 50.
constexpr double kSlowCpuGflops = 20.0;

struct DeviceCheck {
  DeviceInfo info;
  std::optional<double> matmul_gflops; // 1024x1024 float32
  bool step_ran = false;      // forward, backward, AdamW step completed
  double max_diff_vs_cpu = 0; // largest |difference| over loss and weights
  std::string error;          // what failed, if anything
};

struct Problem {
  std::string what;
  std::string fix;
  bool blocking = true; // false: a warning; training still works
};

struct DoctorReport {
  MachineFacts machine;
  std::string blas; // "OpenBLAS (openmp)", "reference BLAS", ...
  std::vector<DeviceCheck> devices;
  std::vector<Problem> problems;
  std::optional<DeviceInfo> ready; // the device to train on, if usable
};

// Tolerance for a device's step against the CPU's (float32, TF32 off).
constexpr double kStepTolerance = 1e-3;

// Which BLAS this process loaded (from /proc/self/maps on Linux).
std::string detect_blas();

// Times a 1024x1024 float32 matrix product on `device`, in GFLOP/s.
double measure_matmul_gflops(const c10::Device& device);

// Runs the same tiny model (embedding, two linear layers, cross-entropy)
// through forward, backward and one AdamW step on `device` and on the CPU,
// and fills step_ran / max_diff_vs_cpu / error.
void check_training_step(DeviceCheck& check);

// Problems and the device to train on, from measurements. `requested` is
// the --device the user asked for ("auto" for the default).
void diagnose(DoctorReport& report, const std::string& requested);

// Everything: probe each device, measure, diagnose.
DoctorReport run_doctor(
    const MachineFacts& machine,
    const std::string& requested);

// The text `orchard doctor` prints, ending with "Ready to train on ..." or
// the problems.
std::string render(const DoctorReport& report);

} // namespace orchard
