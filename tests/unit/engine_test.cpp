// Generation: the KV cache changes nothing, the seed decides everything.
#include "infer/engine.h"
#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include "gpt_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace orchard::infer {
namespace {

models::Gpt engine_model() {
  return test::random_gpt(50, 40, 1, 11, 0.5);
}

TEST(Engine, GreedyWithCacheEqualsWithout) {
  Engine e(engine_model().ptr(), torch::kCPU);
  SamplingOptions greedy;
  greedy.temperature = 0;
  // 32: the engine reads tokens in chunks of 32; a whole number of chunks
  // leaves none pending at the end.
  for (int64_t n : {25, 32}) {
    greedy.max_new_tokens = n;
    auto cached = e.generate({1, 2, 3}, greedy, {}, true);
    auto plain = e.generate({1, 2, 3}, greedy, {}, false);
    EXPECT_EQ(cached.size(), size_t(n));
    EXPECT_EQ(cached, plain);
  }
}

// The repetition penalty and min_p through the engine: the cached,
// batched paths equal the recompute-everything reference, which applies
// the penalty from the whole sequence on the CPU.
TEST(Engine, RepetitionPenaltyAndMinPMatchTheReference) {
  Engine e(engine_model().ptr(), torch::kCPU);
  SamplingOptions o;
  o.repetition_penalty = 1.8;
  o.max_new_tokens = 20;
  o.sampling_device = "cpu";
  for (double t : {0.0, 0.9}) {
    o.temperature = t;
    o.min_p = t > 0 ? 0.05 : 0.0;
    auto plain = e.generate({1, 2, 3, 1}, o, {}, false);
    EXPECT_EQ(e.generate({1, 2, 3, 1}, o, {}, true), plain) << t;
    auto batch = e.generate_batch({{1, 2, 3, 1}}, 1, o);
    EXPECT_EQ(batch.tokens[0], plain) << t;
  }
  // Greedy with a strong penalty repeats less than without.
  o.temperature = 0;
  o.min_p = 0;
  o.repetition_penalty = 1;
  auto free_run = e.generate({1, 2, 3}, o);
  o.repetition_penalty = 10;
  auto penalised = e.generate({1, 2, 3}, o);
  auto distinct = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return std::unique(v.begin(), v.end()) - v.begin();
  };
  EXPECT_GT(distinct(penalised), distinct(free_run));
}

TEST(Engine, SameSeedSameTokens) {
  Engine e(engine_model().ptr(), torch::kCPU);
  SamplingOptions s;
  s.temperature = 1.0;
  s.top_k = 0;
  s.max_new_tokens = 30;
  s.seed = 5;
  auto a = e.generate({4, 5}, s);
  auto b = e.generate({4, 5}, s);
  EXPECT_EQ(a, b);
  s.seed = 6;
  EXPECT_NE(e.generate({4, 5}, s), a);
  // Sampling with the cache equals sampling without it, token for token.
  s.seed = 5;
  EXPECT_EQ(e.generate({4, 5}, s, {}, false), a);
}

TEST(Engine, StopsAtStopTokensAndMaxSeqLen) {
  Engine e(engine_model().ptr(), torch::kCPU);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 100;
  auto all = e.generate({1}, greedy);
  EXPECT_EQ(all.size(), 39u); // the model reads 40 positions
  greedy.stop_tokens = {all[3]};
  auto stopped = e.generate({1}, greedy);
  EXPECT_LE(stopped.size(), 4u);
  EXPECT_EQ(stopped.back(), all[3]);
  EXPECT_THROW(e.generate({}, greedy), UserError);
  EXPECT_THROW(e.generate(std::vector<int64_t>(40, 1), greedy), UserError);
}

TEST(Engine, TopKAndTopP) {
  auto logits = torch::tensor({0.f, 5.f, 4.f, 1.f});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  SamplingOptions s;
  s.temperature = 1;
  s.top_k = 1; // only the argmax remains
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(sample_token(logits, s, gen), 1);
  s.top_k = 0;
  s.top_p = 0.5; // the argmax alone holds ~0.71 of the mass
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(sample_token(logits, s, gen), 1);
  s.top_p = 0.9; // tokens 1 and 2 (0.71 + 0.26)
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i)
    seen.insert(sample_token(logits, s, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2}));
}

} // namespace
} // namespace orchard::infer
