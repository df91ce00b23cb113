// Device choice on simulated machines: a CUDA box, a CPU-only box, Apple
// Silicon Macs of 16-128 GB, and a Mac build running under Rosetta.
#include "core/device.h"
#include "core/error.h"

#include <gtest/gtest.h>

namespace orchard {
namespace {

MachineFacts cuda_box(int gpus = 1) {
  MachineFacts m;
  m.os = "linux";
  m.arch = "x86_64";
  m.cuda_built = true;
  for (int i = 0; i < gpus; ++i)
    m.cuda.push_back({"NVIDIA H100 80GB HBM3", 80 * kGiB, 79 * kGiB});
  m.ram_total_bytes = m.ram_available_bytes = 128 * kGiB;
  return m;
}

MachineFacts cpu_box() {
  MachineFacts m;
  m.os = "linux";
  m.arch = "x86_64";
  m.ram_total_bytes = 24 * kGiB;
  m.ram_available_bytes = 20 * kGiB;
  return m;
}

MachineFacts mac(int gb) {
  MachineFacts m = simulated_machine("mps", gb);
  m.mps_chip = "Apple M2 Max";
  return m;
}

std::string error_of(const std::string& request, const MachineFacts& m) {
  try {
    resolve_device(request, m);
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    return e.what();
  }
  return "";
}

TEST(Device, AutoPrefersCudaThenMpsThenCpu) {
  DeviceInfo d = resolve_device("auto", cuda_box());
  EXPECT_EQ(d.kind, "cuda");
  EXPECT_EQ(d.device.str(), "cuda:0");
  EXPECT_EQ(
      using_device_line(d),
      "Using device: NVIDIA H100 80GB HBM3 (auto: CUDA is available)");
  EXPECT_EQ(d.total_memory, 80 * kGiB);

  d = resolve_device("auto", mac(32));
  EXPECT_EQ(d.kind, "mps");
  EXPECT_TRUE(d.unified_memory);
  EXPECT_EQ(d.total_memory, 32 * kGiB);
  EXPECT_EQ(
      using_device_line(d),
      "Using device: Apple M2 Max (MPS) (auto: Apple Silicon GPU through MPS)");

  d = resolve_device("", cpu_box());
  EXPECT_EQ(d.kind, "cpu");
  EXPECT_EQ(d.why, "auto: no CUDA GPU or MPS found");
  EXPECT_EQ(d.total_memory, 24 * kGiB);
  EXPECT_EQ(d.free_memory, 20 * kGiB);
}

TEST(Device, ExplicitChoices) {
  EXPECT_EQ(resolve_device("cpu", cuda_box()).kind, "cpu");
  EXPECT_EQ(resolve_device("cuda:1", cuda_box(2)).device.index(), 1);
  EXPECT_EQ(resolve_device("cuda", cuda_box(2)).device.index(), 0);
  EXPECT_EQ(resolve_device("mps", mac(16)).device.str(), "mps");
}

TEST(Device, UnavailableDeviceListsTheAvailableOnes) {
  std::string e = error_of("cuda", cpu_box());
  EXPECT_NE(e.find("Device 'cuda' is not available"), std::string::npos) << e;
  EXPECT_NE(e.find("built without CUDA"), std::string::npos) << e;
  EXPECT_NE(e.find("Available devices: cpu."), std::string::npos) << e;

  e = error_of("mps", cuda_box());
  EXPECT_NE(e.find("only on macOS"), std::string::npos) << e;
  EXPECT_NE(
      e.find("Available devices: cuda:0 (NVIDIA H100 80GB HBM3), cpu"),
      std::string::npos)
      << e;

  e = error_of("cuda:2", cuda_box(2));
  EXPECT_NE(e.find("has 2 CUDA GPU(s)"), std::string::npos) << e;

  e = error_of("cuda:x", cuda_box());
  EXPECT_NE(e.find("cuda:N"), std::string::npos) << e;
  e = error_of("gpu", cuda_box());
  EXPECT_NE(e.find("use auto, cuda, cuda:N, mps or cpu"), std::string::npos)
      << e;
}

TEST(Device, RosettaExplainsMissingMpsAndWarns) {
  MachineFacts m = mac(16);
  m.mps_available = false;
  m.rosetta = true;
  m.arch = "x86_64";
  EXPECT_EQ(resolve_device("auto", m).kind, "cpu");
  std::string e = error_of("mps", m);
  EXPECT_NE(e.find("Rosetta"), std::string::npos) << e;
  auto notes = platform_notes(m);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("arch -arm64"), std::string::npos);
}

TEST(Device, MpsFallbackIsReported) {
  MachineFacts m = mac(64);
  auto notes = platform_notes(m);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(
      notes[0].find("PYTORCH_ENABLE_MPS_FALLBACK is not set"),
      std::string::npos);
  m.mps_fallback = true;
  notes = platform_notes(m);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("PYTORCH_ENABLE_MPS_FALLBACK=1"), std::string::npos);
  EXPECT_TRUE(platform_notes(cpu_box()).empty());
}

// MPS refuses more than one process (PyTorch has no collective backend for
// Apple GPUs); the CPU (Gloo) and CUDA (NCCL) go on to src/dist.
TEST(Device, MultiProcessTrainingRefusedOnMpsOnly) {
  DeviceInfo d = resolve_device("mps", mac(128));
  try {
    check_distributed_supported(d, 2);
    FAIL() << "expected a refusal";
  } catch (const UserError& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind(
            "Distributed training is not supported on MPS", 0),
        0u);
  }
  EXPECT_NO_THROW(check_distributed_supported(d, 1));
  for (const DeviceInfo& other :
       {resolve_device("cpu", mac(16)), resolve_device("cuda", cuda_box(2))}) {
    EXPECT_NO_THROW(check_distributed_supported(other, 1));
    EXPECT_NO_THROW(check_distributed_supported(other, 2));
  }
}

// Of several processes, each plans with its own GPU's memory: GPU 1 here
// is half full, and rank 1 must see that, not GPU 0's free memory.
TEST(Device, EachLocalRankGetsItsOwnGpusFacts) {
  MachineFacts m = cuda_box(2);
  m.cuda[1] = {"NVIDIA H200", 141 * kGiB, 70 * kGiB, 90};
  const DeviceInfo chosen = resolve_device("auto", m);
  const DeviceInfo rank1 = device_of_local_rank(chosen, m, 1);
  EXPECT_EQ(rank1.device, c10::Device(c10::DeviceType::CUDA, 1));
  EXPECT_EQ(rank1.name, "NVIDIA H200");
  EXPECT_EQ(rank1.total_memory, 141 * kGiB);
  EXPECT_EQ(rank1.free_memory, 70 * kGiB);
  EXPECT_EQ(rank1.compute_capability, 90);
  EXPECT_NE(rank1.why.find("LOCAL_RANK=1"), std::string::npos) << rank1.why;
  const DeviceInfo rank0 = device_of_local_rank(chosen, m, 0);
  EXPECT_EQ(rank0.device, c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_EQ(rank0.free_memory, 79 * kGiB);
  try {
    device_of_local_rank(chosen, m, 2);
    FAIL() << "expected a refusal";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(
        std::string(e.what()).find("LOCAL_RANK=2 but this machine has 2 GPU"),
        std::string::npos)
        << e.what();
  }
  // One GPU visible to each process (Slurm's --gpus-per-task): rank 3
  // takes it (two ranks sharing one are refused when they join).
  const MachineFacts one = cuda_box(1);
  const DeviceInfo bound =
      device_of_local_rank(resolve_device("auto", one), one, 3);
  EXPECT_EQ(bound.device, c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_NE(
      bound.why.find("LOCAL_RANK=3 on the one GPU this process sees"),
      std::string::npos)
      << bound.why;
  // Gloo on the CPU: every rank shares the one device.
  const DeviceInfo cpu = resolve_device("cpu", m);
  EXPECT_EQ(device_of_local_rank(cpu, m, 1).device, cpu.device);
  EXPECT_EQ(device_of_local_rank(cpu, m, 1).free_memory, cpu.free_memory);
}

TEST(Device, SimulatedMachines) {
  for (int gb : {16, 32, 64, 128}) {
    MachineFacts m = simulated_machine("mps", gb);
    EXPECT_TRUE(m.simulated);
    DeviceInfo d = resolve_device("auto", m);
    EXPECT_EQ(d.kind, "mps");
    EXPECT_EQ(d.total_memory, uint64_t(gb) * kGiB);
  }
  MachineFacts c = simulated_machine("cuda", 24);
  EXPECT_EQ(resolve_device("auto", c).total_memory, 24 * kGiB);
  EXPECT_EQ(resolve_device("auto", simulated_machine("cpu", 8)).kind, "cpu");
  EXPECT_THROW(simulated_machine("tpu", 8), UserError);
  EXPECT_THROW(simulated_machine("mps", 0), UserError);
}

} // namespace
} // namespace orchard
