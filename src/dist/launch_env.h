// Who this process is in a multi-process run, read from the variables the
// launchers set: torchrun's (and `orchard launch`'s, which sets the same),
// then Slurm's as fallbacks.
//
// torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR, MASTER_PORT; with TORCHELASTIC_USE_AGENT_STORE=True the
// agent already serves the store at MASTER_ADDR:MASTER_PORT, every rank
// (rank 0 too) connects as a client and the keys are prefixed with
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>".
// Slurm (srun, one task per GPU): SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE,
// MASTER_ADDR from the first host of SLURM_JOB_NODELIST when unset,
// MASTER_PORT 29500 when unset.
//
// No torch here: the parsing is tested on its own.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orchard::dist {

struct LaunchEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false; // torchrun's agent serves the store
  int restart_count = 0;
  std::string launcher; // "torchrun" (any launcher setting its variables),
                        // "slurm", or "" for a single process
  // `orchard launch`'s own command up to its `--` (ORCHARD_LAUNCH_AS, which
  // it sets), or "" under another launcher.
  std::string launch_as;
  bool multi() const {
    return world > 1;
  }
  // "rank 1 of 4 (local 1 of 2, node 0), rendezvous at host:29500"
  std::string describe() const;
  // How to start another training command the way this one was, for the
  // hints a run ends with: `program` alone for one process; `orchard
  // launch`'s own words; "torchrun [--nnodes M] --nproc-per-node N
  // --no-python program"; "srun program".
  std::string training_command(const std::string& program) const;
};

using EnvGet = std::function<std::optional<std::string>(const std::string&)>;

// The process's launch (UserError naming the variable and the fix for a
// missing or malformed one). A single process when neither torchrun's nor
// Slurm's multi-task variables are set.
LaunchEnv read_launch_env(const EnvGet& env);
LaunchEnv read_launch_env(); // from the process's environment

// The first host of a Slurm node list: "gpu[01-04,07],cpu3" -> "gpu01".
std::string first_slurm_host(const std::string& nodelist);

// `orchard launch --nproc-per-node VALUE` on a machine with `cuda_gpus`
// visible CUDA GPUs: a number from 1 to 1024; `gpu`, one process per GPU
// (as torchrun's; UserError where there is none); `auto`, one per GPU, or
// one where there is none (torchrun's would start one per core, but an
// Orchard process already computes on every core of its node's share).
// `why` says how a count that was not given as a number was chosen
// ("--nproc-per-node gpu: one process per CUDA GPU, 2 here").
struct ProcessCount {
  int processes = 1;
  std::string why;
};
ProcessCount processes_per_node(const std::string& value, int cuda_gpus);

// Of every rank's GPU, as each named it ("host's GPU at PCI 0000:19:00.0"),
// the first two ranks that name the same one, or nullopt. NCCL needs a
// GPU of its own for each rank (two on one fail with "invalid usage").
std::optional<std::pair<int, int>> first_shared_gpu(
    const std::vector<std::string>& gpu_of_rank);

// Refuses (UserError, exit 2) a rendezvous host this machine cannot
// resolve, a mistyped `--master-addr h0` say, which c10d would otherwise
// retry for its whole rendezvous timeout, a warning a second. `given_as`
// names where it came from ("--master-addr", "MASTER_ADDR"). A temporary
// failure of the resolver is retried for up to `retry_s` seconds first.
void check_host_resolves(
    const std::string& host,
    const std::string& given_as,
    int retry_s = 10);

// Which restart of the run this process is (TORCHELASTIC_RESTART_COUNT, set
// by `orchard launch --max-restarts` and by torchrun's restarts; 0 when
// unset or not a number). A restarted process resumes from the run's newest
// checkpoint, whatever `resume` says (stages/registry.cpp, the Trainer).
int restart_count();

} // namespace orchard::dist
