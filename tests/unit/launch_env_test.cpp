// Reading a launch from torchrun's and Slurm's variables (src/dist).
#include "dist/launch_env.h"
#include "core/error.h"
#include "core/machine.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace orchard::dist {
namespace {

LaunchEnv read(const std::map<std::string, std::string>& vars) {
  return read_launch_env(
      [&](const std::string& k) -> std::optional<std::string> {
        auto it = vars.find(k);
        if (it == vars.end())
          return std::nullopt;
        return it->second;
      });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read(vars);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, OneProcessWithoutLauncherVariables) {
  EXPECT_FALSE(read({}).multi());
  EXPECT_FALSE(read({{"WORLD_SIZE", "1"}}).multi());
  // A one-task Slurm job is one process too.
  EXPECT_FALSE(read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).multi());
}

TEST(LaunchEnv, TorchrunsVariables) {
  LaunchEnv e = read(
      {{"WORLD_SIZE", "8"},
       {"RANK", "5"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"GROUP_RANK", "1"},
       {"MASTER_ADDR", "node0"},
       {"MASTER_PORT", "29400"}});
  EXPECT_TRUE(e.multi());
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_FALSE(e.agent_store);
  // torchrun's agent store: every rank a client, keys per restart.
  LaunchEnv a = read(
      {{"WORLD_SIZE", "2"},
       {"RANK", "0"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "29500"},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
       {"TORCHELASTIC_RESTART_COUNT", "3"}});
  EXPECT_TRUE(a.agent_store);
  EXPECT_EQ(a.restart_count, 3);
}

TEST(LaunchEnv, MissingOrMalformedVariablesSayWhichAndHow) {
  std::map<std::string, std::string> ok = {
      {"WORLD_SIZE", "2"},
      {"RANK", "1"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29500"}};
  for (const char* drop : {"RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    auto v = ok;
    v.erase(drop);
    std::string msg = error_of(v);
    EXPECT_NE(msg.find(std::string(drop) + " is not set"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("orchard launch"), std::string::npos) << msg;
  }
  auto v = ok;
  v["RANK"] = "2"; // not below WORLD_SIZE
  EXPECT_NE(
      error_of(v).find("RANK='2' is not a number from 0 to 1"),
      std::string::npos)
      << error_of(v);
  v = ok;
  v["MASTER_PORT"] = "http";
  EXPECT_NE(error_of(v).find("MASTER_PORT='http'"), std::string::npos);
  v = ok;
  v["WORLD_SIZE"] = "-2";
  EXPECT_NE(error_of(v).find("WORLD_SIZE='-2'"), std::string::npos);
}

TEST(LaunchEnv, SlurmAsFallback) {
  LaunchEnv e = read(
      {{"SLURM_PROCID", "3"},
       {"SLURM_NTASKS", "4"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "1"},
       {"SLURM_TASKS_PER_NODE", "2(x2)"},
       {"SLURM_JOB_NODELIST", "gpu[07-08],cpu1"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 29500);
  // torchrun's variables win over Slurm's.
  EXPECT_EQ(
      read({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"WORLD_SIZE", "1"}})
          .world,
      1);
  EXPECT_NE(
      error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})
          .find("SLURM_JOB_NODELIST"),
      std::string::npos);
}

// The hints a run ends with start the next training command as this one
// was started.
TEST(LaunchEnv, TheNextTrainingCommandIsStartedAlike) {
  EXPECT_EQ(read({}).training_command("orchard"), "orchard");
  const std::map<std::string, std::string> two = {
      {"WORLD_SIZE", "4"},
      {"RANK", "0"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"MASTER_ADDR", "h0"},
      {"MASTER_PORT", "29500"}};
  EXPECT_EQ(
      read(two).training_command("orchard"),
      "torchrun --nnodes 2 --nproc-per-node 2 --no-python orchard");
  auto launched = two;
  launched["ORCHARD_LAUNCH_AS"] = "orchard launch --nproc-per-node 2 --";
  EXPECT_EQ(
      read(launched).training_command("orchard"),
      "orchard launch --nproc-per-node 2 --");
  EXPECT_EQ(
      read({{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "2"},
            {"SLURM_JOB_NODELIST", "gpu01"}})
          .training_command("orchard"),
      "srun orchard");
}

// NCCL needs a GPU of its own for each rank: the first two ranks naming
// the same one (host and PCI address) are found.
TEST(LaunchEnv, RanksSharingAGpuAreFound) {
  EXPECT_EQ(first_shared_gpu({}), std::nullopt);
  EXPECT_EQ(
      first_shared_gpu({"a's GPU at PCI 1", "a's GPU at PCI 2"}), std::nullopt);
  // The same PCI address on two hosts is two GPUs.
  EXPECT_EQ(
      first_shared_gpu({"a's GPU at PCI 1", "b's GPU at PCI 1"}), std::nullopt);
  EXPECT_EQ(
      first_shared_gpu(
          {"a's GPU at PCI 1",
           "a's GPU at PCI 2",
           "b's GPU at PCI 1",
           "a's GPU at PCI 2",
           "a's GPU at PCI 1"}),
      std::make_optional(std::pair{1, 3}));
}

TEST(LaunchEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[01-04,07],cpu3"), "gpu01");
  EXPECT_EQ(first_slurm_host("a[3,5]b"), "a3b");
}

// `orchard launch --nproc-per-node`: a number, or one process per GPU.
TEST(LaunchEnv, ProcessesPerNodeFromANumberGpuOrAuto) {
  EXPECT_EQ(processes_per_node("3", 8).processes, 3);
  EXPECT_EQ(processes_per_node("3", 8).why, "");
  EXPECT_EQ(processes_per_node("1024", 0).processes, 1024);
  const auto gpus = processes_per_node("gpu", 2);
  EXPECT_EQ(gpus.processes, 2);
  EXPECT_EQ(gpus.why, "--nproc-per-node gpu: one process per CUDA GPU, 2 here");
  EXPECT_EQ(processes_per_node("auto", 8).processes, 8);
  const auto none = processes_per_node("auto", 0);
  EXPECT_EQ(none.processes, 1);
  EXPECT_NE(
      none.why.find("no CUDA GPU here, so one process"), std::string::npos);
  auto refusal = [](const std::string& value, int cuda_gpus) {
    try {
      processes_per_node(value, cuda_gpus);
    } catch (const UserError& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage) << value;
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      refusal("gpu", 0).find("--nproc-per-node gpu: this machine has no CUDA "
                             "GPU"),
      std::string::npos);
  for (const char* bad : {"0", "1025", "", "2x", "-1", "cpu", "GPU"})
    EXPECT_NE(
        refusal(bad, 2).find(
            "--nproc-per-node '" + std::string(bad) +
            "' is not a number from 1 to 1024, `gpu`"),
        std::string::npos)
        << bad;
}

} // namespace
} // namespace orchard::dist

namespace orchard {
namespace {

// Several processes on one node share its cores; OMP_NUM_THREADS wins.
TEST(LaunchEnv, ProcessesOnOneNodeShareTheCores) {
  const int all = configure_cpu_threads(test::env_of({}));
  EXPECT_GE(all, 1);
  EXPECT_EQ(
      configure_cpu_threads(test::env_of({{"LOCAL_WORLD_SIZE", "2"}})),
      std::max(1, all / 2));
  EXPECT_EQ(
      configure_cpu_threads(test::env_of({{"LOCAL_WORLD_SIZE", "1000"}})), 1);
  EXPECT_EQ(
      configure_cpu_threads(
          test::env_of({{"LOCAL_WORLD_SIZE", "2"}, {"OMP_NUM_THREADS", "3"}})),
      3);
  configure_cpu_threads(test::env_of({{"OMP_NUM_THREADS", "1"}}));
}

// A rendezvous host is resolved before c10d is asked to reach it: an
// address and this machine's own name pass, a name no resolver knows
// (".invalid", RFC 2606) is refused with exit 2, naming where it came from.
TEST(LaunchEnv, AnUnresolvableRendezvousHostIsRefused) {
  EXPECT_NO_THROW(dist::check_host_resolves("127.0.0.1", "MASTER_ADDR"));
  EXPECT_NO_THROW(dist::check_host_resolves("::1", "MASTER_ADDR"));
  EXPECT_NO_THROW(dist::check_host_resolves("localhost", "MASTER_ADDR"));
  const auto r = test::refusal_of(
      [] { dist::check_host_resolves("h0.invalid", "--master-addr", 2); });
  EXPECT_EQ(r.exit_code, 2) << "h0.invalid resolved";
  EXPECT_EQ(
      r.what.rfind(
          "--master-addr h0.invalid: this machine cannot resolve that host "
          "name (",
          0),
      0u)
      << r.what;
}

} // namespace
} // namespace orchard
