// The launchers of one run (`orchard launch`, one a node) watching each
// other through the rendezvous store, as torchrun's agents do. Node 0's
// launcher serves the store; its ranks, the other nodes' launchers and
// their ranks connect to it (the ranks as torchrun's do with
// TORCHELASTIC_USE_AGENT_STORE=True). Each launcher writes there when one
// of its ranks fails, reads whether another node's did, counts a heartbeat
// and says when its ranks have all ended. So a rank that fails on one node
// stops every node's ranks within a second or two, rather than leaving
// them waiting in a collective (NCCL waits up to its 10-minute timeout);
// and a node whose launcher falls silent (its machine or network gone) or,
// seen from the others, node 0's store going away stops them too. With
// restarts, every node's launcher starts its ranks again in the next
// attempt, each attempt's keys apart.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orchard::dist {

// What a launcher learned of the other nodes at one look.
struct NodeNews {
  // A rank that failed on another node, as its launcher put it ("rank 3
  // (node 1) was killed by signal 9 (Killed)"), and its exit code.
  std::string failure;
  int failure_code = 0;
  // Why another node is taken for gone ("node 1's launcher has not been
  // heard from for 60 s", "node 0's launcher at h0:29500 cannot be
  // reached (...)"), or "".
  std::string lost;
};

// Seconds of silence after which a node is taken for gone: 60, or
// ORCHARD_TEST_NODE_SILENCE_S (the tests' shorter wait).
double node_silence_limit_s();

// Seconds node 0's launcher waits for another node's launcher to join:
// 240, within the 300 s its ranks wait at the rendezvous, so that it is
// the launcher that says which node is missing; or ORCHARD_TEST_NODE_JOIN_S.
double node_join_limit_s();

// What every node's launcher must be started with alike, each a setting
// and its value ({"--nnodes", "2"}, {"--nproc-per-node", "4"}, ...): the
// ranks' numbers and restarts follow from them. Node 0's are the run's.
using LaunchSettings = std::vector<std::pair<std::string, std::string>>;

// "" where `mine` (node `node`'s) are node 0's, else each difference:
// "--nproc-per-node is 2 on node 0 but 1 on node 1".
std::string launch_differences(
    const LaunchSettings& node0,
    const LaunchSettings& mine,
    int node);

// Whether a node whose heartbeat count was last seen to change at
// `changed_at` (seconds, any clock) and which has not said it finished is
// gone at `now`.
bool node_silent_too_long(double changed_at, double now, double limit_s);

class NodeWatch {
 public:
  // Node 0 serves the store on `port` (a UserError saying what to do when
  // it is taken); the other nodes connect to addr:port, waiting for node 0
  // as long as the ranks wait at a rendezvous. nullptr where this build
  // has no c10d (the ranks then refuse several processes themselves).
  // A UserError (exit 2) for a second launcher as the same node, and for
  // a node whose `settings` differ from node 0's, which also stops the
  // run on every node (reported as a failure with code 2).
  static std::unique_ptr<NodeWatch> start(
      const std::string& addr,
      int port,
      int node,
      int nodes,
      const LaunchSettings& settings = {});
  ~NodeWatch();
  NodeWatch(const NodeWatch&) = delete;
  NodeWatch& operator=(const NodeWatch&) = delete;

  // One of this node's ranks failed: `what` ("rank 3 (node 1) exited with
  // code 1") for the other nodes. The first report of the run stands.
  void report_failure(const std::string& what, int code);
  // Beats, and reads what is new elsewhere (about once a second). A
  // failure or a loss is returned once. Node 0 also takes a node that has
  // not joined within node_join_limit_s() for lost.
  NodeNews look();
  // Each other node's first failed rank, as its launcher reported it (a
  // failure here may be only the echo of one there: a collective that
  // broke when that rank died).
  std::vector<std::string> failures_elsewhere();
  // This node's ranks have all ended, the worst with `code`.
  void finished(int code);
  // Node 0: whether every other node has finished or is gone (true on the
  // others, and after a loss).
  bool others_finished();
  // The exit code of the run's first failed rank in this attempt, as its
  // launcher reported it (every node reads the same), or 0 when none was
  // reported or node 0 is gone.
  int first_failure_code();
  // Every node restarts its ranks (`orchard launch --max-restarts`):
  // failures and ends are kept apart per attempt, so what was said of
  // attempt k-1 is no news in attempt k. Heartbeats and a loss carry over.
  void start_attempt(int attempt);

 private:
  struct Impl;
  explicit NodeWatch(std::unique_ptr<Impl> impl);
  void join(const LaunchSettings& settings);
  std::unique_ptr<Impl> impl_;
};

} // namespace orchard::dist
