// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/world.h"

#include "core/error.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

// Gloo: where libtorch was built with it and its headers are installed
// (Debian: libgloo-dev; PyTorch 2.x's wheel defines USE_C10D_GLOO but ships
// no Gloo headers). NCCL: CUDA builds of libtorch.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/config.h>)
#define ORCHARD_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if defined(ORCHARD_HAVE_GLOO) || defined(USE_C10D_NCCL)
#define ORCHARD_HAVE_C10D 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace orchard::dist {
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

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

// An exception's first line, without c10's backtrace.
std::string why_of(const std::exception& e) {
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e))
    return first_line(c10->what_without_backtrace());
  return first_line(e.what());
}

// Runs a collective; a broken group (a rank died, the network failed)
// becomes a message saying so.
template <class F>
void collective(const std::string& what, F&& fn) {
  try {
    fn();
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) { // c10::Error, or c10d's socket errors
    throw UserError(
        "rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
        ": " + what + " failed (" + why_of(e) +
        "). Another rank most likely stopped (its error is printed above), "
        "or the network between the ranks broke. Checkpoints already "
        "written are intact: run the same launch again to resume.");
  }
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

} // namespace

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

#if defined(ORCHARD_HAVE_C10D)
namespace {

// Buckets of about 25 MB (DDP's default), parameters in the reverse of
// their order: the backward produces the last layers' gradients first.
// Sharded, each rank's region of a bucket is up to 25 MB (a bucket of
// world x 25 MB), so that a region can hold a large matrix whole and the
// regions stay balanced.
constexpr int64_t kOverlapBucketBytes = int64_t(25) << 20;

class OverlappedAverager final : public GradientAverager {
 public:
  OverlappedAverager(const std::vector<Shardable>& params, bool sharded)
      : sharded_(sharded) {
    const int64_t cap = kOverlapBucketBytes * (sharded ? size() : 1);
    std::map<std::pair<int, std::string>, size_t> open; // kind -> bucket
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      const torch::Tensor& p = it->param;
      if (!p.requires_grad())
        continue;
      auto kind = std::pair{int(p.scalar_type()), p.device().str()};
      auto o = open.find(kind);
      if (o == open.end() ||
          (buckets_[o->second].values + p.numel()) * int64_t(p.element_size()) >
              cap) {
        buckets_.push_back({});
        buckets_.back().options = p.options().requires_grad(false);
        o = open.insert_or_assign(kind, buckets_.size() - 1).first;
      }
      Bucket& b = buckets_[o->second];
      slots_.push_back({it->name, p, it->whole, o->second, {}, false});
      b.values += p.numel();
      b.slots.push_back(slots_.size() - 1);
    }
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      Bucket& b = buckets_[bi];
      if (sharded_) {
        lay_out_regions(b);
      } else {
        int64_t at = 0;
        for (size_t i : b.slots) {
          slots_[i].segments.push_back({0, slots_[i].param.numel(), at, -1});
          at += slots_[i].param.numel();
        }
      }
      // Zeros: a region's padding is never written and sums to zero.
      b.flat = torch::zeros({b.values}, b.options);
    }
    if (sharded_) {
      torch::NoGradGuard no_grad;
      for (const Slot& s : slots_)
        for (const Segment& g : s.segments)
          if (g.owner == rank()) {
            const bool whole = g.length == s.param.numel() && s.whole;
            pieces_.push_back(
                {s.name,
                 s.param,
                 g.begin,
                 g.length,
                 whole,
                 whole ? s.param
                       : s.param.detach().view({-1}).narrow(
                             0, g.begin, g.length)});
            piece_at_.push_back({s.bucket, g.offset});
          }
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
      torch::Tensor p = slots_[i].param;
      hooks_.push_back(p.register_hook(
          [this, i](torch::Tensor g) { on_gradient(i, g); }));
    }
  }

  ~OverlappedAverager() override {
    for (size_t i = 0; i < slots_.size(); ++i)
      slots_[i].param.remove_hook(hooks_[i]);
  }

  void arm() override {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    next_ = 0;
    sent_in_backward_ = 0;
    hooked_ = 0;
    for (auto& s : slots_)
      s.ready = false;
    for (auto& b : buckets_) {
      b.ready = 0;
      b.work.reset();
    }
  }

  void disarm() override {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    for (auto& b : buckets_)
      try { // called while an error unwinds: never throws
        if (b.work)
          b.work->wait();
      } catch (const std::exception&) {
      }
  }

  void finish() override {
    torch::NoGradGuard no_grad;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Parameters the backward did not reach: what earlier micro-steps
      // left in .grad, or zeros.
      for (size_t i = 0; i < slots_.size(); ++i)
        if (!slots_[i].ready) {
          const Slot& s = slots_[i];
          const torch::Tensor& acc = s.param.grad();
          for (const Segment& g : s.segments)
            if (acc.defined())
              in_bucket(s, g).copy_(acc.reshape({-1}).narrow(
                  0, g.begin, g.length));
            else
              in_bucket(s, g).zero_();
          ready(i);
        }
      launch_ready(/*in_backward=*/false);
      armed_ = false;
    }
    const double n = double(size());
    for (auto& b : buckets_) {
      collective("averaging gradients", [&] { b.work->wait(); });
      (sharded_ ? region(b, rank()) : b.flat).div_(n);
    }
    if (!sharded_) {
      // .grad becomes a view of the mean (no copy back); the gradient
      // autograd accumulated on its own is dropped.
      for (auto& s : slots_)
        s.param.mutable_grad() = in_bucket(s, s.segments[0]).view(
            s.param.sizes());
      return;
    }
    // Sharded: the mean exists only for this rank's pieces.
    for (auto& s : slots_)
      s.param.mutable_grad() = torch::Tensor();
    for (size_t k = 0; k < pieces_.size(); ++k) {
      ShardPiece& p = pieces_[k];
      p.value.mutable_grad() =
          piece_in_bucket(k).view(p.value.sizes());
    }
  }

  const std::vector<ShardPiece>& pieces() const override {
    return pieces_;
  }

  void gather_parameters() override {
    if (!sharded_)
      return;
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      ShardPiece& p = pieces_[k];
      p.value.mutable_grad() = torch::Tensor(); // the bucket is reused now
      piece_in_bucket(k).copy_(p.value.reshape({-1}));
    }
    for (auto& b : buckets_) {
      torch::Tensor mine = region(b, rank());
      collective("gathering the updated parameters", [&] {
        if (b.flat.is_cuda()) { // NCCL: in place, this rank's region
          b.work = world().group->_allgather_base(b.flat, mine);
          return;
        }
        // Gloo (1.13's has no all-gather into one tensor): a sum of
        // zeros but for each rank's own region.
        const int64_t r = b.region, at = r * rank();
        b.flat.narrow(0, 0, at).zero_();
        b.flat.narrow(0, at + r, b.values - at - r).zero_();
        std::vector<torch::Tensor> v = {b.flat};
        b.work = world().group->allreduce(v);
      });
    }
    for (auto& b : buckets_) {
      collective("gathering the updated parameters", [&] { b.work->wait(); });
      b.work.reset();
      for (size_t i : b.slots)
        for (const Segment& g : slots_[i].segments)
          if (g.owner != rank())
            slots_[i]
                .param.detach()
                .view({-1})
                .narrow(0, g.begin, g.length)
                .copy_(in_bucket(slots_[i], g));
    }
  }

  std::string describe() const override {
    int64_t padding = 0, values = 0;
    for (const auto& b : buckets_) {
      int64_t used = 0;
      for (size_t i : b.slots)
        used += slots_[i].param.numel();
      padding += b.values - used;
      values += b.values;
    }
    const std::string mb =
        std::to_string(kOverlapBucketBytes >> 20) + " MB";
    std::string out = std::to_string(buckets_.size()) + " bucket(s) of up to " +
        (sharded_ ? mb + " a rank, reduce-scattered" : mb) + ", " +
        std::to_string(sent_in_backward_) +
        " of them sent while the backward ran; " + std::to_string(hooked_) +
        " of " + std::to_string(slots_.size()) +
        " gradients handed over by its hooks";
    if (sharded_) {
      int whole = 0;
      for (const auto& p : pieces_)
        whole += p.whole ? 1 : 0;
      out += "; this rank steps " + std::to_string(pieces_.size()) +
          " piece(s) (" + std::to_string(whole) + " whole), " +
          format_share(double(padding) / double(std::max<int64_t>(1, values))) +
          " of the buckets is padding";
    }
    return out;
  }

 private:
  // Part of a parameter's flattened elements at `offset` in its bucket,
  // stepped by rank `owner` (-1: not sharded).
  struct Segment {
    int64_t begin, length, offset;
    int owner;
  };
  struct Slot {
    std::string name;
    torch::Tensor param;
    bool whole;
    size_t bucket;
    std::vector<Segment> segments;
    bool ready;
  };
  struct Bucket {
    torch::TensorOptions options;
    int64_t values = 0; // sharded: world x region
    int64_t region = 0; // sharded: each rank's values
    std::vector<size_t> slots;
    size_t ready = 0;
    torch::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
  };

  static std::string format_share(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * x);
    return buf;
  }

  // Cuts bucket b into one region per rank, all of one length: whole
  // parameters first, largest first, each to the least filled region; the
  // others poured in order into what is left, split where a region fills.
  void lay_out_regions(Bucket& b) {
    const int world = size();
    std::vector<int64_t> filled(size_t(world), 0);
    std::vector<size_t> whole;
    int64_t total = 0;
    for (size_t i : b.slots) {
      total += slots_[i].param.numel();
      if (slots_[i].whole)
        whole.push_back(i);
    }
    std::stable_sort(whole.begin(), whole.end(), [&](size_t x, size_t y) {
      return slots_[x].param.numel() > slots_[y].param.numel();
    });
    std::vector<std::pair<size_t, int>> whole_owner;
    for (size_t i : whole) {
      const int r = int(
          std::min_element(filled.begin(), filled.end()) - filled.begin());
      whole_owner.push_back({i, r});
      filled[size_t(r)] += slots_[i].param.numel();
    }
    b.region = std::max(
        *std::max_element(filled.begin(), filled.end()),
        (total + world - 1) / world);
    b.values = b.region * world;
    std::vector<int64_t> at(size_t(world), 0);
    for (const auto& [i, r] : whole_owner) {
      const int64_t n = slots_[i].param.numel();
      slots_[i].segments.push_back({0, n, b.region * r + at[size_t(r)], r});
      at[size_t(r)] += n;
    }
    int r = 0;
    for (size_t i : b.slots) {
      if (slots_[i].whole)
        continue;
      const int64_t n = slots_[i].param.numel();
      for (int64_t begin = 0; begin < n;) {
        while (at[size_t(r)] == b.region)
          ++r;
        const int64_t take = std::min(n - begin, b.region - at[size_t(r)]);
        slots_[i].segments.push_back(
            {begin, take, b.region * r + at[size_t(r)], r});
        at[size_t(r)] += take;
        begin += take;
      }
    }
  }

  torch::Tensor region(const Bucket& b, int r) const {
    return b.flat.narrow(0, b.region * r, b.region);
  }
  torch::Tensor in_bucket(const Slot& s, const Segment& g) {
    return buckets_[s.bucket].flat.narrow(0, g.offset, g.length);
  }
  torch::Tensor piece_in_bucket(size_t k) {
    const auto [bucket, offset] = piece_at_[k];
    return buckets_[bucket].flat.narrow(0, offset, pieces_[k].length);
  }

  // Autograd's hook (its thread on CUDA): the step's gradient g of
  // parameter i, before it is added to .grad. The bucket gets the sum now
  // (queued on the stream the collective waits for).
  void on_gradient(size_t i, const torch::Tensor& g) {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[i];
    if (!armed_ || s.ready)
      return;
    torch::NoGradGuard no_grad;
    const torch::Tensor& acc = s.param.grad();
    const torch::Tensor flat_g = g.reshape({-1});
    for (const Segment& seg : s.segments) {
      torch::Tensor dst = in_bucket(s, seg);
      const torch::Tensor part = flat_g.narrow(0, seg.begin, seg.length);
      if (acc.defined())
        torch::add_out(
            dst, acc.reshape({-1}).narrow(0, seg.begin, seg.length), part);
      else
        dst.copy_(part);
    }
    ++hooked_;
    ready(i);
    launch_ready(/*in_backward=*/true);
  }

  void ready(size_t i) {
    slots_[i].ready = true;
    ++buckets_[slots_[i].bucket].ready;
  }

  // Sends the full buckets, in bucket order (every rank must issue the
  // same collectives in the same order).
  void launch_ready(bool in_backward) {
    while (next_ < buckets_.size() &&
           buckets_[next_].ready == buckets_[next_].slots.size()) {
      sent_in_backward_ += in_backward ? 1 : 0;
      Bucket& b = buckets_[next_];
      collective("averaging gradients", [&] {
        if (sharded_ && b.flat.is_cuda()) { // NCCL: in place
          torch::Tensor mine = region(b, rank());
          b.work = world().group->_reduce_scatter_base(mine, b.flat);
          return;
        }
        // Gloo's reduce-scatter (1.13 has none): the whole sum, of which
        // this rank reads its region.
        std::vector<torch::Tensor> v = {b.flat};
        b.work = world().group->allreduce(v);
      });
      ++next_;
    }
  }

  bool sharded_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<ShardPiece> pieces_;
  // Each piece's bucket and offset in it.
  std::vector<std::pair<size_t, int64_t>> piece_at_;
  std::vector<unsigned> hooks_;
  std::mutex mu_;
  bool armed_ = false;
  size_t next_ = 0;
  size_t sent_in_backward_ = 0, hooked_ = 0;
};

} // namespace
#endif

std::unique_ptr<GradientAverager> GradientAverager::make(
    const std::vector<torch::Tensor>& params) {
#if defined(ORCHARD_HAVE_C10D)
  if (active()) {
    std::vector<Shardable> all;
    for (const auto& p : params)
      all.push_back({"", p, false});
    return std::make_unique<OverlappedAverager>(all, /*sharded=*/false);
  }
#endif
  (void)params;
  return nullptr;
}

std::unique_ptr<GradientAverager> GradientAverager::make_sharded(
    const std::vector<Shardable>& params) {
#if defined(ORCHARD_HAVE_C10D)
  if (active())
    return std::make_unique<OverlappedAverager>(params, /*sharded=*/true);
#endif
  (void)params;
  return nullptr;
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
