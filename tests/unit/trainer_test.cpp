// The shared Trainer on a small regression problem: accumulation equals
// one big batch, float16 loss scaling unscales exactly and skips an
// overflowing step, a diverging run stops with a message, and the
// optimizer, schedule and EMA are applied as configured.
#include "train/trainer.h"
#include "core/error.h"
#include "models/gpt.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <limits>
#include <sstream>

namespace orchard::train {
namespace {

struct Regression {
  torch::nn::Linear model{nullptr};
  torch::Tensor x, y;
  int64_t cursor = 0;                       // rows served so far
  int64_t rows = 8;                         // per micro-step
  int64_t poison_at = -1, poison_count = 0; // micro-steps returning inf
  int64_t calls = 0;
  Regression() {
    torch::manual_seed(7);
    model = torch::nn::Linear(4, 1);
    x = torch::randn({64, 4});
    y = torch::matmul(x, torch::tensor({{1.0f}, {-2.0f}, {0.5f}, {3.0f}})) +
        0.1;
  }
  TrainingTask task() {
    TrainingTask t;
    t.model = model.ptr();
    t.micro_step = [this] {
      auto xb = x.narrow(0, cursor % 64, rows),
           yb = y.narrow(0, cursor % 64, rows);
      cursor += rows;
      auto loss = torch::mse_loss(model(xb), yb);
      int64_t call = calls++;
      if (poison_at >= 0 && call >= poison_at &&
          call < poison_at + poison_count)
        loss = loss * std::numeric_limits<float>::infinity();
      return loss;
    };
    t.evaluate = [this] {
      torch::NoGradGuard ng;
      double l = torch::mse_loss(model(x), y).item<double>();
      return EvalResult{l, {}, "val loss"};
    };
    t.data_state = [this] { return nlohmann::json{{"cursor", cursor}}; };
    t.restore_data = [this](const nlohmann::json& j) {
      cursor = j.at("cursor").get<int64_t>();
    };
    return t;
  }
};

TrainerOptions options(const test::TempDir& dir, const std::string& name) {
  TrainerOptions o;
  o.run_dir = dir.file(name);
  std::filesystem::create_directories(o.run_dir);
  o.total_steps = 6;
  o.grad_clip = 0;
  o.warmdown_ratio = 0;
  o.save_total_limit = 0;
  return o;
}

std::vector<ParamGroup> sgd_like(Regression& r, double lr) {
  NamedTensors p;
  for (auto& n : r.model->named_parameters())
    p.push_back({n.key(), n.value()});
  return {{"all", p, lr, 0.0, false}};
}

TrainerResult train(Regression& r, const TrainerOptions& o) {
  Optimizers opt(sgd_like(r, 0.05));
  RunLog log(o.run_dir + "/train.log");
  Trainer t(o, r.task(), opt, log);
  return t.run();
}

TEST(Trainer, AccumulatingHalfBatchesEqualsOneBatch) {
  test::TempDir dir;
  Regression a, b;
  auto oa = options(dir, "a");
  a.rows = 16;
  train(a, oa);
  auto ob = options(dir, "b");
  ob.grad_accum = 2;
  b.rows = 8;
  train(b, ob);
  EXPECT_TRUE(torch::allclose(a.model->weight, b.model->weight, 1e-5, 1e-6))
      << a.model->weight << b.model->weight;
  EXPECT_NE(a.model->weight.sum().item<double>(), 0);
}

// grad_clip scales every gradient by clip / (norm + 1e-6) when the norm of
// all of them passes it, as torch.nn.utils.clip_grad_norm_, and the step's
// logged norm is the one before clipping. AdamW with an epsilon far above
// the gradients is a plain gradient step (update = lr g / (|g| + eps)), so
// the clipped gradient shows in the weights: checked against the gradient
// autograd gives here and that formula by hand.
TEST(Trainer, ClipsTheGradientsByTheirJointNorm) {
  test::TempDir dir;
  Regression r;
  const double lr = 5e4, eps = 1e6, clip = 0.1;
  // The first micro-step's gradient, by hand.
  const auto w0 = r.model->weight.detach().clone();
  const auto b0 = r.model->bias.detach().clone();
  torch::mse_loss(r.model(r.x.narrow(0, 0, 8)), r.y.narrow(0, 0, 8)).backward();
  const auto gw = r.model->weight.grad().clone();
  const auto gb = r.model->bias.grad().clone();
  r.model->zero_grad();
  const double norm = std::sqrt(
      gw.square().sum().item<double>() + gb.square().sum().item<double>());
  ASSERT_GT(norm, 10 * clip); // clipping changes this step
  const double f = clip / (norm + 1e-6);
  auto expect = [&](const torch::Tensor& p, const torch::Tensor& g) {
    const auto c = g * f;
    return p - lr * c / (c.abs() + eps);
  };

  auto o = options(dir, "clip");
  o.total_steps = 1;
  o.warmdown_ratio = 0;
  o.grad_clip = clip;
  OptimizerOptions oo;
  oo.adam_eps = eps;
  Optimizers opt(sgd_like(r, lr), oo);
  RunLog log(o.run_dir + "/train.log");
  Trainer t(o, r.task(), opt, log);
  t.run();
  EXPECT_TRUE(torch::allclose(r.model->weight, expect(w0, gw), 1e-5, 1e-7))
      << r.model->weight << expect(w0, gw) << w0;
  EXPECT_TRUE(torch::allclose(r.model->bias, expect(b0, gb), 1e-5, 1e-7));
  // Unclipped it would have moved 1 / f times as far.
  EXPECT_GT(
      (expect(w0, gw / f) - r.model->weight).abs().max().item<double>(), 1e-3);
  const std::string metrics = test::read_text(o.run_dir + "/metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_NEAR(
      nlohmann::json::parse(metrics.substr(0, metrics.find('\n')))
          .at("grad_norm")
          .get<double>(),
      norm,
      1e-5 * norm);
}

TEST(Trainer, LossScalingUnscalesExactly) {
  test::TempDir dir;
  Regression plain, scaled;
  train(plain, options(dir, "plain"));
  auto o = options(dir, "scaled");
  o.precision.loss_scaling = true; // float32 compute: only the scaler acts
  train(scaled, o);
  // Scaling by 2^16 and back is exact in binary floating point.
  EXPECT_TRUE(torch::equal(plain.model->weight, scaled.model->weight));
}

TEST(Trainer, AnOverflowingFloat16StepIsSkippedAndTheScaleHalved) {
  test::TempDir dir;
  Regression r;
  r.poison_at = 2; // the third step's gradient is infinite
  r.poison_count = 1;
  auto o = options(dir, "f16");
  o.precision.loss_scaling = true;
  o.total_steps = 3;
  auto result = train(r, o);
  EXPECT_EQ(result.skipped_steps, 1);
  // Steps 1 and 2 applied; step 3 skipped: the weights equal a 2-step run.
  test::TempDir dir2;
  Regression two;
  auto o2 = options(dir2, "two");
  o2.total_steps = 2;
  // Same learning-rate schedule for the first two steps: constant (no
  // warmdown), so a 2-step run takes the same two updates.
  train(two, o2);
  EXPECT_TRUE(torch::equal(r.model->weight, two.model->weight));
  std::string metrics = test::read_text(o.run_dir + "/metrics.jsonl");
  EXPECT_NE(metrics.find("\"loss_scale\":32768"), std::string::npos) << metrics;
}

TEST(Trainer, NonFiniteGradientsSkipThenStopAsDiverged) {
  test::TempDir dir;
  Regression once;
  once.poison_at = 1;
  once.poison_count = 1;
  EXPECT_EQ(train(once, options(dir, "once")).skipped_steps, 1);
  Regression always;
  always.poison_at = 0;
  always.poison_count = 1000;
  try {
    train(always, options(dir, "always"));
    FAIL() << "a diverged run kept going";
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("training diverged"), std::string::npos)
        << e.what();
  }
}

// A gradient that stays NaN/Inf stops the run as diverged in every
// precision: float32, bfloat16 autocast, and float16's loss scaling (where
// single overflows are skipped, but not a scale driven below 1).
TEST(Trainer, NonFiniteGradientsStopTheRunInEveryPrecision) {
  struct Case {
    const char* name;
    torch::ScalarType compute;
    bool loss_scaling;
  };
  for (const Case& c :
       {Case{"float32", torch::kFloat32, false},
        Case{"bfloat16", torch::kBFloat16, false},
        Case{"float16-scaled", torch::kFloat32, true}}) {
    test::TempDir dir;
    Regression r;
    r.poison_at = 0;
    r.poison_count = 1000;
    auto o = options(dir, c.name);
    o.total_steps = 40; // room for the scale to fall from 2^16 below 1
    o.precision.compute = c.compute;
    o.precision.loss_scaling = c.loss_scaling;
    try {
      train(r, o);
      ADD_FAILURE() << c.name << ": a diverged run kept going";
    } catch (const UserError& e) {
      EXPECT_NE(
          std::string(e.what()).find("training diverged"), std::string::npos)
          << c.name << ": " << e.what();
    }
  }
}

TEST(Trainer, ResumesFromItsCheckpointAndSkipsAFinishedRun) {
  test::TempDir dir;
  Regression full, part;
  auto of = options(dir, "full");
  of.ema = true;
  of.ema_rate = 0.9;
  train(full, of);
  auto op = options(dir, "part");
  op.ema = true;
  op.ema_rate = 0.9;
  op.total_steps = 6;
  op.save_every = 2;
  {
    // Stop after 4 steps by asking for a shorter run of the same schedule
    // is not the same schedule, so train 6 with saves and reload from the
    // step-4 checkpoint in a fresh process-like state instead.
    train(part, op);
  }
  Regression again;
  auto oa = op;
  oa.resume = op.run_dir + "/checkpoints/step_000004";
  oa.run_dir = dir.file("again");
  std::filesystem::create_directories(oa.run_dir);
  auto r = train(again, oa);
  EXPECT_FALSE(r.already_done);
  EXPECT_EQ(r.step, 6);
  EXPECT_TRUE(torch::equal(again.model->weight, full.model->weight));
  // The final checkpoint holds the EMA too.
  auto ck = runs::load_checkpoint(oa.run_dir + "/checkpoints/step_000006");
  EXPECT_TRUE(ck.model.count("ema.weight"));
  Regression done;
  auto od = oa;
  od.resume = "auto";
  EXPECT_TRUE(train(done, od).already_done);
}

} // namespace
} // namespace orchard::train

namespace orchard::train {
namespace {

// The micro-step and the evaluation run under the run's autocast; the
// optimizer sees float32 master weights.
TEST(Trainer, MicroStepAndEvaluationRunUnderAutocast) {
  test::TempDir dir;
  Regression r;
  auto task = r.task();
  std::vector<torch::ScalarType> seen_train, seen_eval;
  auto inner_step = task.micro_step;
  task.micro_step = [&] {
    seen_train.push_back(r.model(r.x).scalar_type());
    return inner_step();
  };
  auto inner_eval = task.evaluate;
  task.evaluate = [&] {
    seen_eval.push_back(r.model(r.x).scalar_type());
    return inner_eval();
  };
  auto o = options(dir, "bf16");
  o.precision.compute = torch::kBFloat16;
  o.total_steps = 2;
  o.grad_accum = 2;
  Optimizers opt(sgd_like(r, 0.05));
  RunLog log(o.run_dir + "/train.log");
  Trainer(o, task, opt, log).run();
  ASSERT_EQ(seen_train.size(), 4u);
  for (auto t : seen_train)
    EXPECT_EQ(t, torch::kBFloat16);
  ASSERT_EQ(seen_eval.size(), 1u);
  EXPECT_EQ(seen_eval[0], torch::kBFloat16);
  EXPECT_EQ(r.model->weight.scalar_type(), torch::kFloat32);
  EXPECT_EQ(r.model(r.x).scalar_type(), torch::kFloat32); // guard ended
}

} // namespace
} // namespace orchard::train

namespace orchard::train {
namespace {

// An injected allocation failure whenever a micro-step gets more than
// `limit` rows: the Trainer halves the micro-batch, doubles accumulation,
// redoes the step from its first micro-batch, and ends with the weights of
// a run that used the small micro-batch from the start.
TEST(Trainer, OutOfMemoryHalvesTheMicroBatchAndRedoesTheStep) {
  test::TempDir dir;
  auto run = [&](const std::string& name,
                 int64_t rows,
                 int64_t limit,
                 Regression& r,
                 std::string resume = "auto") {
    r.rows = rows;
    auto task = r.task();
    auto inner = task.micro_step;
    task.micro_step = [&r, inner, limit] {
      TORCH_CHECK_WITH(
          OutOfMemoryError,
          r.rows <= limit,
          "CUDA out of memory. Tried to allocate 2.00 GiB (injected)");
      return inner();
    };
    task.set_micro_batch = [&r](int64_t b) { r.rows = b; };
    auto o = options(dir, name);
    o.micro_batch = rows;
    o.grad_accum = 16 / rows;
    o.save_every = 2;
    o.resume = resume;
    Optimizers opt(sgd_like(r, 0.05));
    RunLog log(o.run_dir + "/train.log");
    return Trainer(o, task, opt, log).run();
  };
  Regression small, big;
  run("small", 4, 100, small);
  auto res = run("big", 16, 4, big);
  EXPECT_EQ(res.micro_batch, 4);
  EXPECT_TRUE(
      torch::allclose(big.model->weight, small.model->weight, 1e-6, 1e-7))
      << big.model->weight << small.model->weight;
  std::string log = test::read_text(dir.file("big/train.log"));
  EXPECT_NE(
      log.find("Out of memory at step 1 with device_batch_size=16: "
               "halved to 8"),
      std::string::npos)
      << log;
  EXPECT_NE(
      log.find("halved to 4, gradient accumulation now 4"), std::string::npos)
      << log;
  // A resume of that run (from step 4) continues with 4 rows, not 16.
  Regression again;
  auto r2 = run("again", 16, 4, again, dir.file("big/checkpoints/step_000004"));
  EXPECT_EQ(r2.micro_batch, 4);
  EXPECT_TRUE(
      torch::allclose(again.model->weight, small.model->weight, 1e-6, 1e-7));
  std::string log2 = test::read_text(dir.file("again/train.log"));
  EXPECT_NE(log2.find("Continuing with device_batch_size=4"), std::string::npos)
      << log2;
  EXPECT_EQ(log2.find("Out of memory"), std::string::npos) << log2;
  // At one row there is nothing left to halve: a message, not a crash.
  Regression tiny;
  try {
    run("tiny", 1, 0, tiny);
    FAIL() << "out of memory at batch 1 did not stop the run";
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cannot be halved further"), std::string::npos) << m;
    EXPECT_NE(m.find("gradient_checkpointing=true"), std::string::npos) << m;
  }
}

} // namespace
} // namespace orchard::train

namespace orchard::train {
namespace {

// An odd micro-batch cannot be halved: it drops to its largest proper
// divisor (3 -> 1) and the run still equals one made at that size.
TEST(Trainer, OutOfMemoryAtAnOddMicroBatchLowersToADivisor) {
  test::TempDir dir;
  auto run = [&](const std::string& name,
                 int64_t rows,
                 int64_t limit,
                 Regression& r) {
    r.rows = rows;
    auto task = r.task();
    auto inner = task.micro_step;
    task.micro_step = [&r, inner, limit] {
      TORCH_CHECK_WITH(
          OutOfMemoryError, r.rows <= limit, "CUDA out of memory (injected)");
      return inner();
    };
    task.set_micro_batch = [&r](int64_t b) { r.rows = b; };
    auto o = options(dir, name);
    o.total_steps = 2;
    o.micro_batch = rows;
    o.grad_accum = 12 / rows;
    Optimizers opt(sgd_like(r, 0.05));
    RunLog log(o.run_dir + "/train.log");
    return Trainer(o, task, opt, log).run();
  };
  Regression odd, one;
  EXPECT_EQ(run("odd", 3, 1, odd).micro_batch, 1);
  run("one", 1, 100, one);
  EXPECT_TRUE(
      torch::allclose(odd.model->weight, one.model->weight, 1e-6, 1e-7));
  std::string log = test::read_text(dir.file("odd/train.log"));
  EXPECT_NE(
      log.find(
          "device_batch_size=3: lowered to 1, gradient accumulation now 12"),
      std::string::npos)
      << log;
}

} // namespace
} // namespace orchard::train

namespace orchard::train {
namespace {

torch::TensorOptions cuda_float() {
  return torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA, 0);
}

// A small GPT on the GPU with bfloat16 autocast, AdamW (fused), clipping
// and two micro-steps a step, trained from the same weights and batches
// three ways: eagerly, with the step's forward and backward captured as a
// CUDA graph (warm-up at step 1, capture at 2, replays after), and with
// the plain multi-tensor AdamW, whose clipping and finite check the host
// decides. Both fused runs clip and skip on the device
// (Optimizers::step_on_device). Step 3's first batch makes the loss
// infinite (a token the loss looks for on the device, so a replayed graph
// sees it too): every run skips that step. The batches are shorter from
// step 5: that step cannot replay the graph and runs eagerly, and step 6
// warms up a new one. The graph's weights must be the eager run's; the
// host-decided run's equal to rounding.
TEST(Trainer, CudaGraphStepsEqualEagerSteps) {
  if (!torch::cuda::is_available() || !StepGraph::built())
    GTEST_SKIP() << "SKIPPED: needs CUDA and a libtorch 2.x CUDA build";
  const torch::Device cuda(torch::kCUDA, 0);
  models::GptConfig c;
  c.vocab_size = 384;
  c.n_layer = 2;
  c.n_embd = 256;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.max_seq_len = 32;
  const int64_t poison = c.vocab_size - 1;
  torch::manual_seed(3);
  auto data = torch::randint(0, c.vocab_size - 1, {64, 33});
  data[16][0] = poison; // step 3's first micro-batch starts at row 16
  struct Run {
    std::vector<torch::Tensor> weights;
    std::string metrics, log;
    TrainerResult result;
  };
  auto run = [&](const test::TempDir& dir,
                 const char* name,
                 bool graphs,
                 bool fused,
                 torch::ScalarType compute = torch::kBFloat16) {
    torch::manual_seed(11);
    models::Gpt model(c);
    model->to(cuda);
    int64_t served = 0;
    TrainingTask task;
    task.model = model.ptr();
    task.next_inputs = [&] {
      const int64_t T = served < 8 * 4 ? 32 : 24; // steps 5 and 6: shorter
      auto rows = data.narrow(0, served % 64, 4);
      served += 4;
      return std::vector<torch::Tensor>{
          rows.narrow(1, 0, T).to(cuda), rows.narrow(1, 1, T).to(cuda)};
    };
    task.loss_of = [model, poison](const std::vector<torch::Tensor>& in) mutable {
      auto inf = torch::where(
          in[0][0][0] == poison,
          torch::full({}, std::numeric_limits<float>::infinity(), cuda_float()),
          torch::ones({}, cuda_float()));
      return model->loss(in[0], in[1]) * inf;
    };
    task.micro_step = [&] { return task.loss_of(task.next_inputs()); };
    task.evaluate = [] { return EvalResult{0.0, {}, "none"}; };
    TrainerOptions o;
    o.run_dir = dir.file(name);
    std::filesystem::create_directories(o.run_dir);
    o.device = cuda;
    o.precision.compute = compute;
    o.total_steps = 6;
    o.micro_batch = 4;
    o.grad_accum = 2;
    o.grad_clip = 0.5;
    o.warmdown_ratio = 0.5;
    o.save_every = 0;
    o.save_total_limit = 0;
    o.cuda_graphs = graphs;
    NamedTensors p;
    for (auto& n : model->named_parameters())
      p.push_back({n.key(), n.value()});
    OptimizerOptions oo;
    oo.fused_adamw = fused;
    Optimizers opt({{"all", p, 3e-3, 0.01, false}}, oo);
    RunLog log(o.run_dir + "/train.log");
    Run r;
    r.result = Trainer(o, task, opt, log).run();
    for (auto& t : model->parameters())
      r.weights.push_back(t.detach().cpu());
    r.metrics = test::read_text(o.run_dir + "/metrics.jsonl");
    r.log = test::read_text(o.run_dir + "/train.log");
    return r;
  };
  test::TempDir dir;
  const Run eager = run(dir, "eager", false, true);
  const Run graphed = run(dir, "graphs", true, true);
  // The host-decided update against the device-decided one in float32:
  // in bfloat16 a rounding apart grows with each step, as Adam turns tiny
  // gradients into whole steps.
  const Run eager32 = run(dir, "eager32", false, true, torch::kFloat32);
  const Run host = run(dir, "host", false, false, torch::kFloat32);
  EXPECT_NE(graphed.log.find("CUDA graph: the step's forward and backward "
                             "(2 micro-steps of 4 rows) captured"),
            std::string::npos)
      << graphed.log;
  EXPECT_EQ(graphed.log.find("could not be captured"), std::string::npos)
      << graphed.log;
  EXPECT_EQ(eager.log.find("CUDA graph"), std::string::npos);
  for (const Run* r : {&eager, &graphed, &eager32, &host})
    EXPECT_EQ(r->result.skipped_steps, 1);
  ASSERT_EQ(eager.weights.size(), graphed.weights.size());
  torch::manual_seed(11);
  models::Gpt init(c);
  const auto start = init->parameters();
  double moved = 0, off = 0;
  for (size_t i = 0; i < eager.weights.size(); ++i) {
    const double diff =
        (eager.weights[i] - graphed.weights[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << "parameter " << i;
    moved +=
        (eager32.weights[i] - start[i].detach()).square().sum().item<double>();
    off += (eager32.weights[i] - host.weights[i]).square().sum().item<double>();
  }
  // The weights moved, and the host-decided update is the same update.
  EXPECT_GT(std::sqrt(moved), 1e-2);
  EXPECT_LT(std::sqrt(off), 1e-3 * std::sqrt(moved));
  // The logged losses and gradient norms step by step; step 3's loss is
  // not finite (JSON null) in all three.
  auto column = [](const std::string& metrics, const char* key) {
    std::vector<double> v;
    std::istringstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("tokens_per_s"))
        v.push_back(
            j.at(key).is_number() ? j.at(key).get<double>()
                                  : std::numeric_limits<double>::infinity());
    }
    return v;
  };
  for (const char* key : {"loss", "grad_norm"}) {
    auto a = column(eager.metrics, key), b = column(graphed.metrics, key),
         a32 = column(eager32.metrics, key), h = column(host.metrics, key);
    ASSERT_EQ(a.size(), 6u) << key;
    ASSERT_EQ(b.size(), 6u) << key;
    ASSERT_EQ(h.size(), 6u) << key;
    ASSERT_EQ(a32.size(), 6u) << key;
    EXPECT_FALSE(std::isfinite(a[2])) << key;
    for (size_t s = 0; s < a.size(); ++s) {
      if (s == 2)
        continue;
      EXPECT_NEAR(a[s], b[s], 1e-6 * std::abs(a[s]) + 1e-7)
          << key << " at step " << s + 1;
      EXPECT_NEAR(a32[s], h[s], 1e-3 * std::abs(a32[s]))
          << key << " at step " << s + 1;
    }
    // Clipping acted: some finite step's norm was above 0.5.
    if (std::string(key) == "grad_norm") {
      a[2] = 0;
      EXPECT_GT(*std::max_element(a.begin(), a.end()), 0.5);
    }
  }
}

} // namespace
} // namespace orchard::train
