// Checkpoints: atomic folders, pruning, and falling back past damage.
#include "runs/checkpoint.h"
#include "core/error.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace orchard::runs {
namespace {

using test::TempDir;

void save(const TempDir& run, int64_t step) {
  save_checkpoint(
      run.path().string(),
      step,
      {{"w", torch::full({3}, float(step))}},
      {{"exp_avg.w", torch::full({3}, float(-step))}},
      {{"data", {{"epoch", 0}, {"step", step}}}});
}

TEST(Checkpoint, RoundTrip) {
  TempDir run;
  save(run, 500);
  auto c = load_checkpoint(run.file("checkpoints/step_000500"));
  EXPECT_EQ(c.step, 500);
  EXPECT_TRUE(torch::equal(c.model.at("w"), torch::full({3}, 500.f)));
  EXPECT_TRUE(
      torch::equal(c.optimizer.at("exp_avg.w"), torch::full({3}, -500.f)));
  EXPECT_EQ(c.state["data"]["step"], 500);
  // No temporary folder is left behind.
  for (const auto& e :
       std::filesystem::directory_iterator(run.file("checkpoints")))
    EXPECT_EQ(e.path().filename().string(), "step_000500");
}

TEST(Checkpoint, LatestSkipsDamagedAndIncompleteOnes) {
  TempDir run;
  save(run, 100);
  save(run, 200);
  save(run, 300);
  // 300's weights truncated (a crash outside Orchard, a full disk).
  std::string weights = run.file("checkpoints/step_000300/model.safetensors");
  std::string bytes = test::read_text(weights);
  run.write(
      "checkpoints/step_000300/model.safetensors",
      bytes.substr(0, bytes.size() / 2));
  // 400 never finished: no state.json.
  run.write("checkpoints/step_000400/model.safetensors", "partial");
  // An interrupted save's temporary folder.
  run.write("checkpoints/.tmp-step_000500-99999/model.safetensors", "partial");
  std::vector<std::string> skipped;
  auto c = latest_checkpoint(run.path().string(), &skipped);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step, 200);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step_000300"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find("truncated"), std::string::npos) << skipped[0];
  EXPECT_FALSE(latest_checkpoint(run.file("nothing")).has_value());
}

TEST(Checkpoint, PruneKeepsNewestBestAndLastGood) {
  TempDir run;
  for (int64_t s : {100, 200, 300, 400, 500})
    save(run, s);
  run.write("checkpoints/.tmp-step_000600-99999/x", "partial");
  auto removed = prune_checkpoints(run.path().string(), 2, 100);
  std::vector<int64_t> left;
  for (auto& [step, dir] : list_checkpoints(run.path().string()))
    left.push_back(step);
  EXPECT_EQ(left, (std::vector<int64_t>{100, 400, 500}));
  EXPECT_FALSE(
      std::filesystem::exists(run.file("checkpoints/.tmp-step_000600-99999")));
  // The newest is damaged: the newest good one survives keep=1.
  std::string w = run.file("checkpoints/step_000500/model.safetensors");
  run.write("checkpoints/step_000500/model.safetensors", "garbage");
  prune_checkpoints(run.path().string(), 1);
  left.clear();
  for (auto& [step, dir] : list_checkpoints(run.path().string()))
    left.push_back(step);
  EXPECT_EQ(left, (std::vector<int64_t>{400, 500}));
  EXPECT_EQ(latest_checkpoint(run.path().string())->step, 400);
}

TEST(Checkpoint, SavingTheSameStepAgainReplacesIt) {
  TempDir run;
  save(run, 100);
  save_checkpoint(run.path().string(), 100, {{"w", torch::zeros({1})}}, {}, {});
  auto c = load_checkpoint(run.file("checkpoints/step_000100"));
  EXPECT_EQ(c.model.at("w").numel(), 1);
  EXPECT_EQ(checkpoint_name(7), "step_000007");
}

} // namespace
} // namespace orchard::runs
