// System memory detection from fake /proc and /sys trees: meminfo alone,
// cgroup v1 and v2 limits (at the process's cgroup and at a parent), and
// the MEMORY_SIZE override.
#include "core/error.h"
#include "core/machine.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>

namespace orchard {
namespace {

using test::env_of;
using test::TempDir;

const char* kMeminfo =
    "MemTotal:       32768000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:   30000000 kB\n";

SystemMemory probe(
    const TempDir& root,
    std::map<std::string, std::string> env = {}) {
  return probe_system_memory({root.path().string(), env_of(std::move(env))});
}

TEST(Memory, MeminfoWithoutCgroup) {
  TempDir root;
  root.write("proc/meminfo", kMeminfo);
  SystemMemory m = probe(root);
  EXPECT_EQ(m.total_bytes, 32768000ull * 1024);
  EXPECT_EQ(m.available_bytes, 30000000ull * 1024);
  EXPECT_EQ(m.source, "/proc/meminfo");
}

TEST(Memory, CgroupV2LimitWins) {
  TempDir root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/job/step\n");
  root.write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
  root.write("sys/fs/cgroup/job/step/memory.max", "max\n");
  root.write("sys/fs/cgroup/job/memory.max", std::to_string(8 * kGiB) + "\n");
  root.write(
      "sys/fs/cgroup/job/step/memory.current", std::to_string(kGiB) + "\n");
  SystemMemory m = probe(root);
  EXPECT_EQ(m.total_bytes, 8 * kGiB); // the parent's limit applies
  EXPECT_EQ(m.available_bytes, 7 * kGiB);
  EXPECT_EQ(m.source, "cgroup v2 limit");
}

TEST(Memory, CgroupV2WithoutLimitKeepsMeminfo) {
  TempDir root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/\n");
  root.write("sys/fs/cgroup/cgroup.controllers", "memory\n");
  root.write("sys/fs/cgroup/memory.max", "max\n");
  SystemMemory m = probe(root);
  EXPECT_EQ(m.total_bytes, 32768000ull * 1024);
  EXPECT_EQ(m.source, "/proc/meminfo");
}

TEST(Memory, CgroupV1Limit) {
  TempDir root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "5:memory:/docker/abc\n3:cpu:/\n");
  root.write(
      "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
      std::to_string(4 * kGiB) + "\n");
  root.write(
      "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes",
      std::to_string(3 * kGiB) + "\n");
  // The root of v1 reports "no limit" as a huge number.
  root.write(
      "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  SystemMemory m = probe(root);
  EXPECT_EQ(m.total_bytes, 4 * kGiB);
  EXPECT_EQ(m.available_bytes, kGiB);
  EXPECT_EQ(m.source, "cgroup v1 limit");
}

TEST(Memory, LimitAboveRamIsIgnored) {
  TempDir root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/\n");
  root.write("sys/fs/cgroup/cgroup.controllers", "memory\n");
  root.write("sys/fs/cgroup/memory.max", std::to_string(512 * kGiB) + "\n");
  EXPECT_EQ(probe(root).source, "/proc/meminfo");
}

TEST(Memory, MemorySizeOverrides) {
  TempDir root;
  root.write("proc/meminfo", kMeminfo);
  SystemMemory m = probe(root, {{"MEMORY_SIZE", "64"}});
  EXPECT_EQ(m.total_bytes, 64 * kGiB);
  EXPECT_EQ(m.available_bytes, 64 * kGiB);
  EXPECT_EQ(m.source, "MEMORY_SIZE=64");
  EXPECT_EQ(probe(root, {{"MEMORY_SIZE", "0.5"}}).total_bytes, kGiB / 2);
  for (std::string bad : {"", "lots", "-4", "0", "64GB"}) {
    try {
      probe(root, {{"MEMORY_SIZE", bad}});
      ADD_FAILURE() << "MEMORY_SIZE=" << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("MEMORY_SIZE"), std::string::npos);
    }
  }
}

TEST(Memory, RealMachineReportsSomething) {
  SystemMemory m = probe_system_memory();
  EXPECT_GT(m.total_bytes, 256ull * 1024 * 1024);
  EXPECT_LE(m.available_bytes, m.total_bytes);
  EXPECT_FALSE(m.source.empty());
}

// A tensor freed and made again, step after step, comes to reuse the same
// pages: after a few steps (glibc's aligned blocks settle into its bins)
// ten more fault almost none in. glibc on its own maps a 64 MiB block
// afresh every time (above its moving threshold's 32 MiB cap): 16,384
// page faults a step.
TEST(Memory, AllocatorKeepsFreedPagesForTheNextStep) {
  if (!configure_allocator())
    GTEST_SKIP() << "not glibc's malloc";
  const int64_t floats = 16 << 20; // 64 MiB
  auto step = [&] {
    return torch::empty({floats}, torch::kFloat)
        .fill_(1.0f)
        .sum()
        .item<float>();
  };
  auto faults = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
  };
  for (int i = 0; i < 20; ++i)
    step();
  const long before = faults();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(step(), float(floats));
  EXPECT_LT(faults() - before, 2000) << "pages faulted in again";
}

TEST(Memory, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(16 * kGiB), "16.0 GiB");
}

} // namespace
} // namespace orchard
