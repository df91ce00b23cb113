// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/world.h"

#include "core/error.h"
#include "dist/c10d_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

#if defined(ORCHARD_HAVE_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <unistd.h>
#include <fstream>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if defined(ORCHARD_HAVE_C10D)
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace orchard::dist {

using detail::why_of;

namespace {

// How long a rank waits for the others at the rendezvous.
constexpr std::chrono::seconds kRendezvousTimeout{300};
// Values per all-reduce bucket (64 MiB of float32).
constexpr int64_t kBucketValues = int64_t(16) << 20;

struct World {
  LaunchEnv env;
  torch::Device device{torch::kCPU};
  bool joined = false;
  std::string backend;
#if defined(ORCHARD_HAVE_C10D)
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CollectiveGroup> group;
#endif
};

// Never destroyed: NCCL's destructor needs CUDA, which static destruction
// may already have taken down (finish() releases the group in time).
World& world() {
  static World* w = new World;
  return *w;
}

// Tensors grouped by dtype and device, in order, cut into buckets.
std::vector<std::vector<torch::Tensor>> buckets_of(
    const std::vector<torch::Tensor>& tensors) {
  std::vector<std::vector<torch::Tensor>> out;
  std::map<std::pair<int, std::string>, size_t> open; // kind -> bucket
  std::vector<int64_t> filled;
  for (const auto& t : tensors) {
    if (!t.defined())
      continue;
    auto kind = std::pair{int(t.scalar_type()), t.device().str()};
    auto it = open.find(kind);
    if (it == open.end() || filled[it->second] + t.numel() > kBucketValues) {
      out.emplace_back();
      filled.push_back(0);
      it = open.insert_or_assign(kind, out.size() - 1).first;
    }
    out[it->second].push_back(t);
    filled[it->second] += t.numel();
  }
  return out;
}

#if defined(ORCHARD_HAVE_C10D)
// Runs `op` on one flat tensor holding the bucket, then copies the result
// back into the bucket's tensors.
template <class Op>
void on_flat(const std::vector<torch::Tensor>& bucket, Op&& op) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_parts;
  for (const auto& t : bucket)
    flat_parts.push_back(t.reshape({-1}));
  std::vector<torch::Tensor> flat = {torch::cat(flat_parts)};
  op(flat);
  int64_t at = 0;
  for (const auto& t : bucket) {
    t.copy_(flat[0].narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

c10::intrusive_ptr<c10d::Store> rendezvous(const LaunchEnv& env) {
  check_host_resolves(env.master_addr, "MASTER_ADDR");
  c10d::TCPStoreOptions o;
  o.port = uint16_t(env.master_port);
  o.isServer = env.rank == 0 && !env.agent_store;
  o.timeout = kRendezvousTimeout;
  // Every rank waits until all have connected (as Python's
  // init_process_group does).
  o.numWorkers = size_t(env.world);
  o.waitWorkers = true;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) { // c10::Error, or socket errors
    const std::string why = why_of(e);
    const std::string where =
        env.master_addr + ":" + std::to_string(env.master_port);
    if (o.isServer &&
        (why.find("in use") != std::string::npos ||
         why.find("failed to listen") != std::string::npos ||
         why.find("failed to bind") != std::string::npos))
      throw UserError(
          "rank 0 cannot serve the rendezvous at " + where + " (" + why +
          "): the port is taken, most likely by another run. Pick a free "
          "port: MASTER_PORT=29501 (or `orchard launch --master-port "
          "29501`).");
    throw UserError(
        "rank " + std::to_string(env.rank) +
        " could not join the rendezvous "
        "at " +
        where + " within " + std::to_string(kRendezvousTimeout.count()) +
        " s (" + why +
        "). Check that every rank was started with the same MASTER_ADDR, "
        "MASTER_PORT and WORLD_SIZE, that rank 0 is running (its error, if "
        "any, is above) and that the port is reachable from this host.");
  }
  if (env.agent_store)
    store = c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(env.restart_count), store);
  return c10::make_intrusive<c10d::PrefixStore>("orchard", store);
}
#endif

#if defined(USE_C10D_NCCL)
// Every rank names its GPU (host and PCI address) in the store and reads
// the others': two ranks on one GPU are refused here, by every rank alike,
// rather than by NCCL's "invalid usage" at the first collective.
void check_one_gpu_each(
    const c10::intrusive_ptr<c10d::Store>& store,
    const LaunchEnv& env,
    const torch::Device& device) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char bus[64] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device.index()) != cudaSuccess)
    std::snprintf(bus, sizeof bus, "index %d", int(device.index()));
  // The machine is its kernel's boot id (shared by the containers of one
  // host, different on every other machine, however alike their host
  // names and PCI layouts), or the host name where there is none; the
  // message names the host.
  std::string machine;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  if (!std::getline(boot, machine) || machine.empty())
    machine = host;
  const std::string mine =
      machine + "\n" + std::string(host) + "'s GPU at PCI " + bus;
  std::vector<std::string> gpus(size_t(env.world));
  detail::collective("comparing the ranks' GPUs", [&] {
    store->set(
        "gpu/" + std::to_string(env.rank),
        std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < env.world; ++r) {
      const auto v = store->get("gpu/" + std::to_string(r));
      gpus[size_t(r)] = std::string(v.begin(), v.end());
    }
  });
  if (const auto shared = first_shared_gpu(gpus))
    throw UserError(
        "rank " + std::to_string(shared->first) + " and rank " +
        std::to_string(shared->second) + " are both on " +
        gpus[size_t(shared->first)].substr(
            gpus[size_t(shared->first)].find('\n') + 1) +
        ": NCCL needs a GPU of its own for each rank. Start at most as "
        "many processes on a node as it has GPUs (`orchard launch "
        "--nproc-per-node gpu`), each with its own (LOCAL_RANK, or "
        "CUDA_VISIBLE_DEVICES naming one GPU a process).");
}
#endif

} // namespace

namespace detail {

std::string why_of(const std::exception& e) {
  const auto first_line = [](const std::string& s) {
    return s.substr(0, s.find('\n'));
  };
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e))
    return first_line(c10->what_without_backtrace());
  return first_line(e.what());
}

void collective(const std::string& what, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) { // c10::Error, or c10d's socket errors
    const std::string said = "rank " + std::to_string(rank()) + " of " +
        std::to_string(size()) + ": " + what + " failed (" + why_of(e) +
        "). Another rank most likely stopped (its error is printed above), "
        "or the network between the ranks broke. Checkpoints already "
        "written are intact: run the same launch again to resume.";
    // Not bad input (exit 2): `orchard launch --max-restarts` restarts.
    throw UserError(said, kExitFailure);
  }
}

#if defined(ORCHARD_HAVE_C10D)
compat::CollectiveGroup& group() {
  return *world().group;
}

c10::intrusive_ptr<c10d::Store> store() {
  return world().store;
}
#endif

} // namespace detail

using detail::collective;

std::pair<bool, std::string> backend_for(const std::string& device_type) {
  if (device_type == "cpu") {
#if defined(ORCHARD_HAVE_GLOO)
    return {true, "Gloo"};
#else
    return {
        false,
        "this build of Orchard has no Gloo (libtorch without it, or its "
        "headers missing: on Debian `apt install libgloo-dev`, then "
        "./orchard.sh build)"};
#endif
  }
  if (device_type == "cuda") {
#if defined(USE_C10D_NCCL)
    return {true, "NCCL"};
#else
    return {false, "this libtorch was built without NCCL"};
#endif
  }
  if (device_type == "mps")
    return {false, "PyTorch has no collective backend for Apple GPUs"};
  return {false, "no collective backend serves " + device_type};
}

void init(const LaunchEnv& env, const torch::Device& device) {
  World& w = world();
  if (!env.multi() || w.joined)
    return;
  auto [ok, backend] = backend_for(device.is_cuda() ? "cuda" : device.str());
  if (!ok)
    throw UserError(
        "WORLD_SIZE=" + std::to_string(env.world) + " on " + device.str() +
        ": " + backend + ". Run a single process (unset WORLD_SIZE).");
#if defined(ORCHARD_HAVE_C10D)
  w.env = env;
  w.device = device;
  w.backend = backend;
  w.store = rendezvous(env);
#if defined(USE_C10D_NCCL)
  if (device.is_cuda())
    check_one_gpu_each(w.store, env, device);
#endif
  collective("joining the " + backend + " process group", [&] {
#if defined(USE_C10D_NCCL)
    if (device.is_cuda()) {
      c10::cuda::set_device(device.index());
      w.group = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          w.store, env.rank, env.world);
      return;
    }
#endif
#if defined(ORCHARD_HAVE_GLOO)
    auto opts = c10d::ProcessGroupGloo::Options::create();
    // One host: loopback, whatever the host name resolves to.
    opts->devices.push_back(
        env.local_world == env.world
            ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
            : c10d::ProcessGroupGloo::createDefaultDevice());
    w.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        w.store, env.rank, env.world, opts);
#endif
  });
  w.joined = true;
  // Everyone is here: the first collective proves the group works.
  barrier("the first collective");
  if (env.rank != 0) {
    std::fflush(stdout);
    if (!std::freopen("/dev/null", "w", stdout))
      throw UserError(
          "rank " + std::to_string(env.rank) +
          " could not silence its output (/dev/null)");
  }
#endif
}

int finish(int exit_code) {
  World& w = world();
  if (!w.joined)
    return exit_code;
  std::fflush(stdout);
  std::fflush(stderr);
  if (exit_code != 0) // a shutdown could wait on a rank that is gone
    std::_Exit(exit_code);
#if defined(ORCHARD_HAVE_C10D)
  try {
#if defined(USE_C10D_NCCL)
    if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(w.group.get()))
      nccl->shutdown();
#endif
    w.group.reset();
    w.store.reset();
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "warning: rank %d: taking the process group down failed (%s); the "
        "run itself completed.\n",
        w.env.rank,
        why_of(e).c_str());
  }
#endif
  w.joined = false;
  return exit_code;
}

AveragingOptions::Mover mover_named(const std::string& name) {
  if (name == "nccl")
    return AveragingOptions::Mover::nccl;
  if (name == "copy_engines")
    return AveragingOptions::Mover::copy_engines;
  if (name == "auto")
    return AveragingOptions::Mover::automatic;
  throw UserError(
      "grad_average=" + name +
      " is not a setting: auto, nccl or copy_engines.");
}

bool active() {
  return world().joined;
}

int rank() {
  return world().joined ? world().env.rank : 0;
}

int size() {
  return world().joined ? world().env.world : 1;
}

const LaunchEnv& launch() {
  return world().env;
}

void all_reduce_mean(const std::vector<torch::Tensor>& tensors) {
  if (!active())
    return;
#if defined(ORCHARD_HAVE_C10D)
  const double n = double(size());
  for (const auto& bucket : buckets_of(tensors))
    on_flat(bucket, [&](std::vector<torch::Tensor>& flat) {
      collective("averaging gradients", [&] {
        world().group->allreduce(flat)->wait();
      });
      flat[0].div_(n);
    });
#endif
}

void all_reduce_sum(const torch::Tensor& tensor) {
  if (!active())
    return;
#if defined(ORCHARD_HAVE_C10D)
  on_flat({tensor}, [&](std::vector<torch::Tensor>& flat) {
    collective("a sum over the ranks", [&] {
      world().group->allreduce(flat)->wait();
    });
  });
#endif
}

torch::Tensor gather_rows(const torch::Tensor& rows) {
  if (!active())
    return rows;
  TORCH_CHECK(rows.dim() >= 1, "[dist] gather_rows needs rows");
  // A sum of zeros but for each rank's own block: exact for every dtype,
  // and every backend (1.13's Gloo included) has it.
  torch::NoGradGuard no_grad;
  const int64_t n = rows.size(0);
  auto shape = rows.sizes().vec();
  shape[0] = n * size();
  auto all = torch::zeros(shape, rows.options().device(world().device));
  all.narrow(0, n * rank(), n).copy_(rows);
  all_reduce_sum(all);
  return all.to(rows.device());
}

RowsGathering start_gather_rows(
    const torch::Tensor& rows,
    const std::string& what) {
#if defined(ORCHARD_HAVE_C10D)
  if (active() && rows.is_cuda()) { // NCCL: into one tensor, in rank order
    torch::NoGradGuard no_grad;
    torch::Tensor mine = rows.contiguous();
    auto shape = mine.sizes().vec();
    shape[0] *= size();
    RowsGathering g{torch::empty(shape, mine.options()), nullptr};
    c10::intrusive_ptr<c10d::Work> work;
    collective(
        what, [&] { work = world().group->_allgather_base(g.all, mine); });
    g.done = [work, what] { collective(what, [&] { work->wait(); }); };
    return g;
  }
#endif
  (void)what;
  return {gather_rows(rows), nullptr};
}

int64_t min_over_ranks(int64_t value) {
  if (!active())
    return value;
  return gather_rows(torch::tensor({value}, torch::kInt64))
      .min()
      .item<int64_t>();
}

void broadcast_from_leader(const std::vector<torch::Tensor>& tensors) {
  if (!active())
    return;
#if defined(ORCHARD_HAVE_C10D)
  for (const auto& bucket : buckets_of(tensors))
    on_flat(bucket, [&](std::vector<torch::Tensor>& flat) {
      collective("sending rank 0's weights", [&] {
        world().group->broadcast(flat)->wait();
      });
    });
#endif
}

void broadcast_from(int root, const torch::Tensor& tensor) {
  if (!active())
    return;
#if defined(ORCHARD_HAVE_C10D)
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> v = {
      tensor.to(world().device).contiguous().clone()};
  collective("sending rank " + std::to_string(root) + "'s values", [&] {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    world().group->broadcast(v, o)->wait();
  });
  tensor.copy_(v[0]);
#endif
  (void)root;
  (void)tensor;
}

std::vector<std::string> gather_strings(const std::string& text) {
  if (!active())
    return {text};
  // Lengths first, then the bytes (as int32: every backend sums those),
  // each rank's in a row padded to the longest.
  const int64_t longest =
      gather_rows(torch::tensor({int64_t(text.size())}, torch::kInt64))
          .max()
          .item<int64_t>();
  auto row = torch::zeros({1, longest + 1}, torch::kInt32);
  auto* d = row.data_ptr<int32_t>();
  d[0] = int32_t(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    d[i + 1] = int32_t(static_cast<unsigned char>(text[i]));
  const auto all = gather_rows(row).to(torch::kCPU).contiguous();
  std::vector<std::string> out;
  for (int64_t r = 0; r < all.size(0); ++r) {
    const auto* a = all[r].data_ptr<int32_t>();
    std::string s(size_t(a[0]), '\0');
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = char(a[i + 1]);
    out.push_back(std::move(s));
  }
  return out;
}

void barrier(const std::string& what) {
  if (!active())
    return;
  // A one-value all-reduce read back on the host: the same on every
  // backend, and it really waits (c10d's barrier on NCCL need not).
  auto one = torch::ones({1}, torch::TensorOptions().device(world().device));
#if defined(ORCHARD_HAVE_C10D)
  std::vector<torch::Tensor> v = {one};
  collective("waiting for every rank at " + what, [&] {
    world().group->allreduce(v)->wait();
  });
#endif
  if (one.item<float>() != float(size()))
    throw UserError(
        "the ranks disagree at " + what + ": a sum of ones came to " +
        std::to_string(one.item<float>()) + ", not " + std::to_string(size()) +
        ".");
}

void leader_first(const std::string& what, const std::function<void()>& fn) {
  if (leader())
    fn();
  barrier(what);
  if (!leader())
    fn();
}

} // namespace orchard::dist
