// How long `orchard train` runs: num_iterations, target_tokens or epochs,
// the later source winning, two from one source refused.
#include "core/error.h"
#include "train/pretrain.h"

#include <gtest/gtest.h>

namespace orchard::train {
namespace {

PretrainConfig base() {
  PretrainConfig c;
  c.num_iterations.reset();
  c.max_seq_len = 100;
  return c;
}

// 1000 windows per epoch; 10 sequences (1000 tokens) per step.
int64_t steps(const PretrainConfig& c, const config::Origins& o = {}) {
  return resolve_num_steps(c, o, 1000, 10);
}

TEST(TrainLength, EachWayOfSayingIt) {
  auto c = base();
  EXPECT_EQ(steps(c), 100); // auto: one epoch
  c.epochs = 2.5;
  EXPECT_EQ(steps(c), 250);
  c = base();
  c.target_tokens = 12345; // rounded up to whole steps of 1000 tokens
  EXPECT_EQ(steps(c), 13);
  c = base();
  c.num_iterations = 7;
  EXPECT_EQ(steps(c), 7);
  c.epochs = 0.0;
  EXPECT_EQ(
      steps(
          c,
          {{"epochs", "preset quick (quick.yaml:3)"},
           {"num_iterations", "command line"}}),
      7);
}

TEST(TrainLength, TheLaterSourceWins) {
  auto c = base();
  c.num_iterations = 100; // from the preset
  c.epochs = 2.0;         // from the command line
  EXPECT_EQ(
      steps(
          c,
          {{"num_iterations", "preset quick (quick.yaml:9)"},
           {"epochs", "command line"}}),
      200);
  c.target_tokens = 5000; // from the environment: loses to the command line
  EXPECT_EQ(
      steps(
          c,
          {{"num_iterations", "preset quick (quick.yaml:9)"},
           {"target_tokens", "environment TARGET"},
           {"epochs", "command line"}}),
      200);
  // A default num_iterations (no origin) loses to anything set.
  auto d = base();
  d.num_iterations = 100;
  d.target_tokens = 3000;
  EXPECT_EQ(steps(d, {{"target_tokens", "run.yaml:2"}}), 3);
}

TEST(TrainLength, TwoFromOneSourceAreRefused) {
  auto c = base();
  c.num_iterations = 10;
  c.epochs = 1.0;
  try {
    steps(c, {{"num_iterations", "command line"}, {"epochs", "command line"}});
    FAIL();
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("num_iterations"), std::string::npos) << m;
    EXPECT_NE(m.find("epochs"), std::string::npos) << m;
    EXPECT_NE(m.find("keep one"), std::string::npos) << m;
  }
  auto z = base();
  z.epochs = 0.0;
  EXPECT_THROW(steps(z), UserError);
}

} // namespace
} // namespace orchard::train
