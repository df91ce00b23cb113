#include "dist/launch_env.h"

#include "core/error.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include <netdb.h>
#include <sys/socket.h>

namespace orchard::dist {
namespace {

// A whole non-negative number in `text`, else nullopt.
std::optional<long> whole_number(const std::string& text) {
  if (text.empty() || text.size() > 9)
    return std::nullopt;
  for (char c : text)
    if (c < '0' || c > '9')
      return std::nullopt;
  return std::strtol(text.c_str(), nullptr, 10);
}

struct Reader {
  const EnvGet& env;
  std::string fix; // how to set the variables right, for every message

  std::optional<std::string> get(const std::string& name) const {
    auto v = env(name);
    if (v && v->empty())
      return std::nullopt;
    return v;
  }
  int number(const std::string& name, long min, long max) const {
    auto v = get(name);
    if (!v)
      throw UserError(name + " is not set. " + fix);
    auto n = whole_number(*v);
    if (!n || *n < min || *n > max)
      throw UserError(
          name + "='" + *v + "' is not a number from " + std::to_string(min) +
          " to " + std::to_string(max) + ". " + fix);
    return int(*n);
  }
  int number_or(const std::string& name, int fallback, long min, long max)
      const {
    return get(name) ? number(name, min, max) : fallback;
  }
};

constexpr const char* kTorchrunFix =
    "Start the processes with `orchard launch --nproc-per-node N -- train "
    "...` or `torchrun --nproc-per-node N --no-python orchard train ...`, "
    "which set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; "
    "or unset WORLD_SIZE to train in one process.";
constexpr const char* kSlurmFix =
    "Under Slurm, start one task per GPU with srun (SLURM_PROCID, "
    "SLURM_NTASKS, SLURM_LOCALID), or set torchrun's variables yourself.";

} // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == ',' && depth == 0)
      break;
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    first += c;
  }
  auto open = first.find('[');
  if (open == std::string::npos)
    return first;
  // prefix[01-04,07]suffix: the first number of the range, as written.
  std::string inside = first.substr(open + 1, first.find(']') - open - 1);
  std::string lowest = inside.substr(0, inside.find_first_of(",-"));
  auto close = first.find(']');
  std::string suffix =
      close == std::string::npos ? "" : first.substr(close + 1);
  return first.substr(0, open) + lowest + suffix;
}

ProcessCount processes_per_node(const std::string& value, int cuda_gpus) {
  constexpr long kMost = 1024; // more processes than any node has GPUs
  if (auto n = whole_number(value); n && *n >= 1 && *n <= kMost)
    return {int(*n), ""};
  const bool gpu = value == "gpu";
  if (!gpu && value != "auto")
    throw UserError(
        "--nproc-per-node '" + value + "' is not a number from 1 to " +
        std::to_string(kMost) +
        ", `gpu` (one process per CUDA GPU) or `auto` (one per CUDA GPU, "
        "else one): e.g. `orchard launch --nproc-per-node 2 -- train ...`.");
  if (cuda_gpus > 0)
    return {
        cuda_gpus,
        "--nproc-per-node " + value + ": one process per CUDA GPU, " +
            std::to_string(cuda_gpus) + " here"};
  if (gpu)
    throw UserError(
        "--nproc-per-node gpu: this machine has no CUDA GPU (none visible; "
        "CUDA_VISIBLE_DEVICES may hide them). Give the number of processes "
        "instead, e.g. --nproc-per-node 2 with `train --device cpu`, or "
        "train in one process without `orchard launch`.");
  return {
      1,
      "--nproc-per-node auto: no CUDA GPU here, so one process, which "
      "computes on every core"};
}

LaunchEnv read_launch_env(const EnvGet& env) {
  LaunchEnv e;
  Reader torchrun{env, kTorchrunFix};
  Reader slurm{env, kSlurmFix};
  const bool has_world = torchrun.get("WORLD_SIZE").has_value();
  const bool slurm_tasks = !has_world && slurm.get("SLURM_PROCID") &&
      slurm.get("SLURM_NTASKS") && slurm.number("SLURM_NTASKS", 1, 1 << 20) > 1;
  if (has_world) {
    e.world = torchrun.number("WORLD_SIZE", 1, 1 << 20);
    if (e.world == 1)
      return e;
    e.launcher = "torchrun";
    e.rank = torchrun.number("RANK", 0, e.world - 1);
    e.local_rank = torchrun.number_or("LOCAL_RANK", 0, 0, e.world - 1);
    e.local_world = torchrun.number_or("LOCAL_WORLD_SIZE", 1, 1, e.world);
    e.node_rank = torchrun.number_or("GROUP_RANK", 0, 0, e.world - 1);
    auto addr = torchrun.get("MASTER_ADDR");
    if (!addr)
      throw UserError(
          "MASTER_ADDR is not set: rank " + std::to_string(e.rank) + " of " +
          std::to_string(e.world) +
          " does not know where rank 0 waits for the others. " + kTorchrunFix);
    e.master_addr = *addr;
    e.master_port = torchrun.number("MASTER_PORT", 1, 65535);
    e.agent_store = torchrun.get("TORCHELASTIC_USE_AGENT_STORE") == "True";
    e.restart_count =
        torchrun.number_or("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20);
    e.launch_as = torchrun.get("ORCHARD_LAUNCH_AS").value_or("");
  } else if (slurm_tasks) {
    e.launcher = "slurm";
    e.world = slurm.number("SLURM_NTASKS", 2, 1 << 20);
    e.rank = slurm.number("SLURM_PROCID", 0, e.world - 1);
    e.local_rank = slurm.number_or("SLURM_LOCALID", 0, 0, e.world - 1);
    e.node_rank = slurm.number_or("SLURM_NODEID", 0, 0, e.world - 1);
    // SLURM_TASKS_PER_NODE reads "4(x2)" for 4 tasks on each of 2 nodes.
    std::string per_node =
        slurm.get("SLURM_NTASKS_PER_NODE")
            .value_or(slurm.get("SLURM_TASKS_PER_NODE").value_or(""));
    per_node = per_node.substr(0, per_node.find_first_of("(,"));
    auto n = whole_number(per_node);
    e.local_world = n && *n >= 1 ? int(*n) : 1;
    if (auto addr = slurm.get("MASTER_ADDR")) {
      e.master_addr = *addr;
    } else if (auto nodes = slurm.get("SLURM_JOB_NODELIST")) {
      e.master_addr = first_slurm_host(*nodes);
    } else {
      throw UserError(
          "neither MASTER_ADDR nor SLURM_JOB_NODELIST is set: rank " +
          std::to_string(e.rank) +
          " cannot find rank 0. Set MASTER_ADDR to the first node's host "
          "name. " +
          kSlurmFix);
    }
    e.master_port = slurm.number_or("MASTER_PORT", 29500, 1, 65535);
  }
  return e;
}

std::string LaunchEnv::training_command(const std::string& program) const {
  if (world <= 1)
    return program;
  if (!launch_as.empty())
    return launch_as;
  if (launcher == "slurm")
    return "srun " + program;
  const int nodes = local_world > 0 ? world / local_world : 1;
  return "torchrun" +
      (nodes > 1 ? " --nnodes " + std::to_string(nodes) : std::string()) +
      " --nproc-per-node " + std::to_string(local_world) + " --no-python " +
      program;
}

std::optional<std::pair<int, int>> first_shared_gpu(
    const std::vector<std::string>& gpu_of_rank) {
  std::map<std::string, int> first; // GPU -> the first rank on it
  for (int r = 0; r < int(gpu_of_rank.size()); ++r) {
    const auto [at, fresh] = first.emplace(gpu_of_rank[size_t(r)], r);
    if (!fresh)
      return std::pair{at->second, r};
  }
  return std::nullopt;
}

int restart_count() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (v == nullptr)
    return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && n > 0 && n < (1 << 20) ? int(n) : 0;
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const std::string& name) {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
}

std::string LaunchEnv::describe() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world) +
      " (local " + std::to_string(local_rank) + " of " +
      std::to_string(local_world) + ", node " + std::to_string(node_rank) +
      "), rendezvous at " + master_addr + ":" + std::to_string(master_port) +
      (agent_store ? " (served by the launcher)" : "");
}

void check_host_resolves(
    const std::string& host,
    const std::string& given_as,
    int retry_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int failed = 0;
  for (int tries = 0;; ++tries) {
    addrinfo* found = nullptr;
    failed = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (failed == 0) {
      ::freeaddrinfo(found);
      return;
    }
    if (failed != EAI_AGAIN || tries >= retry_s)
      break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const std::string why =
      failed == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(failed);
  throw UserError(
      given_as + " " + host + ": this machine cannot resolve that host name (" +
      why +
      "). Name the host of node 0 (where rank 0 runs) as this machine knows "
      "it, or give its IP address; `getent hosts " +
      host + "` shows what this machine resolves.");
}

} // namespace orchard::dist
