// The batch-size schedule (train/batch_schedule.h) against modded-nanogpt's
// rule, written out here (stage floor(K * step / total)), and against sums
// over every step.
#include "train/batch_schedule.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace orchard::train {
namespace {

BatchSchedule schedule(
    std::vector<std::string> tokens,
    std::vector<std::string> starts = {}) {
  return BatchSchedule::parse(tokens, starts);
}

TEST(BatchSchedule, EqualPartsAreModdedNanogptsThirds) {
  const auto s = schedule({"2*2048*8", "4*2048*8", "6*2048*8"});
  ASSERT_EQ(s.tokens(), (std::vector<int64_t>{32768, 65536, 98304}));
  EXPECT_EQ(s.unit(), 32768);
  for (int64_t total : {1, 2, 3, 7, 10, 100, 1001})
    for (int64_t step = 0; step < total; ++step) {
      const int64_t want = std::min<int64_t>(2, 3 * step / total);
      EXPECT_EQ(int64_t(s.stage_at(step, total)), want)
          << "step " << step << " of " << total;
      EXPECT_EQ(s.multiple_at(step, total), want + 1);
    }
  // Off, every step is one unit (the trainer's plain accumulation).
  EXPECT_EQ(BatchSchedule().multiple_at(5, 10), 1);
}

TEST(BatchSchedule, GivenStepsStartTheLaterStages) {
  const auto s = schedule({"4096", "8192", "12288"}, {"3", "5"});
  const int64_t want[] = {0, 0, 0, 1, 1, 2, 2, 2};
  for (int64_t step = 0; step < 8; ++step)
    EXPECT_EQ(int64_t(s.stage_at(step, 8)), want[step]) << step;
  EXPECT_EQ(
      s.describe(8),
      "4096 tokens a step for steps 1-3, 8192 for steps 4-5, 12288 "
      "for steps 6-8");
  EXPECT_EQ(
      s.describe(4),
      "4096 tokens a step for steps 1-3, 8192 for step 4, 12288 "
      "(never reached)");
}

TEST(BatchSchedule, TokensThroughAndStepsForAreTheSums) {
  for (const auto& s :
       {schedule({"100", "300", "200"}),
        schedule({"100", "300"}, {"5"}),
        schedule({"700"})}) {
    for (int64_t total = 1; total < 40; ++total) {
      int64_t sum = 0;
      for (int64_t step = 0; step < total; ++step) {
        EXPECT_EQ(s.tokens_through(step, total), sum);
        sum += s.tokens_at(step, total);
      }
      EXPECT_EQ(s.tokens_through(total, total), sum);
    }
    for (int64_t tokens : {1, 99, 100, 101, 1000, 4321}) {
      const int64_t n = s.steps_for(tokens);
      EXPECT_GE(s.tokens_through(n, n), tokens);
      for (int64_t m = 1; m < n; ++m) // none shorter carries them
        EXPECT_LT(s.tokens_through(m, m), tokens) << m << " of " << n;
    }
  }
}

TEST(BatchSchedule, BadEntriesSayWhichAndHow) {
  auto message = [](std::vector<std::string> t, std::vector<std::string> s) {
    try {
      BatchSchedule::parse(t, s);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(
      message({"4096", "abc"}, {}).find("batch_schedule[1] = 'abc'"),
      std::string::npos);
  EXPECT_NE(message({"0"}, {}).find("zero"), std::string::npos);
  EXPECT_NE(message({"2**8"}, {}).find("2*2048*8"), std::string::npos);
  EXPECT_NE(
      message({"-4096"}, {}).find("not a positive whole number"),
      std::string::npos);
  EXPECT_NE(
      message({"99999999999*99999999999"}, {}).find("too large"),
      std::string::npos);
  EXPECT_NE(
      message({"1", "2", "3"}, {"10"}).find("one fewer than the stages"),
      std::string::npos);
  EXPECT_NE(
      message({"1", "2", "3"}, {"10", "10"}).find("must increase"),
      std::string::npos);
  EXPECT_NE(
      message({}, {"10"}).find("without batch_schedule"), std::string::npos);
  EXPECT_FALSE(schedule({}).on());
}

} // namespace
} // namespace orchard::train
