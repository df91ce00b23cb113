// GRPO learns on a CPU: a ~130K-parameter GPT, warmed up for 1,000 steps on
// five-letter words after a letter (30 % of them starting with it), is trained by
// grpo::Learner to answer a letter with a dictionary word that starts with
// it (env=letters: 1 for that, 0.1 for any word). The held-out reward must
// rise by a clear margin, and the same run with every advantage forced to
// zero (the control) must not: the rise comes from the rewards, not from
// the loss's mechanics. One thread, as the issue measured (two threads are
// slower at this size).
#include "infer/engine.h"
#include "models/gpt.h"
#include "stages/grpo/environment.h"
#include "stages/grpo/learner.h"
#include "text/pretokenizer.h"
#include "text/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <random>

namespace orchard {
namespace {

// Bytes as tokens, and <|bos|> (256) between documents.
std::shared_ptr<const text::Tokenizer> byte_tokenizer() {
  std::vector<text::TokenEntry> tokens;
  for (int b = 0; b < 256; ++b)
    tokens.push_back(
        {std::string(1, char(b)), text::TokenId(b), text::Tokenizer::kNoRank});
  return std::make_shared<const text::Tokenizer>(
      std::move(tokens),
      std::map<std::string, text::TokenId>{{"<|bos|>", 256}},
      text::kGpt4Pattern,
      "orchard");
}

models::GptConfig small_gpt() {
  models::GptConfig c;
  c.vocab_size = 257;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 4;
  c.max_seq_len = 32;
  return c;
}

// Supervised warm-up: "<bos>c: crane<bos>", the word starting with the
// letter 30 % of the time.
void warm_up(
    models::Gpt& model,
    const std::vector<std::string>& words,
    int steps) {
  std::mt19937_64 rng(7);
  std::map<char, std::vector<std::string>> by_letter;
  for (const auto& w : words)
    by_letter[w[0]].push_back(w);
  std::vector<char> letters;
  for (const auto& [c, ws] : by_letter)
    letters.push_back(c);
  torch::optim::AdamW opt(
      model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0));
  model->train();
  const int64_t B = 32, T = 10; // bos c : space w1..w5 bos
  for (int s = 0; s < steps; ++s) {
    auto x = torch::empty({B, T}, torch::kLong);
    auto acc = x.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const char c = letters[rng() % letters.size()];
      const auto& pool = rng() % 10 < 3 ? by_letter[c] : words;
      const std::string w = pool[rng() % pool.size()];
      const std::string doc = std::string(1, c) + ": " + w;
      acc[b][0] = 256;
      for (int64_t i = 0; i < 8; ++i)
        acc[b][i + 1] = static_cast<unsigned char>(doc[size_t(i)]);
      acc[b][9] = 256;
    }
    auto in = x.narrow(1, 0, T - 1);
    auto target = x.narrow(1, 1, T - 1).clone();
    target.narrow(1, 0, 2).fill_(-1); // the letter and ':' are given
    opt.zero_grad();
    model->loss(in, target).backward();
    opt.step();
  }
}

struct Rewards {
  double before = 0, after = 0;
};

Rewards grpo_run(
    models::Gpt model,
    const grpo::Environment& env,
    bool zero_advantages,
    int steps) {
  grpo::LearnerOptions o;
  o.num_generations = 8;
  o.generation_batch = 128; // 16 prompts x 8
  o.rows_per_step = 128;
  o.max_completion_length = 8;
  o.temperature = 1.0;
  o.loss.type = grpo::LossType::dapo;
  o.loss.max_completion_length = 8;
  o.weights = env.default_weights();
  o.seed = 11;
  o.graphs = false;
  o.zero_advantages = zero_advantages;
  grpo::Policy policy;
  policy.model = model.ptr();
  auto prompter = std::make_shared<grpo::Prompter>(byte_tokenizer(), nullptr, 16);
  grpo::Learner learner(o, policy, env, prompter, nullptr);
  torch::optim::AdamW opt(
      model->parameters(),
      torch::optim::AdamWOptions(3e-3).weight_decay(0));
  Rewards r;
  model->eval();
  r.before = learner.evaluate(26).reward;
  model->train();
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    learner.micro_step(128).backward();
    opt.step();
  }
  model->eval();
  r.after = learner.evaluate(26).reward;
  return r;
}

TEST(GrpoLearning, HeldOutRewardRisesOnACpuAndNotWithoutAdvantages) {
  torch::set_num_threads(1);
  auto env = grpo::make_environment({.name = "letters"});
  const auto words = grpo::read_words(grpo::default_word_list(), 5);
  torch::manual_seed(3);
  models::Gpt warm(small_gpt());
  warm_up(warm, words, 1000);
  auto copy = [&] {
    models::Gpt m(small_gpt());
    torch::NoGradGuard no_grad;
    auto src = warm->parameters();
    auto dst = m->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].copy_(src[i]);
    return m;
  };
  const int steps = 200;
  const Rewards learned = grpo_run(copy(), *env, false, steps);
  const Rewards control = grpo_run(copy(), *env, true, steps);
  std::printf(
      "held-out reward: GRPO %.3f -> %.3f, control %.3f -> %.3f\n",
      learned.before,
      learned.after,
      control.before,
      control.after);
  EXPECT_GE(learned.after - learned.before, 0.25);
  EXPECT_LT(control.after - control.before, 0.1);
}

} // namespace
} // namespace orchard

namespace orchard {
namespace {

// The log-probabilities the loss uses (right-padded rows, completions at
// each row's own column) are the engine's for the tokens it sampled, at
// temperature 1.
TEST(GrpoLearning, LossLogProbabilitiesAreTheSamplersOwn) {
  torch::manual_seed(5);
  models::Gpt model(small_gpt());
  model->eval();
  infer::Engine engine(model.ptr(), torch::kCPU, false);
  const std::vector<std::vector<int64_t>> prompts = {{256, 97, 58}, {256, 98, 58, 32, 120}};
  infer::SamplingOptions so;
  so.max_new_tokens = 6;
  so.temperature = 1.0;
  so.top_k = 0;
  so.seed = 3;
  auto g = engine.generate_batch(prompts, 2, so);
  const int64_t R = 4, L = 5 + 6, C = 6;
  auto ids = torch::zeros({R, L}, torch::kLong);
  auto starts = torch::zeros({R}, torch::kLong);
  for (int64_t r = 0; r < R; ++r) {
    const auto& p = prompts[size_t(r / 2)];
    for (size_t k = 0; k < p.size(); ++k)
      ids[r][int64_t(k)] = p[k];
    for (size_t k = 0; k < g.tokens[size_t(r)].size(); ++k)
      ids[r][int64_t(p.size() + k)] = g.tokens[size_t(r)][k];
    starts[r] = int64_t(p.size());
  }
  test::TempDir dir;
  auto env = grpo::make_environment(
      {.name = "letters", .words = dir.write("w.txt", "crane\nslate\n")});
  grpo::Policy policy;
  policy.model = model.ptr();
  grpo::Learner learner(
      {}, policy, *env,
      std::make_shared<grpo::Prompter>(byte_tokenizer(), nullptr, 16), nullptr);
  torch::NoGradGuard no_grad;
  auto lp = learner.logps(*model, ids, starts, C);
  for (int64_t r = 0; r < R; ++r)
    for (size_t k = 0; k < g.logprobs[size_t(r)].size(); ++k)
      EXPECT_NEAR(lp[r][int64_t(k)].item<double>(), g.logprobs[size_t(r)][k], 1e-4)
          << "row " << r << " token " << k;
}

} // namespace
} // namespace orchard
