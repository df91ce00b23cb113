// orchard doctor: the diagnosis on simulated machines (pure), and the real
// measurements on this machine's CPU.
#include "core/blas_kernels.h"
#include "core/doctor.h"
#include "core/error.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

namespace orchard {
namespace {

MachineFacts linux_cpu() {
  MachineFacts m;
  m.os = "linux";
  m.arch = "x86_64";
  m.ram_total_bytes = m.ram_available_bytes = 24 * kGiB;
  return m;
}

DeviceCheck passed(
    const MachineFacts& m,
    const std::string& dev,
    double gflops) {
  DeviceCheck c;
  c.info = resolve_device(dev, m);
  c.matmul_gflops = gflops;
  c.step_ran = true;
  c.max_diff_vs_cpu = dev == "cpu" ? 0 : 1e-6;
  return c;
}

DoctorReport report(const MachineFacts& m, std::vector<DeviceCheck> devices) {
  DoctorReport r;
  r.machine = m;
  r.blas = "test BLAS";
  r.devices = std::move(devices);
  diagnose(r, "auto");
  return r;
}

TEST(Doctor, HealthyCpuIsReady) {
  MachineFacts m = linux_cpu();
  DoctorReport r = report(m, {passed(m, "cpu", 200)});
  ASSERT_TRUE(r.ready.has_value());
  EXPECT_EQ(r.ready->kind, "cpu");
  EXPECT_TRUE(r.problems.empty());
  EXPECT_NE(
      render(r).find("Ready to train on CPU (x86_64) (cpu)"),
      std::string::npos);
}

TEST(Doctor, ReferenceBlasBlocksCpuTrainingWithTheFix) {
  MachineFacts m = linux_cpu();
  DoctorReport r = report(m, {passed(m, "cpu", 5.7)});
  EXPECT_FALSE(r.ready.has_value());
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_TRUE(r.problems[0].blocking);
  EXPECT_NE(r.problems[0].fix.find("libopenblas0-openmp"), std::string::npos);
  std::string text = render(r);
  EXPECT_NE(
      text.find("Problem: Matrix products on the CPU run at 5.7"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("Not ready"), std::string::npos);
}

TEST(Doctor, SlowCpuIsOnlyAWarningWhenTrainingOnCuda) {
  MachineFacts m = linux_cpu();
  m.cuda_built = true;
  m.cuda.push_back({"NVIDIA H100", 80 * kGiB, 80 * kGiB});
  DoctorReport r = report(m, {passed(m, "cuda:0", 40000), passed(m, "cpu", 5)});
  ASSERT_TRUE(r.ready.has_value());
  EXPECT_EQ(r.ready->kind, "cuda");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_FALSE(r.problems[0].blocking);
  EXPECT_NE(render(r).find("Warning: Matrix products"), std::string::npos);
}

TEST(Doctor, WrongDeviceResultsBlock) {
  MachineFacts m = linux_cpu();
  m.cuda_built = true;
  m.cuda.push_back({"Broken GPU", 8 * kGiB, 8 * kGiB});
  DeviceCheck bad = passed(m, "cuda:0", 1000);
  bad.max_diff_vs_cpu = 0.5;
  DoctorReport r = report(m, {bad, passed(m, "cpu", 200)});
  EXPECT_FALSE(r.ready.has_value());
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(
      r.problems[0].what.find("differs from the CPU's"), std::string::npos);

  DeviceCheck failed = passed(m, "cuda:0", 1000);
  failed.step_ran = false;
  failed.error = "CUDA error: no kernel image is available";
  r = report(m, {failed, passed(m, "cpu", 200)});
  EXPECT_FALSE(r.ready.has_value());
  EXPECT_NE(r.problems[0].what.find("no kernel image"), std::string::npos);
}

TEST(Doctor, RosettaOnAMacIsAProblemWithTheFix) {
  MachineFacts m = simulated_machine("mps", 16);
  m.mps_available = false;
  m.rosetta = true;
  m.arch = "x86_64";
  DoctorReport r = report(m, {passed(m, "cpu", 100)});
  EXPECT_FALSE(r.ready.has_value());
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].what.find("Rosetta"), std::string::npos);
  EXPECT_NE(r.problems[0].fix.find("arch -arm64"), std::string::npos);
}

TEST(Doctor, AppleSiliconWithoutMpsIsAProblem) {
  MachineFacts m = simulated_machine("mps", 32);
  m.mps_available = false;
  m.mps_built = false;
  DoctorReport r = report(m, {passed(m, "cpu", 300)});
  EXPECT_FALSE(r.ready.has_value());
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].what.find("No MPS device"), std::string::npos);
  EXPECT_NE(r.problems[0].fix.find("brew install pytorch"), std::string::npos);
}

TEST(Doctor, HealthyMacIsReadyOnMps) {
  MachineFacts m = simulated_machine("mps", 64);
  DoctorReport r = report(m, {passed(m, "mps", 3000), passed(m, "cpu", 300)});
  ASSERT_TRUE(r.ready.has_value());
  EXPECT_EQ(r.ready->kind, "mps");
  std::string text = render(r);
  EXPECT_NE(text.find("PYTORCH_ENABLE_MPS_FALLBACK=unset"), std::string::npos)
      << text;
  EXPECT_NE(text.find("64.0 GiB unified"), std::string::npos) << text;
}

TEST(Doctor, RequestedUnavailableDeviceIsAProblem) {
  MachineFacts m = linux_cpu();
  DoctorReport r;
  r.machine = m;
  r.devices = {passed(m, "cpu", 200)};
  diagnose(r, "cuda");
  EXPECT_FALSE(r.ready.has_value());
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].what.find("not available"), std::string::npos);
}

// The real measurements on this machine's CPU.
TEST(Doctor, MeasuresThisCpu) {
  torch::Device cpu(torch::kCPU);
  double gflops = measure_matmul_gflops(cpu);
  EXPECT_GT(gflops, 0.1);
  DeviceCheck c;
  c.info = resolve_device("cpu", linux_cpu());
  check_training_step(c);
  EXPECT_TRUE(c.step_ran) << c.error;
  EXPECT_EQ(c.max_diff_vs_cpu, 0.0); // deterministic on one device
  EXPECT_FALSE(detect_blas().empty());
}

// OpenBLAS's generic fallback (Prescott) is replaced by the best kernels
// the CPU runs; kernels OpenBLAS chose for a CPU it knows are left alone.
TEST(Doctor, GenericOpenBlasKernelsAreReplacedWhereTheCpuRunsBetter) {
  EXPECT_EQ(better_blas_core("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(better_blas_core("prescott", false, true), "Haswell");
  EXPECT_EQ(better_blas_core("Prescott", false, false), "");
  for (const char* known : {"Haswell", "SkylakeX", "Zen", "Cooperlake", ""})
    EXPECT_EQ(better_blas_core(known, true, true), "") << known;
}

} // namespace
} // namespace orchard
