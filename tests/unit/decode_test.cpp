// Decoding at speed: the device sampler draws from the same distribution as
// the CPU one, rows do not depend on their batch, batched generation equals
// one-by-one generation, its log-probabilities equal a full forward pass,
// and (on a CUDA machine) replayed CUDA graphs give the eager tokens.
#include "infer/decode_step.h"
#include "infer/engine.h"
#include "infer/sampling.h"

#include "gpt_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace orchard::infer {
namespace {

models::Gpt random_model(int64_t max_seq_len = 200) {
  return test::random_gpt(50, max_seq_len, 1, 11, 0.5);
}

// Frequencies of `draws` tokens drawn by a device-mode sampler from one
// row of logits.
std::vector<double> frequencies(
    const torch::Tensor& logits,
    SamplingOptions opt,
    int draws) {
  opt.sampling_device = "device";
  Sampler s(torch::kCPU);
  s.add_row(opt);
  std::vector<double> f(size_t(logits.size(0)), 0.0);
  auto row = logits.view({1, -1});
  for (int i = 0; i < draws; ++i)
    f[size_t(s.sample(row).item<int64_t>())] += 1.0 / draws;
  return f;
}

// The exponential-race draw samples softmax(logits / T), truncated by top-k
// and top-p as the CPU sampler truncates: frequencies over 20,000 draws
// within 0.015 of the probabilities computed by hand.
TEST(Decode, DeviceSamplerDrawsFromTheSoftmax) {
  auto logits = torch::tensor({0.f, 2.f, 1.5f, 1.f});
  auto softmax = [](std::vector<double> z, double t) {
    double sum = 0;
    for (auto& v : z)
      sum += (v = std::exp(v / t));
    for (auto& v : z)
      v /= sum;
    return z;
  };
  SamplingOptions o;
  o.top_k = 0;
  for (double t : {1.0, 0.5}) {
    o.temperature = t;
    auto want = softmax({0, 2, 1.5, 1}, t);
    auto got = frequencies(logits, o, 20000);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_NEAR(got[i], want[i], 0.015) << "T " << t << " token " << i;
  }
  o.temperature = 1;
  o.top_k = 2; // tokens 1 and 2, renormalised
  auto two = softmax({2, 1.5}, 1);
  auto got = frequencies(logits, o, 20000);
  EXPECT_EQ(got[0] + got[3], 0.0);
  EXPECT_NEAR(got[1], two[0], 0.015);
  // top_p 0.6: token 1 (0.47) and token 2 (0.29; 0.47 of likelier mass
  // before it) remain, token 3 (0.76 before it) and token 0 go.
  o.top_k = 0;
  o.top_p = 0.6;
  got = frequencies(logits, o, 20000);
  EXPECT_EQ(got[0] + got[3], 0.0);
  EXPECT_NEAR(got[1], two[0], 0.015);
  // Greedy and top_k = 1 are the argmax.
  o.top_p = 1;
  o.top_k = 1;
  EXPECT_NEAR(frequencies(logits, o, 50)[1], 1.0, 1e-9);
  o.temperature = 0;
  EXPECT_NEAR(frequencies(logits, o, 50)[1], 1.0, 1e-9);
}

// min_p drops tokens below min_p x the likeliest one's probability, on both
// samplers: probabilities of {0, 2, 1.5, 1} are 1 : 7.39 : 4.48 : 2.72, so
// min_p 0.5 (cut at 3.69) keeps tokens 1 and 2, renormalised.
TEST(Decode, MinPKeepsTokensNearTheLikeliest) {
  auto logits = torch::tensor({0.f, 2.f, 1.5f, 1.f});
  SamplingOptions o;
  o.top_k = 0;
  o.temperature = 1;
  o.min_p = 0.5;
  const double keep1 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.5));
  auto got = frequencies(logits, o, 20000);
  EXPECT_EQ(got[0] + got[3], 0.0);
  EXPECT_NEAR(got[1], keep1, 0.015);
  std::vector<double> cpu(4, 0.0);
  auto gen = make_generator(torch::kCPU, 5);
  for (int i = 0; i < 20000; ++i)
    cpu[size_t(sample_token(logits, o, gen))] += 1.0 / 20000;
  EXPECT_EQ(cpu[0] + cpu[3], 0.0);
  EXPECT_NEAR(cpu[1], keep1, 0.015);
  // min_p 1: only the likeliest.
  o.min_p = 1;
  EXPECT_NEAR(frequencies(logits, o, 50)[1], 1.0, 1e-9);
}

// The repetition penalty: a seen token's logit is divided by the penalty
// when positive and multiplied when negative; the prompt counts as seen,
// and so does every drawn token, row by row, also after rows are removed.
TEST(Decode, RepetitionPenaltyCountsThePromptAndEachDrawnToken) {
  auto z = torch::tensor({{-1.f, 0.5f, 0.2f, 3.f}});
  auto seen = torch::tensor({{true, true, false, false}});
  auto p = penalize_repetition(z, seen, torch::full({1, 1}, 2.f));
  EXPECT_TRUE(torch::equal(p, torch::tensor({{-2.f, 0.25f, 0.2f, 3.f}})));
  // Greedy over {2, 1.9, 1.8, 1.7, 0} with penalty 4: each pick is
  // penalised next, so the argmax walks down the list; token 0 was in the
  // prompt, so it is skipped from the start.
  auto logits = torch::tensor({{2.f, 1.9f, 1.8f, 1.7f, 0.f}}).expand({3, 5});
  for (const char* where : {"cpu", "device"}) {
    SamplingOptions g;
    g.temperature = 0;
    g.repetition_penalty = 4;
    g.sampling_device = where;
    SamplingOptions plain = g;
    plain.repetition_penalty = 1;
    Sampler s(torch::kCPU);
    s.add_row(plain, {1}); // A
    s.add_row(g, {0});     // B: its prompt holds token 0
    s.add_row(g, {});      // C
    auto t = s.sample(logits);
    EXPECT_EQ(t[0].item<int64_t>(), 0) << where; // A: no penalty
    EXPECT_EQ(t[1].item<int64_t>(), 1) << where;
    EXPECT_EQ(t[2].item<int64_t>(), 0) << where;
    s.remove_row(0); // C moves to row 0 with what it has seen
    s.add_row(plain, {});
    std::vector<int64_t> b = {1}, c = {0};
    for (int i = 0; i < 2; ++i) {
      t = s.sample(logits);
      c.push_back(t[0].item<int64_t>());
      b.push_back(t[1].item<int64_t>());
      EXPECT_EQ(t[2].item<int64_t>(), 0) << where;
    }
    EXPECT_EQ(b, (std::vector<int64_t>{1, 2, 3})) << where;
    EXPECT_EQ(c, (std::vector<int64_t>{0, 1, 2})) << where;
  }
  // The CPU sampler's sequence argument, as the reference path uses it.
  SamplingOptions g;
  g.temperature = 0;
  g.repetition_penalty = 4;
  auto gen = make_generator(torch::kCPU, 1);
  EXPECT_EQ(sample_token(logits[0], g, gen, {0, 1}), 2);
}

// A row's tokens depend on its seed alone, not on the rows beside it; a
// greedy row beside a sampled one stays the argmax; rows removed from the
// middle leave the others' streams intact.
TEST(Decode, SamplerRowsAreIndependentOfTheBatch) {
  torch::manual_seed(3);
  auto logits = torch::randn({3, 30});
  SamplingOptions a, b, g;
  a.sampling_device = b.sampling_device = g.sampling_device = "device";
  a.seed = 1;
  a.top_k = 10;
  b.seed = 2;
  b.top_p = 0.8;
  g.temperature = 0;
  Sampler alone(torch::kCPU), together(torch::kCPU);
  alone.add_row(a);
  together.add_row(g);
  together.add_row(a);
  together.add_row(b);
  for (int step = 0; step < 40; ++step) {
    auto one = alone.sample(logits.narrow(0, 1, 1));
    auto three = together.sample(logits);
    EXPECT_EQ(three[1].item<int64_t>(), one[0].item<int64_t>()) << step;
    EXPECT_EQ(three[0].item<int64_t>(), logits[0].argmax().item<int64_t>());
  }
  // Removing row 0 moves row 2 (b) into its place; a stays row 1.
  together.remove_row(0);
  EXPECT_EQ(together.options(0).seed, 2u);
  auto two = together.sample(torch::stack({logits[2], logits[1]}));
  EXPECT_EQ(two[1].item<int64_t>(), alone.sample(logits.narrow(0, 1, 1))[0].item<int64_t>());
}

// Each row of generate_batch equals generate() of its prompt with the row's
// seed (opt.seed + row): greedy, and sampled on the CPU and on the device
// sampler; prompts of different lengths decode at their own positions.
TEST(Decode, BatchedRowsEqualOneByOne) {
  Engine e(random_model().ptr(), torch::kCPU);
  std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4}, {5, 6, 7, 8, 9, 10, 11}};
  for (const char* where : {"cpu", "device"})
    for (double t : {0.0, 1.0}) {
      SamplingOptions o;
      o.temperature = t;
      o.max_new_tokens = 30;
      o.seed = 100;
      o.sampling_device = where;
      auto batch = e.generate_batch(prompts, 2, o);
      ASSERT_EQ(batch.tokens.size(), 6u);
      for (size_t r = 0; r < 6; ++r) {
        SamplingOptions one = o;
        one.seed = o.seed + r;
        EXPECT_EQ(batch.tokens[r], e.generate(prompts[r / 2], one))
            << where << " T " << t << " row " << r;
        EXPECT_EQ(batch.finish[r], "length");
      }
      if (t > 0) // two samples of one prompt differ
        EXPECT_NE(batch.tokens[0], batch.tokens[1]);
    }
}

// The log-probabilities returned with each token are those of a full
// forward pass over prompt + completion.
TEST(Decode, LogprobsEqualAFullForward) {
  auto model = random_model();
  Engine e(model.ptr(), torch::kCPU);
  SamplingOptions o;
  o.temperature = 1.0;
  o.max_new_tokens = 20;
  o.sampling_device = "device";
  std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7, 8}};
  auto batch = e.generate_batch(prompts, 3, o);
  torch::NoGradGuard no_grad;
  for (size_t r = 0; r < 6; ++r) {
    std::vector<int64_t> seq = prompts[r / 3];
    const size_t P = seq.size();
    seq.insert(seq.end(), batch.tokens[r].begin(), batch.tokens[r].end());
    auto logits = model->forward(torch::tensor(seq).view({1, -1}));
    auto lp = torch::log_softmax(logits[0], -1);
    ASSERT_EQ(batch.logprobs[r].size(), batch.tokens[r].size());
    for (size_t k = 0; k < batch.tokens[r].size(); ++k)
      EXPECT_NEAR(
          batch.logprobs[r][k],
          lp[int64_t(P + k - 1)][batch.tokens[r][k]].item<float>(),
          1e-4)
          << "row " << r << " token " << k;
  }
}

// A stop token ends its row (kept, finish "stop"); the others run to
// max_new_tokens; a prompt near the model's limit stops at the limit.
TEST(Decode, StopTokensEndTheirRowOnly) {
  Engine e(random_model(40).ptr(), torch::kCPU);
  SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 25;
  auto free_run = e.generate_batch({{1}, {2}}, 1, o);
  o.stop_tokens = {free_run.tokens[0][4]};
  auto stopped = e.generate_batch({{1}, {2}, std::vector<int64_t>(35, 3)}, 1, o);
  EXPECT_EQ(stopped.finish[0], "stop");
  EXPECT_LE(stopped.tokens[0].size(), 5u);
  EXPECT_EQ(stopped.tokens[0].back(), free_run.tokens[0][4]);
  const bool second_stops = std::find(
                                free_run.tokens[1].begin(),
                                free_run.tokens[1].end(),
                                o.stop_tokens[0]) != free_run.tokens[1].end();
  if (!second_stops) {
    EXPECT_EQ(stopped.tokens[1], free_run.tokens[1]);
    EXPECT_EQ(stopped.finish[1], "length");
  }
  // 35 prompt tokens of 40 positions: at most 5 new ones.
  EXPECT_LE(stopped.tokens[2].size(), 5u);
}

// prepare_inference() on Orchard's GPT (c_q, c_k, c_v stacked into one
// matrix, the projections views of it) keeps the logits and the tokens.
TEST(Decode, PreparedGptKeepsItsLogitsAndTokens) {
  auto model = random_model();
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor({{1, 2, 3, 4, 5, 6, 7}});
  auto before = model->forward(ids);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 40;
  auto tokens = Engine(model.ptr(), torch::kCPU).generate({1, 2, 3}, greedy);
  EXPECT_EQ(model->prepare_inference(), 0); // no adapters to merge
  auto* block = model->blocks[0]->as<models::BlockImpl>();
  ASSERT_TRUE(block->attn->qkv_weight.defined());
  EXPECT_EQ(
      block->attn->c_k->weight.data_ptr<float>(),
      block->attn->qkv_weight.data_ptr<float>() +
          block->attn->c_q->weight.numel());
  EXPECT_LT((model->forward(ids) - before).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(Engine(model.ptr(), torch::kCPU).generate({1, 2, 3}, greedy), tokens);
}

// On a CUDA machine: replayed graphs give the eager tokens, one sequence
// and a batch, for Orchard's GPT in float32 and a bfloat16 copy of it.
TEST(Decode, GraphReplayEqualsEagerTokenForToken) {
  if (!torch::cuda::is_available() || !cuda_graphs_built())
    GTEST_SKIP() << "SKIPPED: needs CUDA and a libtorch 2.x CUDA build";
  const torch::Device cuda(torch::kCUDA, 0);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto model = random_model(300);
    model->to(cuda, dtype);
    Engine graphs(model.ptr(), cuda, true), eager(model.ptr(), cuda, false);
    SamplingOptions o;
    o.temperature = 0;
    o.max_new_tokens = 200; // crosses a key bucket (128)
    std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
    auto want = eager.generate(prompt, o);
    EXPECT_EQ(graphs.generate(prompt, o), want) << dtype;
    EXPECT_TRUE(graphs.uses_graphs());
    o.temperature = 0.9;
    o.sampling_device = "device";
    auto a = graphs.generate_batch({{1, 2}, {3, 4, 5, 6}}, 4, o);
    auto b = eager.generate_batch({{1, 2}, {3, 4, 5, 6}}, 4, o);
    EXPECT_EQ(a.tokens, b.tokens) << dtype;
    // More rows: the cache grows, the graphs are captured again (in a new
    // memory pool; reusing the old pool's id failed the capture once).
    a = graphs.generate_batch({{1, 2}, {3, 4, 5, 6}}, 8, o);
    b = eager.generate_batch({{1, 2}, {3, 4, 5, 6}}, 8, o);
    EXPECT_EQ(a.tokens, b.tokens) << dtype;
    EXPECT_TRUE(graphs.uses_graphs()) << "a capture failed: see stderr";
  }
}

} // namespace
} // namespace orchard::infer
