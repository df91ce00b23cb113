// The tiny recursive model's pieces against independent references: the
// stable-max loss and AdamATan2 against their formulas worked by hand, the
// paper's parameter counts, the halting rule, and the Sudoku generator
// against a brute-force solver written here.
#include "models/trm.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "data/puzzles.h"
#include "data/sudoku.h"
#include "models/trm_language_model.h"
#include "ops/stablemax.h"
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>

using namespace orchard;
namespace sd = orchard::data::sudoku;

namespace {

// A small TRM: width 32, 2 heads, 2 H-cycles of 2 L-cycles.
models::TrmConfig small_config(int64_t seq_len, int64_t vocab) {
  models::TrmConfig c;
  c.seq_len = seq_len;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.num_heads = 2;
  c.H_cycles = 2;
  c.L_cycles = 2;
  return c;
}

} // namespace

TEST(Trm, StablemaxCrossEntropyFollowsItsFormula) {
  auto logits = torch::tensor({{-2.0, 0.0, 3.0}}, torch::kFloat32);
  auto labels = torch::tensor({{2}}, torch::kLong).view({1});
  // s(-2) = 1/3, s(0) = 1, s(3) = 4.
  const double want = -std::log(4.0 / (1.0 / 3 + 1 + 4));
  auto l = ops::stablemax_cross_entropy(logits, labels);
  EXPECT_NEAR(l.item<double>(), want, 1e-12);
  auto ignored =
      ops::stablemax_cross_entropy(logits, torch::tensor({-100}, torch::kLong));
  EXPECT_EQ(ignored.item<double>(), 0.0);
}

TEST(Trm, AdamAtan2StepsByItsFormula) {
  auto p = torch::tensor({1.0, -2.0}, torch::kFloat64).set_requires_grad(true);
  train::OptimizerOptions o;
  o.adam_beta1 = 0.9;
  o.adam_beta2 = 0.95;
  train::Optimizers opt(
      {{.name = "w",
        .params = {{"w", p}},
        .lr = 0.1,
        .weight_decay = 0.5,
        .rule = "adam_atan2"}},
      o);
  const double g[2] = {0.3, -4.0};
  p.mutable_grad() = torch::tensor({g[0], g[1]}, torch::kFloat64);
  opt.step(1.0, 0);
  // Step 1: m_hat = g, v_hat = g^2: atan2(g, |g|) = +-pi/4.
  for (int i = 0; i < 2; ++i) {
    const double w0 = i == 0 ? 1.0 : -2.0;
    const double want =
        w0 * (1 - 0.1 * 0.5) - 0.1 * std::atan2(g[i], std::abs(g[i]));
    EXPECT_NEAR(p[i].item<double>(), want, 1e-12);
  }
}

TEST(Trm, TheParametersAreThePapersCounts) {
  models::TrmConfig c; // the paper's Sudoku shapes
  c.seq_len = 81;
  c.vocab_size = 11;
  c.puzzle_emb_ndim = 512;
  c.mlp_t = true;
  c.pos_encodings = "none";
  EXPECT_EQ(models::Trm(c)->network_parameters(), 5028866);
  c.mlp_t = false;
  c.pos_encodings = "rope";
  EXPECT_EQ(models::Trm(c)->network_parameters(), 6828034);
}

// Under bfloat16 autocast (CUDA's and MPS's default) the earlier H-cycles
// run without gradients and cast the weights first; autocast caches those
// casts, and a cast made without gradients, reused by the last cycle,
// would cut the network's weights off from the loss (PyTorch issue
// 112583; fixed only in recent releases). Every weight must get the
// gradient the float32 step gives, up to bfloat16's rounding. Autocast on
// the CPU stands in for the GPU's: the cache is the same code.
TEST(Trm, EveryWeightGetsItsGradientUnderAutocast) {
  models::TrmConfig c = small_config(6, 5);
  c.puzzle_emb_ndim = 0;
  for (bool mlp_t : {false, true}) {
    SCOPED_TRACE(mlp_t ? "mlp_t" : "attention");
    c.mlp_t = mlp_t;
    c.pos_encodings = mlp_t ? "none" : "rope";
    torch::manual_seed(3);
    models::Trm model(c);
    const auto inputs = torch::randint(0, 5, {4, 6});
    const auto ids = torch::zeros({4}, torch::kLong);
    auto gradients = [&](torch::ScalarType dtype) {
      model->zero_grad();
      {
        compat::AutocastGuard autocast(torch::kCPU, dtype);
        auto [z_H, z_L] = model->initial_carry(4);
        auto out = model->step(z_H, z_L, inputs, ids);
        EXPECT_EQ(out.logits.scalar_type(), dtype); // autocast is on
        out.logits.to(torch::kFloat32).square().mean().backward();
      }
      std::map<std::string, torch::Tensor> g;
      for (const auto& p : model->named_parameters())
        g[p.key()] = p.value().grad().defined() ? p.value().grad().clone()
                                                : torch::Tensor();
      return g;
    };
    const auto full = gradients(torch::kFloat32);
    const auto mixed = gradients(torch::kBFloat16);
    for (const auto& [name, want] : full) {
      if (name.rfind("q_head", 0) == 0)
        continue; // the logits do not use the Q-head
      ASSERT_TRUE(want.defined()) << name;
      ASSERT_TRUE(mixed.at(name).defined()) << name << ": no gradient";
      const auto cosine =
          torch::cosine_similarity(mixed.at(name).flatten(), want.flatten(), 0);
      // Seen: 0.975 and up (states in bfloat16); a weight cut off: 0 or none.
      EXPECT_GT(cosine.item<double>(), 0.9) << name;
    }
  }
}

namespace {

// A small model with the position mixer (T = 9 + 2, padded to 16 on the
// GPU), its puzzle embedding and Q-head made non-zero.
models::Trm small_mixer_model() {
  models::TrmConfig c;
  c.seq_len = 9;
  c.vocab_size = 5;
  c.num_puzzle_identifiers = 4;
  c.puzzle_emb_ndim = 24;
  c.puzzle_emb_len = 2;
  c.hidden_size = 16;
  c.L_layers = 2;
  c.H_cycles = 2;
  c.L_cycles = 2;
  c.mlp_t = true;
  c.pos_encodings = "none";
  torch::manual_seed(5);
  models::Trm model(c);
  torch::NoGradGuard no_grad;
  model->puzzle_emb.normal_();
  model->q_head->weight.normal_();
  return model;
}

// One step of `model` on fixed inputs: logits, q_halt, the carry, then
// every parameter's gradient of a fixed loss, all float64 on the CPU.
std::vector<torch::Tensor> step_results(models::Trm& model) {
  torch::manual_seed(6);
  const auto dev = model->H_init.device();
  const auto dt = model->H_init.scalar_type();
  const auto inputs = torch::randint(0, 5, {3, 9}, torch::kLong).to(dev);
  const auto ids = torch::tensor({0, 3, 1}, torch::kLong).to(dev);
  auto [h0, l0] = model->initial_carry(3);
  h0 = h0 + 0.1 * torch::randn(h0.sizes(), torch::kFloat64).to(dev, dt);
  model->zero_grad();
  const auto out = model->step(h0, l0, inputs, ids);
  const auto w = torch::arange(out.logits.numel(), torch::kFloat64)
                     .view_as(out.logits)
                     .sin()
                     .to(dev, out.logits.scalar_type());
  ((out.logits * w).sum() + out.q_halt.sum() * 0.3).backward();
  std::vector<torch::Tensor> r = {
      out.logits.detach(), out.q_halt.detach(), out.z_H, out.z_L};
  for (const auto& p : model->parameters())
    r.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  for (auto& t : r)
    t = t.to(torch::kCPU, torch::kFloat64);
  return r;
}

} // namespace

// The states with their positions padded to a multiple of 8 (what the GPU
// runs for Sudoku's 97) give the unpadded step: logits, halting logits,
// the carry and every gradient.
TEST(Trm, PaddedPositionsGiveTheSameStep) {
  auto model = small_mixer_model();
  model->to(torch::kFloat64);
  model->align_positions_everywhere = false;
  const auto plain = step_results(model);
  model->align_positions_everywhere = true;
  const auto padded = step_results(model);
  ASSERT_EQ(plain.size(), padded.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(plain[i].sizes(), padded[i].sizes()) << i;
    EXPECT_LT((plain[i] - padded[i]).abs().max().item<double>(), 1e-12) << i;
  }
  EXPECT_GT(plain[0].abs().max().item<double>(), 0.1);
  EXPECT_EQ(plain[2].size(1), 11);
  // The position-mixing weights got gradients (they would be all zero
  // where padding cut them off).
  EXPECT_GT(
      model->L_level[0]
          ->as<models::TrmBlock>()
          ->mlp_t->gate_up_proj->weight.grad()
          .abs()
          .max()
          .item<double>(),
      0.0);
}

// On the GPU (padded states, the fused kernels of ops/fused_train.h where
// built) a float32 step equals the CPU's plain float32 step: outputs and
// every gradient. Skipped without a CUDA device.
TEST(Trm, TheGpuStepEqualsTheCpuStep) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  auto model = small_mixer_model();
  const auto cpu = step_results(model);
  model->to(torch::Device(torch::kCUDA, 0));
  const auto gpu = step_results(model);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].sizes(), gpu[i].sizes()) << i;
    const double scale = cpu[i].abs().max().item<double>() + 1e-12;
    EXPECT_LT((cpu[i] - gpu[i]).abs().max().item<double>() / scale, 1e-4) << i;
  }
}

TEST(Trm, HaltingFollowsTheRule) {
  models::TrmConfig c;
  c.halt_max_steps = 4;
  c.halt_exploration_prob = 0.0;
  auto steps = torch::tensor({1, 2, 4, 1}, torch::kLong);
  auto qh = torch::tensor({1.0f, -1.0f, -1.0f, -0.5f});
  auto qc = torch::tensor({0.0f, -2.0f, 0.0f, -1.0f});
  auto train = models::halt_decision(c, steps, qh, qc, true);
  EXPECT_TRUE(torch::equal(train, torch::tensor({true, false, true, false})));
  auto eval = models::halt_decision(c, steps, qh, qc, false);
  EXPECT_TRUE(torch::equal(eval, torch::tensor({false, false, true, false})));
  c.no_ACT_continue = false; // q_halt > q_continue
  auto cont = models::halt_decision(c, steps, qh, qc, true);
  EXPECT_TRUE(torch::equal(cont, torch::tensor({true, true, true, true})));
  // Exploration's minimum holds a slot back until it has taken that many
  // steps, halt_max_steps excepted only by being reached.
  auto held = models::halt_decision(
      c, steps, qh, qc, true, torch::tensor({2, 2, 4, 0}, torch::kLong));
  EXPECT_TRUE(torch::equal(held, torch::tensor({false, true, true, true})));
}

TEST(Trm, ExplorationDrawsItsShareOfMinimumsFromTwoToTheLastStep) {
  models::TrmConfig c;
  c.halt_max_steps = 5;
  c.halt_exploration_prob = 0.25;
  torch::manual_seed(3);
  const auto m = models::exploration_minimum(c, 40000);
  const auto drawn = m.gt(0);
  EXPECT_NEAR(drawn.to(torch::kFloat64).mean().item<double>(), 0.25, 0.01);
  EXPECT_EQ(m.masked_select(drawn).min().item<int64_t>(), 2);
  EXPECT_EQ(m.max().item<int64_t>(), 5);
  // The same generator state draws the same minimums (every rank of a
  // data-parallel run draws them all and takes its own).
  torch::manual_seed(3);
  EXPECT_TRUE(torch::equal(models::exploration_minimum(c, 40000), m));
}

namespace {

// Every solution of a grid by trying each digit in each blank in order (no
// candidate masks, no cell choice): the test's own solver.
int64_t brute_force(
    const sd::Shape& s,
    sd::Grid& g,
    int64_t limit,
    sd::Grid* first) {
  const auto blank = std::find(g.begin(), g.end(), 0);
  if (blank == g.end()) {
    if (first && first->empty())
      *first = g;
    return 1;
  }
  int64_t found = 0;
  for (int d = 1; d <= s.n && found < limit; ++d) {
    *blank = int8_t(d);
    if (sd::rule_broken(s, g).empty())
      found += brute_force(s, g, limit - found, first);
  }
  *blank = 0;
  return found;
}

} // namespace

TEST(Trm, GeneratedPuzzlesHaveExactlyOneSolutionTheirLabel) {
  for (int n : {4, 6}) {
    const sd::Shape s = sd::shape_for_cells(n * n);
    std::mt19937_64 rng(static_cast<uint64_t>(n));
    sd::GenerateOptions o;
    o.shape = s;
    o.minimal = true;
    for (int i = 0; i < 20; ++i) {
      const sd::Puzzle p = sd::generate(o, rng);
      sd::Grid g = p.question, first;
      EXPECT_EQ(brute_force(s, g, 2, &first), 1) << sd::to_text(p.question);
      EXPECT_EQ(first, p.answer);
      // Minimal: every given is needed.
      for (size_t c = 0; c < g.size(); ++c)
        if (g[c]) {
          sd::Grid less = p.question;
          less[c] = 0;
          EXPECT_EQ(brute_force(s, less, 2, nullptr), 2);
        }
      // A symmetric copy is a valid puzzle with the mapped answer.
      const sd::Symmetry t = sd::random_symmetry(s, rng);
      sd::Grid q = sd::apply(s, t, p.question), a;
      EXPECT_EQ(brute_force(s, q, 2, &a), 1);
      EXPECT_EQ(a, sd::apply(s, t, p.answer));
      EXPECT_EQ(sd::canonical(s, q), sd::canonical(s, p.question));
    }
  }
}

// Random puzzles have random solutions: the generator once filled every
// grid with one digit order for the whole search, so every 9x9 puzzle had
// the same solution up to relabelling the digits, and a model could learn
// that one grid instead of Sudoku (held-out accuracy near 100 % in minutes).
TEST(Trm, GeneratedPuzzlesHaveDifferentSolutions) {
  for (int n : {4, 6, 9}) {
    const sd::Shape s = sd::shape_for_cells(n * n);
    std::mt19937_64 rng(static_cast<uint64_t>(n) + 11);
    sd::GenerateOptions o;
    o.shape = s;
    std::set<std::string> solutions;
    for (int i = 0; i < 30; ++i) {
      // The solution with its digits numbered by first appearance.
      const sd::Grid a = sd::generate(o, rng).answer;
      std::map<int, int> name;
      std::string key;
      for (int8_t d : a)
        key += char('0' + name.emplace(d, int(name.size()) + 1).first->second);
      solutions.insert(key);
    }
    // 4x4 Sudoku has 12 grids up to relabelling, 6x6 39,168, 9x9 ~1e16.
    EXPECT_GE(solutions.size(), n == 4 ? 6u : 29u) << n << "x" << n;
  }
}

TEST(Trm, BadPuzzleFilesNameTheLine) {
  const std::string path = ::testing::TempDir() + "/bad_sudoku.csv";
  {
    std::ofstream f(path);
    f << "source,question,answer,rating\n"
      << "x,1.3.,1234,0\n";
  }
  try {
    data::read_puzzles(path);
    FAIL() << "expected a refusal";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2:"), std::string::npos)
        << e.what();
  }
}

// A causal TRM (the chat variant) as generation sees it: every call starts
// from a fresh carry and runs every supervision step, so position t's
// distribution depends on tokens 0..t alone (changing later tokens, or
// cutting them off, changes nothing before them) and on nothing left from
// an earlier call. The same model without causal attention fails the
// first check, so the check can fail.
TEST(Trm, TheChatVariantSeesNoLaterTokenAndKeepsNoState) {
  models::TrmConfig c = small_config(12, 40);
  c.halt_max_steps = 3;
  c.puzzle_emb_ndim = 32;
  c.puzzle_emb_len = 2;
  c.causal = true;
  torch::manual_seed(3);
  models::TrmLanguageModel lm{models::Trm(c)};
  lm.eval();
  torch::NoGradGuard no_grad;
  const auto idx = torch::randint(1, 40, {2, 10}, torch::kLong);
  auto changed = idx.clone();
  changed.narrow(1, 6, 4).fill_(7);
  const auto a = lm.forward(idx), b = lm.forward(changed);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{2, 10, 40}));
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 6), b.narrow(1, 0, 6)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 6, 4), b.narrow(1, 6, 4)));
  EXPECT_TRUE(
      torch::allclose(lm.forward(idx.narrow(1, 0, 6)), a.narrow(1, 0, 6)));
  EXPECT_TRUE(torch::equal(lm.forward(idx), a)); // nothing kept between calls
  // Its outputs are stable-max log-probabilities: they sum to 1.
  EXPECT_TRUE(
      torch::allclose(a.exp().sum(-1), torch::ones({2, 10}), 1e-4, 1e-4));

  // The same weights attending to every position: later tokens leak.
  for (const auto& m : lm.trm->L_level->children())
    m->as<models::TrmBlockImpl>()->self_attn->causal = false;
  EXPECT_FALSE(torch::allclose(
      lm.forward(idx).narrow(1, 0, 6), lm.forward(changed).narrow(1, 0, 6)));
}
