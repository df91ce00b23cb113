#include "train/schedule.h"
#include "core/error.h"

#include <gtest/gtest.h>

namespace orchard::train {
namespace {

TEST(Schedule, GradAccumulation) {
  EXPECT_EQ(grad_accum_steps(16384, 4, 1024), 4);
  EXPECT_EQ(grad_accum_steps(16384, 16, 1024), 1);
  EXPECT_EQ(grad_accum_steps(16384, 4, 1024, 2), 2);
}

TEST(Schedule, IndivisibleBatchSaysWhatUsersKnowAndTheFix) {
  try {
    grad_accum_steps(10000, 4, 1024);
    FAIL();
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_EQ(
        m.rfind(
            "total_batch_size must be divisible by device_batch_size × max_seq_len",
            0),
        0u)
        << m;
    EXPECT_NE(
        m.find("Nearest valid total_batch_size: 8192 or 12288"),
        std::string::npos)
        << m;
  }
  try {
    grad_accum_steps(12288, 8, 1024); // 12 sequences: 8 does not divide
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "device_batch_size one of: 1, 2, 3, 4, 6, 12"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      grad_accum_steps(512, 4, 1024),
      UserError); // smaller than one micro-batch
}

TEST(Schedule, WarmupConstantWarmdown) {
  // 10 steps, 2 warmup, warmdown over the last 4 (ratio 0.4) to 0.
  std::vector<double> want = {0.5, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25};
  for (int s = 0; s < 10; ++s)
    EXPECT_DOUBLE_EQ(lr_multiplier(s, 10, 2, 0.4), want[s]) << s;
  EXPECT_DOUBLE_EQ(lr_multiplier(9, 10, 0, 0.4, 0.1), 0.25 + 0.75 * 0.1);
  EXPECT_DOUBLE_EQ(lr_multiplier(5, 10, 0, 0.0), 1.0);
}

} // namespace
} // namespace orchard::train
