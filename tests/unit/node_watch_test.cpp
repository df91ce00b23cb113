// The launchers' watch on each other (src/dist/node_watch.h), two of them
// in this process over loopback: a failure reported by one node is read
// by the other once, a node that stops beating is taken for gone, node 0's
// store going away is noticed, each attempt of a restarted run is apart;
// and the signal several ranks agree to stop for (train/trainer.h).
#include "dist/node_watch.h"
#include "core/error.h"
#include "test_util.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <thread>

namespace orchard::dist {
namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Node 0 and node 1 of two, on a free port ({nullptr, nullptr} where this
// build has no c10d).
struct TwoWatches {
  int port = free_port();
  std::unique_ptr<NodeWatch> node0 = NodeWatch::start("127.0.0.1", port, 0, 2);
  std::unique_ptr<NodeWatch> node1 =
      node0 ? NodeWatch::start("127.0.0.1", port, 1, 2) : nullptr;
};

// One of the tests' shorter waits, for the test's length.
struct ShortWait {
  const char* name;
  ShortWait(const char* variable, const char* s) : name(variable) {
    ::setenv(name, s, 1);
  }
  ~ShortWait() {
    ::unsetenv(name);
  }
};
struct SilenceLimit : ShortWait {
  explicit SilenceLimit(const char* s)
      : ShortWait("ORCHARD_TEST_NODE_SILENCE_S", s) {}
};

TEST(NodeWatch, AFailureOnOneNodeIsReadOnceByTheOther) {
  auto [port, node0, node1] = TwoWatches();
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  ASSERT_NE(node1, nullptr);
  EXPECT_TRUE(node0->look().failure.empty());
  EXPECT_TRUE(node1->look().failure.empty());
  node1->report_failure("rank 1 (node 1) exited with code 3", 3);
  node1->report_failure("rank 2 (node 1) exited with code 4", 4); // later
  const NodeNews news = node0->look();
  EXPECT_EQ(news.failure, "rank 1 (node 1) exited with code 3");
  EXPECT_EQ(news.failure_code, 3);
  EXPECT_TRUE(news.lost.empty()) << news.lost;
  EXPECT_TRUE(node0->look().failure.empty()) << "said once";
  EXPECT_TRUE(node1->look().failure.empty()) << "its own, not news";
  EXPECT_EQ(
      node0->failures_elsewhere(),
      std::vector<std::string>{"rank 1 (node 1) exited with code 3"});
  EXPECT_TRUE(node1->failures_elsewhere().empty());
  // Node 0 waits for node 1 to say it finished (read at a look).
  EXPECT_FALSE(node0->others_finished());
  node1->finished(3);
  node0->look();
  EXPECT_TRUE(node0->others_finished());
  EXPECT_TRUE(node1->others_finished());
}

TEST(NodeWatch, ASilentNodeAndAGoneNodeZeroAreNoticed) {
  SilenceLimit limit("0.3");
  auto [port, node0, node1] = TwoWatches();
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  ASSERT_NE(node1, nullptr);
  // Beating, node 1 is not lost however long it runs.
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(node1->look().lost.empty());
    EXPECT_TRUE(node0->look().lost.empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Silent past the limit: lost, once.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const NodeNews news = node0->look();
  EXPECT_NE(
      news.lost.find("node 1's launcher has not been heard from"),
      std::string::npos)
      << news.lost;
  EXPECT_TRUE(node0->look().lost.empty()) << "said once";
  EXPECT_TRUE(node0->others_finished()) << "a lost node is not waited for";
  // Node 0's launcher gone: node 1 finds its store unreachable.
  node0.reset();
  const NodeNews gone = node1->look();
  EXPECT_NE(
      gone.lost.find(
          "node 0's launcher at 127.0.0.1:" + std::to_string(port) +
          " cannot be reached"),
      std::string::npos)
      << gone.lost;
}

// Node 0's launcher hung (stopped, or its machine frozen) with its store's
// connection still open: the other nodes notice its heartbeat stopping.
TEST(NodeWatch, NodeZeroFallingSilentIsNoticed) {
  SilenceLimit limit("0.3");
  auto [port, node0, node1] = TwoWatches();
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  ASSERT_NE(node1, nullptr);
  node0->look();
  EXPECT_TRUE(node1->look().lost.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  node0->look();
  EXPECT_TRUE(node1->look().lost.empty()) << "it beat since";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const NodeNews news = node1->look();
  EXPECT_NE(
      news.lost.find("node 0's launcher has not been heard from"),
      std::string::npos)
      << news.lost;
}

// `orchard launch --max-restarts`: each attempt's failures and ends are
// its own; every node reads the same first failure's code.
TEST(NodeWatch, EachAttemptHasItsOwnFailuresAndEnds) {
  auto [port, node0, node1] = TwoWatches();
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  ASSERT_NE(node1, nullptr);
  EXPECT_EQ(node0->first_failure_code(), 0);
  node1->report_failure("rank 1 (node 1) exited with code 3", 3);
  EXPECT_EQ(node0->look().failure, "rank 1 (node 1) exited with code 3");
  EXPECT_EQ(node0->first_failure_code(), 3);
  EXPECT_EQ(node1->first_failure_code(), 3);
  node1->finished(3);
  node0->look();
  EXPECT_TRUE(node0->others_finished());

  node0->start_attempt(1);
  node1->start_attempt(1);
  EXPECT_EQ(node0->first_failure_code(), 0);
  EXPECT_TRUE(node0->look().failure.empty()) << "attempt 0's, not news";
  EXPECT_TRUE(node0->failures_elsewhere().empty());
  EXPECT_FALSE(node0->others_finished()) << "node 1 has not ended attempt 1";
  node0->report_failure("rank 0 (node 0) exited with code 2", 2);
  EXPECT_EQ(node1->look().failure, "rank 0 (node 0) exited with code 2");
  EXPECT_EQ(node1->first_failure_code(), 2);
  node1->finished(2);
  node0->look();
  EXPECT_TRUE(node0->others_finished());
}

TEST(NodeWatch, ATakenPortAndABadSilenceLimitAreRefused) {
  const int port = free_port();
  auto node0 = NodeWatch::start("127.0.0.1", port, 0, 2);
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  try {
    NodeWatch::start("127.0.0.1", port, 0, 2);
    ADD_FAILURE() << "a second node 0 on one port";
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "orchard launch cannot serve the rendezvous on port " +
            std::to_string(port)),
        std::string::npos)
        << e.what();
  }
  SilenceLimit limit("soon");
  EXPECT_THROW(node_silence_limit_s(), UserError);
}

TEST(NodeWatch, LaunchDifferencesNameEachSettingAndBothValues) {
  const LaunchSettings node0 = {
      {"--nnodes", "2"}, {"--nproc-per-node", "4"}, {"--max-restarts", "0"}};
  EXPECT_EQ(launch_differences(node0, node0, 1), "");
  EXPECT_EQ(
      launch_differences(
          node0,
          {{"--nnodes", "3"},
           {"--nproc-per-node", "4"},
           {"--max-restarts", "2"}},
          2),
      "--nnodes is 2 on node 0 but 3 on node 2; --max-restarts is 0 on node "
      "0 but 2 on node 2");
  EXPECT_EQ(
      launch_differences({}, {{"--nnodes", "2"}}, 1),
      "--nnodes is not set on node 0 but 2 on node 1");
}

// A node started with other counts than node 0's is refused (exit 2), and
// node 0 reads it as the run's failure with code 2, so it stops its ranks
// and does not restart them; a second launcher as the same node is
// refused without disturbing the first.
TEST(NodeWatch, NodesLaunchedUnlikeOrTwiceAreRefused) {
  const int port = free_port();
  const LaunchSettings two = {
      {"--nnodes", "2"}, {"--nproc-per-node", "2"}, {"--max-restarts", "0"}};
  auto node0 = NodeWatch::start("127.0.0.1", port, 0, 2, two);
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  LaunchSettings one = two;
  one[1].second = "1";
  const auto unlike =
      test::refusal_of([&] { NodeWatch::start("127.0.0.1", port, 1, 2, one); });
  EXPECT_EQ(unlike.exit_code, 2) << "node 1 with another --nproc-per-node";
  EXPECT_NE(
      unlike.what.find(
          "node 1's orchard launch was started with other settings than "
          "node 0's: --nproc-per-node is 2 on node 0 but 1 on node 1. "
          "Start every node's `orchard launch` with the same --nnodes, "
          "--nproc-per-node and --max-restarts"),
      std::string::npos)
      << unlike.what;
  const NodeNews news = node0->look();
  EXPECT_NE(
      news.failure.find("--nproc-per-node is 2 on node 0 but 1 on node 1"),
      std::string::npos)
      << news.failure;
  EXPECT_EQ(news.failure_code, 2);
  EXPECT_EQ(node0->first_failure_code(), 2);
  node0->look();
  EXPECT_TRUE(node0->others_finished()) << "the refused node said it ended";

  // Two launchers as node 1 of another run: the second is refused.
  const int port2 = free_port();
  auto other0 = NodeWatch::start("127.0.0.1", port2, 0, 2, two);
  auto other1 = NodeWatch::start("127.0.0.1", port2, 1, 2, two);
  const auto twice = test::refusal_of(
      [&] { NodeWatch::start("127.0.0.1", port2, 1, 2, two); });
  EXPECT_EQ(twice.exit_code, 2) << "a second node 1";
  EXPECT_NE(
      twice.what.find(
          "orchard launch --node-rank 1: node 1 has already joined the "
          "rendezvous at 127.0.0.1:" +
          std::to_string(port2) + ". Give each node its own --node-rank"),
      std::string::npos)
      << twice.what;
  EXPECT_TRUE(other0->look().failure.empty()) << "the run goes on";
  EXPECT_TRUE(other0->look().lost.empty());
}

// Node 0 takes a node whose launcher never joined for lost once the join
// limit has passed, and says how to start it; a node that joined late but
// within the limit is not.
TEST(NodeWatch, ANodeThatNeverJoinsIsNamedWithItsCommand) {
  ShortWait join("ORCHARD_TEST_NODE_JOIN_S", "0.5");
  const int port = free_port();
  const LaunchSettings three = {
      {"--nnodes", "3"}, {"--nproc-per-node", "1"}, {"--max-restarts", "0"}};
  auto node0 = NodeWatch::start("127.0.0.1", port, 0, 3, three);
  if (!node0)
    GTEST_SKIP() << "this build has no c10d";
  EXPECT_TRUE(node0->look().lost.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto node2 = NodeWatch::start("127.0.0.1", port, 2, 3, three);
  node2->look();
  EXPECT_TRUE(node0->look().lost.empty()) << "within the limit";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  node2->look();
  const NodeNews news = node0->look();
  EXPECT_NE(
      news.lost.find(
          "node 1's launcher has not joined the rendezvous at 127.0.0.1:" +
          std::to_string(port) + " within 0.5 s: start `"),
      std::string::npos)
      << news.lost;
  EXPECT_NE(
      news.lost.find(
          " launch --nnodes 3 --nproc-per-node 1 --max-restarts 0 --node-rank "
          "1 --master-addr 127.0.0.1 --master-port " +
          std::to_string(port) + " -- ...` there"),
      std::string::npos)
      << news.lost;
  EXPECT_TRUE(node0->others_finished()) << "a missing node is not waited for";
}

TEST(StopSignal, RanksAgreeOnTheSignalTheyWereSent) {
  // Sums over the ranks of (was signalled, signal): nobody; one of two
  // ranks sent SIGINT; both SIGHUP; SIGINT and SIGTERM (no one signal).
  EXPECT_EQ(train::agreed_stop_signal(0, 0), 0);
  EXPECT_EQ(train::agreed_stop_signal(1, SIGINT), SIGINT);
  EXPECT_EQ(train::agreed_stop_signal(2, 2 * SIGHUP), SIGHUP);
  EXPECT_EQ(train::agreed_stop_signal(2, SIGINT + SIGTERM), SIGTERM);
  // The means the trainer reads (each sum divided by the ranks, 3 here).
  EXPECT_EQ(train::agreed_stop_signal(1.0 / 3, SIGINT / 3.0), SIGINT);
}

} // namespace
} // namespace orchard::dist
