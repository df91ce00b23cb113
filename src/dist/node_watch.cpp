// Built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#define ORCHARD_C10D_COMPAT
#include "core/torch_compat.h"

#include "dist/node_watch.h"

#include "core/error.h"
#include "core/version.h"
#include "dist/c10d_group.h"

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <vector>

#if defined(ORCHARD_HAVE_C10D)
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace orchard::dist {

namespace {

// How long another node waits for node 0's launcher (as a rank waits at
// the rendezvous), and for one answer of the store once connected.
constexpr std::chrono::seconds kJoinTimeout{300};
constexpr std::chrono::seconds kAnswerTimeout{30};

double now_s() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds from the environment variable `name` (a test's shorter wait),
// else `fallback`.
double seconds_from(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr)
    return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end != v && *end == '\0' && s > 0)
    return s;
  throw UserError(
      std::string(name) + "=" + v + " is not a number of seconds above 0.");
}

} // namespace

double node_silence_limit_s() {
  return seconds_from("ORCHARD_TEST_NODE_SILENCE_S", 60);
}

double node_join_limit_s() {
  return seconds_from("ORCHARD_TEST_NODE_JOIN_S", 240);
}

std::string launch_differences(
    const LaunchSettings& node0,
    const LaunchSettings& mine,
    int node) {
  std::string differ;
  for (const auto& [name, value] : mine) {
    std::string theirs = "not set";
    for (const auto& [name0, value0] : node0)
      if (name0 == name)
        theirs = value0;
    if (theirs != value)
      differ += (differ.empty() ? "" : "; ") + name + " is " + theirs +
          " on node 0 but " + value + " on node " + std::to_string(node);
  }
  return differ;
}

bool node_silent_too_long(double changed_at, double now, double limit_s) {
  return now - changed_at > limit_s;
}

#if defined(ORCHARD_HAVE_C10D)

namespace {

// Settings as the store holds them: a line each, name and value apart by
// a tab.
std::string settings_text(const LaunchSettings& settings) {
  std::string text;
  for (const auto& [name, value] : settings)
    text += name + "\t" + value + "\n";
  return text;
}

LaunchSettings settings_of(const std::string& text) {
  LaunchSettings settings;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t tab = line.find('\t');
    settings.emplace_back(
        line.substr(0, tab),
        tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  return settings;
}

} // namespace

struct NodeWatch::Impl {
  c10::intrusive_ptr<c10d::Store> tcp;   // the connection (node 0: server)
  c10::intrusive_ptr<c10d::Store> base;  // its "orchard_launch/" keys
  c10::intrusive_ptr<c10d::Store> store; // this attempt's: "attempt_<k>/"
  std::string where;                     // addr:port
  int node = 0, nodes = 1;
  double limit_s = 60;       // silence after which a node is gone
  double join_limit_s = 240; // node 0: wait for another node to join
  double started_at = 0;
  LaunchSettings settings;   // this node's, for the missing nodes' hint
  bool reported = false;     // this node's first failure was written
  bool failure_seen = false; // the run's failure was read (or is ours)
  bool lost = false;         // a node is gone: nothing more to watch
  // Per node: the heartbeat count last seen, when it last changed, and
  // whether the node said it finished.
  std::vector<int64_t> beats;
  std::vector<double> changed_at;
  std::vector<bool> done;
  std::vector<bool> joined;

  std::string text(const std::string& key) {
    const auto v = store->get(key);
    return std::string(v.begin(), v.end());
  }
  void put(const std::string& key, const std::string& value) {
    store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  // How node k is started: as this node, with its own number.
  std::string launch_of(int k) const {
    std::string said = program_name() + " launch";
    for (const auto& [name, value] : settings)
      said += " " + name + " " + value;
    const size_t colon = where.rfind(':');
    return said + " --node-rank " + std::to_string(k) + " --master-addr " +
        where.substr(0, colon) + " --master-port " + where.substr(colon + 1);
  }
  // Node 0 watches every other node; the others watch node 0.
  bool watches(int k) const {
    return k != node && (node == 0 || k == 0);
  }
};

std::unique_ptr<NodeWatch> NodeWatch::start(
    const std::string& addr,
    int port,
    int node,
    int nodes,
    const LaunchSettings& settings) {
  auto impl = std::make_unique<Impl>();
  impl->where = addr + ":" + std::to_string(port);
  impl->node = node;
  impl->nodes = nodes;
  impl->limit_s = node_silence_limit_s();
  impl->join_limit_s = node_join_limit_s();
  impl->started_at = now_s();
  impl->settings = settings;
  c10d::TCPStoreOptions o;
  o.port = uint16_t(port);
  o.isServer = node == 0;
  o.waitWorkers = false; // the ranks join in the process group
  o.timeout = kJoinTimeout;
  try {
    // Node 0's own connection to the store it serves is over loopback.
    impl->tcp = c10::make_intrusive<c10d::TCPStore>(
        node == 0 ? std::string("127.0.0.1") : addr, o);
  } catch (const std::exception& e) { // c10::Error, or socket errors
    const std::string why = detail::why_of(e);
    if (node == 0)
      throw UserError(
          "orchard launch cannot serve the rendezvous on port " +
          std::to_string(port) + " (" + why +
          "): the port is taken, most likely by another run. Pick a free "
          "port, the same on every node: `orchard launch --master-port "
          "29501` (or --standalone, on one node).");
    throw UserError(
        "orchard launch (node " + std::to_string(node) +
        ") could not reach node 0's rendezvous at " + impl->where + " within " +
        std::to_string(kJoinTimeout.count()) + " s (" + why +
        "). Check that `orchard launch --node-rank 0` is running there with "
        "the same --master-port, that --master-addr names node 0, and that "
        "the port is reachable from this host.");
  }
  impl->tcp->setTimeout(kAnswerTimeout);
  impl->base =
      c10::make_intrusive<c10d::PrefixStore>("orchard_launch", impl->tcp);
  impl->beats.assign(size_t(nodes), -1);
  impl->changed_at.assign(size_t(nodes), now_s());
  impl->joined.assign(size_t(nodes), false);
  auto watch = std::unique_ptr<NodeWatch>(new NodeWatch(std::move(impl)));
  watch->start_attempt(0);
  watch->join(settings);
  return watch;
}

void NodeWatch::join(const LaunchSettings& settings) {
  Impl& w = *impl_;
  const std::string n = std::to_string(w.node);
  std::string node0;
  try {
    if (w.base->add("joined/" + n, 1) > 1)
      throw UserError(
          "orchard launch --node-rank " + n + ": node " + n +
          " has already joined the rendezvous at " + w.where +
          ". Give each node its own --node-rank, 0 to " +
          std::to_string(w.nodes - 1) + "; or, if node " + n +
          "'s earlier launch stopped, start every node's `orchard launch` "
          "again.");
    if (w.node == 0) {
      const std::string text = settings_text(settings);
      w.base->set("settings", std::vector<uint8_t>(text.begin(), text.end()));
      return;
    }
    const auto v = w.base->get("settings");
    node0.assign(v.begin(), v.end());
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) { // the store's connection broke
    throw UserError(
        "orchard launch (node " + n +
        ") could not read node 0's launch settings at " + w.where + " (" +
        detail::why_of(e) +
        "): node 0's `orchard launch` stopped, or it is another Orchard "
        "build (compare `orchard --version` on the nodes). Start node 0's "
        "launch again, then this one.");
  }
  const std::string differ =
      launch_differences(settings_of(node0), settings, w.node);
  if (differ.empty())
    return;
  // Ranks numbered from other counts would never meet: every node stops.
  const std::string why = "node " + n +
      "'s orchard launch was started with other settings than node 0's: " +
      differ;
  report_failure(why, kExitUsage);
  finished(kExitUsage);
  throw UserError(
      why +
      ". Start every node's `orchard launch` with the same --nnodes, "
      "--nproc-per-node and --max-restarts (its ranks were not "
      "started; node 0's are stopped).");
}

void NodeWatch::start_attempt(int attempt) {
  Impl& w = *impl_;
  w.store = c10::make_intrusive<c10d::PrefixStore>(
      "attempt_" + std::to_string(attempt), w.base);
  w.reported = false;
  w.failure_seen = false;
  w.done.assign(size_t(w.nodes), false);
}

int NodeWatch::first_failure_code() {
  Impl& w = *impl_;
  try {
    if (!w.lost && w.store->check({"failure"}))
      return std::atoi(w.text("failure").c_str());
  } catch (const std::exception&) {
    // Node 0 is gone: the run stops, whatever the code.
  }
  return 0;
}

NodeWatch::NodeWatch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeWatch::~NodeWatch() = default;

void NodeWatch::report_failure(const std::string& what, int code) {
  Impl& w = *impl_;
  if (w.lost || w.reported)
    return;
  w.reported = true;
  try {
    if (w.store->add("failures", 1) == 1) // the first report stands
      w.put(
          "failure",
          std::to_string(code) + " " + std::to_string(w.node) + "\n" + what);
    w.failure_seen = true;
    w.put("failure/" + std::to_string(w.node), what);
  } catch (const std::exception&) {
    // The store is gone; look() says so.
  }
}

NodeNews NodeWatch::look() {
  Impl& w = *impl_;
  NodeNews news;
  if (w.lost)
    return news;
  try {
    w.base->add("beat/" + std::to_string(w.node), 1);
    if (!w.failure_seen && w.store->check({"failure"})) {
      w.failure_seen = true;
      std::istringstream said(w.text("failure"));
      int code = 1, from = -1;
      said >> code >> from;
      said.ignore(1);
      std::string what;
      std::getline(said, what, '\0');
      if (from != w.node) {
        news.failure = what;
        news.failure_code = code;
      }
    }
    const double now = now_s();
    for (int k = 0; k < w.nodes; ++k) {
      const auto i = size_t(k);
      if (!w.watches(k) || w.done[i])
        continue;
      const std::string n = std::to_string(k);
      if (!w.joined[i] && !(w.joined[i] = w.base->check({"joined/" + n}))) {
        if (now - w.started_at <= w.join_limit_s)
          continue;
        std::ostringstream why;
        why << "node " << k << "'s launcher has not joined the rendezvous at "
            << w.where << " within " << w.join_limit_s << " s: start `"
            << w.launch_of(k) << " -- ...` there, the same command after `--`";
        news.lost = why.str();
        w.lost = true;
        break;
      }
      if (w.store->check({"done/" + n})) {
        w.done[i] = true;
        continue;
      }
      const int64_t beats = w.base->add("beat/" + n, 0);
      if (beats != w.beats[i]) {
        w.beats[i] = beats;
        w.changed_at[i] = now;
      } else if (
          beats > 0 && node_silent_too_long(w.changed_at[i], now, w.limit_s)) {
        std::ostringstream why;
        why << "node " << k << "'s launcher has not been heard from for "
            << int(now - w.changed_at[i])
            << " s (its machine or the network to it is down, or it was "
               "stopped)";
        news.lost = why.str();
        w.lost = true;
        break;
      }
    }
  } catch (const std::exception& e) { // the store's connection broke
    news.lost = "node 0's launcher at " + w.where + " cannot be reached (" +
        detail::why_of(e) + "): it stopped, or the network to it is down";
    w.lost = true;
  }
  return news;
}

std::vector<std::string> NodeWatch::failures_elsewhere() {
  Impl& w = *impl_;
  std::vector<std::string> said;
  try {
    for (int k = 0; k < w.nodes; ++k) {
      const std::string key = "failure/" + std::to_string(k);
      if (k != w.node && w.store->check({key}))
        said.push_back(w.text(key));
    }
  } catch (const std::exception&) {
    // Node 0 is gone: what it knew went with it.
  }
  return said;
}

void NodeWatch::finished(int code) {
  Impl& w = *impl_;
  if (w.lost)
    return;
  try {
    w.put("done/" + std::to_string(w.node), std::to_string(code));
  } catch (const std::exception&) {
    // Node 0 is gone: nobody waits for this.
  }
}

bool NodeWatch::others_finished() {
  Impl& w = *impl_;
  if (w.node != 0 || w.lost)
    return true;
  for (int k = 1; k < w.nodes; ++k)
    if (!w.done[size_t(k)])
      return false; // look() reads the done keys
  return true;
}

#else

struct NodeWatch::Impl {};

std::unique_ptr<NodeWatch> NodeWatch::start(
    const std::string&,
    int,
    int,
    int,
    const LaunchSettings&) {
  return nullptr;
}
NodeWatch::NodeWatch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeWatch::~NodeWatch() = default;
void NodeWatch::report_failure(const std::string&, int) {}
NodeNews NodeWatch::look() {
  return {};
}
std::vector<std::string> NodeWatch::failures_elsewhere() {
  return {};
}
void NodeWatch::finished(int) {}
bool NodeWatch::others_finished() {
  return true;
}
int NodeWatch::first_failure_code() {
  return 0;
}
void NodeWatch::start_attempt(int) {}
void NodeWatch::join(const LaunchSettings&) {}

#endif

} // namespace orchard::dist
