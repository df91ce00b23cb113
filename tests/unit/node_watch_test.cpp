// The launchers' watch on each other (src/dist/node_watch.h), two of them
// in this process over loopback: a failure reported by one node is read
// by the other once, a node that stops beating is taken for gone, node 0's
// store going away is noticed, each attempt of a restarted run is apart;
// and the signal several ranks agree to stop for (train/trainer.h).
#include "dist/node_watch.h"
#include "core/error.h"
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

struct SilenceLimit {
  explicit SilenceLimit(const char* s) {
    ::setenv("ORCHARD_TEST_NODE_SILENCE_S", s, 1);
  }
  ~SilenceLimit() {
    ::unsetenv("ORCHARD_TEST_NODE_SILENCE_S");
  }
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
