// The memory planner: the weights term against the real model's parameter
// count, choices on simulated 16-128 GB Macs (monotone, within budget),
// checkpointing when nothing fits without it, and the no-fit message.
#include "train/memory_plan.h"
#include "core/device.h"
#include "models/hf/config.h"
#include "test_util.h"
#include "train/finetune.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace orchard::train {
namespace {

models::GptConfig gpt(int64_t depth, int64_t vocab = 8192) {
  models::GptConfig c;
  c.n_layer = depth;
  c.n_embd = 64 * depth;
  c.n_head = c.n_kv_head = std::max<int64_t>(1, (64 * depth + 127) / 128);
  c.vocab_size = vocab;
  c.max_seq_len = 8;
  return c;
}

TEST(MemoryPlan, ParameterCountsMatchTheRealModel) {
  for (int64_t d : {1, 4, 6}) {
    auto c = gpt(d);
    models::Gpt model(c);
    PlanModel pm = plan_model_of(c);
    EXPECT_EQ(pm.params, model->num_parameters()) << d;
    int64_t matrices = 0;
    for (const auto& p : model->named_parameters())
      if (p.key().rfind("blocks.", 0) == 0)
        matrices += p.value().numel();
    EXPECT_EQ(pm.matrix_params, matrices) << d;
    PlanSettings s;
    s.muon = false;
    auto e = estimate_memory(pm, s, 1, 2);
    EXPECT_EQ(e.weights, 4.0 * double(model->num_parameters()));
    EXPECT_EQ(e.optimizer, 8.0 * double(model->num_parameters())); // AdamW
    // Several processes: the gradient averager's buckets beside .grad (on
    // two H200s a d12 peaked 0.6 GiB higher on each of two ranks).
    s.processes = 2;
    EXPECT_EQ(
        estimate_memory(pm, s, 1, 2).gradients,
        e.gradients + 4.0 * double(model->num_parameters()));
    // ... and again in bfloat16 where they are sent in it.
    s.reduce_in_bfloat16 = true;
    EXPECT_EQ(
        estimate_memory(pm, s, 1, 2).gradients,
        e.gradients + 6.0 * double(model->num_parameters()));
    s.reduce_in_bfloat16 = false;
    // ... and the copy engines' scratch where they average them: the
    // other rank's half of the largest bucket (of at most 100 MB).
    s.copy_engine_bucket = double(100 << 20);
    const double grads = 4.0 * double(model->num_parameters());
    EXPECT_EQ(
        estimate_memory(pm, s, 1, 2).gradients,
        e.gradients + grads + std::min(grads, double(100 << 20)) / 2);
    s.copy_engine_bucket = 0;
    // zero_stage=1: each of the two ranks keeps half the moments, but
    // all of the embedding's (every rank steps it whole).
    s.shard_optimizer = true;
    const double embedding = double(pm.vocab_size) * double(pm.n_embd);
    EXPECT_EQ(
        estimate_memory(pm, s, 1, 2).optimizer,
        4.0 * double(model->num_parameters()) + 4.0 * embedding);
  }
}

TEST(MemoryPlan, ChoicesOnSimulatedMacsAreMonotoneAndFit) {
  // The overnight model (d6, 512 tokens, 16384 per step) on Macs.
  PlanModel pm = plan_model_of(gpt(6, 65536));
  PlanSettings s;
  s.seq_len = 512;
  s.device = c10::DeviceType::MPS;
  int64_t previous = 0;
  for (int gb : {16, 32, 64, 128}) {
    DeviceInfo d = resolve_device("auto", simulated_machine("mps", gb));
    MemoryBudget b = memory_budget(d);
    EXPECT_NEAR(
        double(b.bytes), double(gb) * kGiB * 0.65 * 0.8, 2.0); // two roundings
    BatchPlan plan = plan_batch(pm, s, 16384, b);
    ASSERT_TRUE(plan.choice) << gb << " GB: " << plan.why;
    EXPECT_LE(plan.choice->estimate.total(), double(b.bytes)) << gb;
    EXPECT_GE(plan.choice->batch, previous) << gb << " GB";
    EXPECT_EQ(plan.choice->batch * plan.choice->accum * 512, 16384);
    // The next size up (if any) does not fit: the choice is the largest.
    for (const auto& c : plan.candidates)
      if (!c.checkpointing && c.batch > plan.choice->batch)
        EXPECT_FALSE(c.fits) << gb << " GB, batch " << c.batch;
    previous = plan.choice->batch;
  }
  EXPECT_GT(previous, 1); // 128 GB takes more than one sequence at a time
}

// The same tokens in longer sequences cost more activations where the
// attention keeps its scores for the backward (a term per key): on MPS
// (PyTorch's math SDPA) and the CPU (fitted on explicit attention) on
// every libtorch; not on CUDA, whose fit (libtorch 2.11, fused attention)
// has no such term.
TEST(MemoryPlan, MpsAndCpuPlansCountTheAttentionScores) {
  const PlanModel pm = plan_model_of(gpt(12, 50304));
  for (auto device :
       {c10::DeviceType::CPU, c10::DeviceType::MPS, c10::DeviceType::CUDA}) {
    PlanSettings s;
    s.device = device;
    s.no_attention_scores = attention_keeps_no_scores(device);
    s.seq_len = 1024;
    const double short_rows = estimate_memory(pm, s, 2, 1).activations;
    s.seq_len = 2048;
    const double long_rows = estimate_memory(pm, s, 1, 1).activations;
    if (device != c10::DeviceType::CUDA)
      EXPECT_GT(long_rows, short_rows * 1.2) << c10::DeviceTypeName(device);
    else
      EXPECT_DOUBLE_EQ(long_rows, short_rows) << c10::DeviceTypeName(device);
  }
}

TEST(MemoryPlan, CheckpointingCutsActivationsAndIsChosenWhenNeeded) {
  PlanModel pm = plan_model_of(gpt(12, 50304));
  PlanSettings s;
  s.seq_len = 1024;
  s.device = c10::DeviceType::CUDA;
  s.no_attention_scores = true;
  s.compute = c10::ScalarType::BFloat16;
  auto plain = estimate_memory(pm, s, 8, 2);
  s.gradient_checkpointing = true;
  auto ckpt = estimate_memory(pm, s, 8, 2);
  EXPECT_LT(ckpt.activations, plain.activations / 4);
  EXPECT_EQ(ckpt.weights, plain.weights);
  s.gradient_checkpointing = false;
  // A budget between batch 1 with and without checkpointing.
  MemoryBudget b;
  auto one_plain = estimate_memory(pm, s, 1, 16).total();
  s.gradient_checkpointing = true;
  auto one_ckpt = estimate_memory(pm, s, 1, 16).total();
  s.gradient_checkpointing = false;
  b.bytes = uint64_t((one_plain + one_ckpt) / 2);
  BatchPlan plan = plan_batch(pm, s, 16384, b);
  ASSERT_TRUE(plan.choice) << plan.why;
  EXPECT_TRUE(plan.choice->checkpointing);
  EXPECT_NE(plan.why.find("checkpointing"), std::string::npos) << plan.why;
  // Forced off: nothing fits, and the message says what would help.
  BatchPlan off = plan_batch(pm, s, 16384, b, false);
  EXPECT_FALSE(off.choice);
  EXPECT_NE(off.why.find("Shorten max_seq_len"), std::string::npos) << off.why;
  auto j = plan_json(off, 1024);
  EXPECT_TRUE(j["choice"].is_null());
  EXPECT_EQ(j["candidates"].size(), off.candidates.size());
}

TEST(MemoryPlan, BudgetPerDevice) {
  DeviceInfo cuda = resolve_device("auto", simulated_machine("cuda", 24));
  EXPECT_EQ(memory_budget(cuda).usable, cuda.free_memory);
  EXPECT_NE(memory_budget(cuda).why.find("free GPU memory"), std::string::npos);
  DeviceInfo cpu = resolve_device("auto", simulated_machine("cpu", 8));
  EXPECT_EQ(memory_budget(cpu, 0.5).bytes, cpu.free_memory / 2);
}

// Fine-tuning with several processes: each rank plans the gradient
// averager's buckets beside its gradients and, with zero_stage=1, its share
// of AdamW's moments (full fine-tuning of the fixture Llama, float32).
TEST(MemoryPlan, FineTuningPlansEachProcessWithItsShareOfTheState) {
  const auto mc =
      models::read_hf_config(std::string(ORCHARD_FIXTURES) + "/hf/llama");
  FinetuneConfig cfg;
  cfg.stage = "full";
  const auto one =
      finetune_memory(mc, cfg, torch::kFloat32, 2, c10::DeviceType::CUDA, 1);
  EXPECT_EQ(one.optimizer, 2 * one.weights); // two float32 moments a weight
  // The buckets, and the copy engines' scratch: the other rank's half of
  // the one bucket the fixture's gradients fill.
  const auto two =
      finetune_memory(mc, cfg, torch::kFloat32, 2, c10::DeviceType::CUDA, 2);
  EXPECT_EQ(two.gradients, 2.5 * one.gradients);
  cfg.grad_average = "nccl";
  EXPECT_EQ(
      finetune_memory(mc, cfg, torch::kFloat32, 2, c10::DeviceType::CUDA, 2)
          .gradients,
      2 * one.gradients);
  cfg.grad_average = "auto";
  // What rules the copy engines out, and their scratch with more processes:
  // the largest bucket's share from each of the three others.
  EXPECT_TRUE(copy_engines_may_average(true, "float32", "auto"));
  EXPECT_FALSE(copy_engines_may_average(false, "float32", "auto"));
  EXPECT_FALSE(copy_engines_may_average(true, "bfloat16", "auto"));
  EXPECT_FALSE(copy_engines_may_average(true, "float32", "nccl"));
  EXPECT_EQ(copy_engine_scratch(400.0, 100.0, 4), 75.0);
  EXPECT_EQ(copy_engine_scratch(40.0, 100.0, 4), 30.0);
  EXPECT_EQ(copy_engine_scratch(40.0, 100.0, 1), 0.0);
  EXPECT_EQ(two.optimizer, one.optimizer);
  cfg.zero_stage = 1;
  const auto sharded =
      finetune_memory(mc, cfg, torch::kFloat32, 2, c10::DeviceType::CUDA, 2);
  EXPECT_EQ(sharded.optimizer, one.optimizer / 2);
  // Sharded, the copy engines reduce-scatter: the same scratch.
  EXPECT_EQ(sharded.gradients, 2.5 * one.gradients);
  EXPECT_EQ(sharded.activations, one.activations);
  // Float32 gradients sent in bfloat16: the buckets again at half size.
  cfg.grad_reduce_dtype = "bfloat16";
  const auto low =
      finetune_memory(mc, cfg, torch::kFloat32, 2, c10::DeviceType::CUDA, 2);
  EXPECT_EQ(low.gradients, 2.5 * one.gradients);
}

// LoRA of the fixture Llama: on MPS and the CPU each layer keeps two
// float32 values a score for the backward (H x T keys a token), one layer's
// under checkpointing; on CUDA (fused attention, libtorch 2.x) none.
TEST(MemoryPlan, FineTuningCountsTheScoresWhereTheAttentionKeepsThem) {
  const auto mc =
      models::read_hf_config(std::string(ORCHARD_FIXTURES) + "/hf/llama");
  FinetuneConfig cfg;
  cfg.stage = "lora";
  cfg.max_seq_len = 256;
  const double per_layer =
      16 * 256 * 8.0 * double(mc.num_attention_heads) * 256; // 16 rows
  for (bool ckpt : {false, true}) {
    cfg.gradient_checkpointing = ckpt;
    const auto at = [&](c10::DeviceType device) {
      return finetune_memory(mc, cfg, torch::kFloat32, 16, device, 1)
          .activations;
    };
    const double layers = ckpt ? 1.0 : double(mc.num_hidden_layers);
    EXPECT_DOUBLE_EQ(at(c10::DeviceType::MPS), at(c10::DeviceType::CPU));
    const double cuda = at(c10::DeviceType::CUDA);
    if (attention_keeps_no_scores(c10::DeviceType::CUDA))
      EXPECT_DOUBLE_EQ(at(c10::DeviceType::MPS) - cuda, layers * per_layer)
          << "checkpointing " << ckpt;
    else // libtorch 1.13: CUDA's attention is explicit too
      EXPECT_DOUBLE_EQ(at(c10::DeviceType::MPS), cuda);
    EXPECT_GT(at(c10::DeviceType::MPS), layers * per_layer);
  }
}

} // namespace
} // namespace orchard::train
