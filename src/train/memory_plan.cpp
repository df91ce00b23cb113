#include "train/memory_plan.h"

#include "core/error.h"
#include "core/machine.h"
#include "core/torch_compat.h"
#include "ops/linear_cross_entropy.h"

#include <algorithm>
#include <cstdio>

namespace orchard::train {
namespace {

// Fitted coefficients (see the header for the formula and bench/RESULTS.md
// for the measurements they come from).
struct Coefficients {
  double a;         // bytes per token per unit width, one block
  double k;         // the same, kept per block under checkpointing
  double h;         // bytes per token per head per key, explicit attention
  double g;         // bytes per row of one loss chunk per vocabulary entry
  double workspace; // bytes
};

// Fits to bench/run_memory_grid.sh (bench/RESULTS.md, 2026-11-22), least
// squares on relative error:
// - CPU float32, Debian's libtorch 1.13 (explicit attention), the process's
//   resident set, which also holds OpenBLAS's per-thread buffers (the
//   workspace) and heap slack (why k is far above the 4 bytes of the input
//   each checkpointed block keeps). Fitted on one 18-point grid (heap
//   trimmed before each baseline, as measure_step_peak does), checked on
//   another run of it: all 18 within 0.877-1.123. Since the loss runs over
//   chunks of rows (2026-11-27) g and the workspace were refitted on the
//   same grid with a and k kept (every point has 128-row chunks there, so
//   only their sum is determined): all 18 within 0.910-1.083.
// - CUDA, libtorch 2.11 (fused attention: h = 0), the caching allocator's
//   peak, one H100: a, g and the workspace fitted on 36 points (bf16 and
//   float32); k is the analysis' 4 bytes (the float32 input of each block).
//   The bf16 workspace is small because the casts term already holds what
//   cuBLAS's bf16 path keeps. Refitted on 2026-11-27 (one H200, the same
//   36 points) once the loss took chunks of 256M logits through one
//   kernel and ReLU^2 stayed in bfloat16: all 36 within 0.905-1.110.
//   g is now bytes per logit of one chunk (a bfloat16 chunk's 2 bytes
//   overlap the freed activations at the peak, hence below 2).
// - CPU float32 since its fused loops (ops/fused_cpu.h, 2026-11-29): ReLU²,
//   rotary + QK-norm and add + norm keep fewer intermediates for the
//   backward. a, k and h refitted on the same 18-point grid with g and the
//   workspace kept: all 18 within 0.928-1.122. The plain ops' fit above
//   stays for the paths that still run them (MPS, CPU low precision).
// Where nothing was measured (CPU low precision, MPS), the plain CPU fit is
// used, with the width term scaled by the byte ratio of the analysis
// (60 / 84).
Coefficients coefficients(c10::DeviceType device, c10::ScalarType compute) {
  const bool low = compute != c10::ScalarType::Float;
  if (device == c10::DeviceType::CUDA)
    return low ? Coefficients{50.1, 4.0, 0.0, 0.93, 36e6}
               : Coefficients{79.6, 4.0, 0.0, 2.23, 37.6e6};
  if (device == c10::DeviceType::CPU && !low)
    return Coefficients{22.86, 20.44, 45.71, 18.2, 18.2e6};
  Coefficients plain{30.95, 26.3, 61.9, 18.2, 18.2e6};
  if (low)
    plain.a *= 60.0 / 84.0;
  return plain;
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0)
      out += ',';
    out += s[i];
  }
  return out;
}

} // namespace

std::string format_mb(double bytes) {
  return with_commas(int64_t(bytes / 1e6 + 0.5)) + " MB";
}

PlanModel plan_model_of(const models::GptConfig& c) {
  PlanModel m;
  m.n_layer = c.n_layer;
  m.n_embd = c.n_embd;
  m.n_head = c.n_head;
  m.n_kv_head = c.n_kv_head;
  m.vocab_size = c.vocab_size;
  const int64_t C = c.n_embd, kv = c.n_kv_head * c.head_dim();
  // Per block: q (C x C), k and v (kv x C), proj (C x C), MLP 2 x 4C x C.
  m.matrix_params = c.n_layer * (2 * C * C + 2 * kv * C + 8 * C * C);
  m.params = m.matrix_params + 2 * c.vocab_size * C; // + wte + lm_head
  return m;
}

bool attention_keeps_no_scores(c10::DeviceType device) {
  // On the CPU, libtorch 2.x's SDPA would keep none either, but the CPU's
  // fit is Debian's 1.13 (explicit attention) and 2.11's CPU has not been
  // refitted: there one step (d4, 8 x 256 tokens, 16 threads) used 316 MB
  // against 194 MB predicted without the term (bench/RESULTS.md,
  // 2026-12-01). The term keeps the prediction on the safe side.
  return device == c10::DeviceType::CUDA && compat::has_fused_attention();
}

bool copy_engines_may_average(
    bool float32_gradients,
    const std::string& grad_reduce_dtype,
    const std::string& grad_average) {
  return float32_gradients && grad_reduce_dtype != "bfloat16" &&
      grad_average != "nccl";
}

double copy_engine_scratch(
    double gradient_bytes,
    double bucket_bytes,
    int processes) {
  return std::min(gradient_bytes, bucket_bytes) * (processes - 1) /
      std::max(processes, 1);
}

MemoryEstimate estimate_memory(
    const PlanModel& m,
    const PlanSettings& s,
    int64_t batch,
    int64_t accum) {
  const Coefficients k = coefficients(s.device, s.compute);
  const double P = double(m.params), Pm = double(m.matrix_params);
  const double tokens = double(batch) * double(s.seq_len);
  const double C = double(m.n_embd), L = double(m.n_layer);
  const double attn =
      s.no_attention_scores ? 0.0 : k.h * double(m.n_head) * double(s.seq_len);
  const double per_block = tokens * (k.a * C + attn);
  MemoryEstimate e;
  e.weights = 4 * P;
  e.gradients = 4 * P;
  e.optimizer = s.muon ? 4 * Pm + 8 * (P - Pm) : 8 * P;
  e.casts = s.compute == c10::ScalarType::Float ? 0.0 : 2 * Pm;
  e.activations = s.gradient_checkpointing ? L * tokens * C * k.k + per_block
                                           : L * per_block;
  // The GPT's loss runs over chunks of rows (ops/linear_cross_entropy.h):
  // one chunk's logits at a time, and the head's gradient (V x C, float32)
  // with its scaled copy from the loss's forward to its backward.
  const double V = double(m.vocab_size);
  const double rows =
      std::min(tokens, double(ops::default_chunk_rows(s.device, m.vocab_size)));
  e.logits = rows * V * k.g + 8 * V * C;
  e.workspace = k.workspace;
  if (accum <= 1) {
    // One micro-step: the blocks' gradients appear as their activations are
    // freed, so the peak is the larger end of the backward.
    const double start = e.activations + e.logits + 4 * (P - Pm);
    const double end = e.gradients;
    const double peak_extra = std::max(start, end);
    e.gradients = std::min(
        e.gradients, std::max(0.0, peak_extra - e.activations - e.logits));
  }
  if (s.processes > 1) // the averager's flat buckets, allocated once
    e.gradients += (s.reduce_in_bfloat16 ? 6 : 4) * P +
        copy_engine_scratch(4 * P, s.copy_engine_bucket, s.processes);
  if (s.processes > 1 && s.shard_optimizer) {
    // Each rank its share, but of the embedding's AdamW moments, which
    // every rank keeps (it steps the embedding whole: dist::Shardable's
    // `everywhere`).
    const double embedding = 8 * V * C;
    e.optimizer = (e.optimizer - embedding) / double(s.processes) + embedding;
  }
  return e;
}

MemoryBudget memory_budget(const DeviceInfo& d, double fraction) {
  MemoryBudget b;
  if (d.kind == "cuda") {
    b.usable = d.free_memory;
    b.why = "free GPU memory";
  } else if (d.kind == "mps") {
    b.usable = uint64_t(double(d.total_memory) * kMpsWorkingSetShare);
    b.why = "the GPU's working set on a Mac: 65 % of " +
        format_bytes(d.total_memory) + " unified memory";
  } else {
    b.usable = d.free_memory;
    b.why = "available RAM";
  }
  b.bytes = uint64_t(double(b.usable) * fraction);
  char pct[16];
  std::snprintf(pct, sizeof pct, "%.0f %%", fraction * 100);
  b.why =
      std::string(pct) + " of " + b.why + " (" + format_bytes(b.usable) + ")";
  return b;
}

bool killed_when_out_of_memory(const DeviceInfo& device) {
  return device.kind == "cpu" || device.kind == "mps";
}

void refuse_beyond_memory(
    const DeviceInfo& device,
    const std::string& key,
    int64_t batch,
    double predicted_bytes,
    const MemoryBudget& budget,
    std::optional<int64_t> largest_that_fits) {
  if (!killed_when_out_of_memory(device) ||
      predicted_bytes <= double(budget.usable))
    return;
  throw UserError(
      key + "=" + std::to_string(batch) + " needs about " +
      format_mb(predicted_bytes) +
      " at its peak by the memory plan, more "
      "than the " +
      format_mb(double(budget.usable)) + " this machine has (" + budget.why +
      "). On " + (device.kind == "mps" ? "a Mac" : "the CPU") +
      " the system kills a process that runs out of memory, so training "
      "would die without a message or a checkpoint. " +
      (largest_that_fits
           ? "The largest size that fits is " + key + "=" +
               std::to_string(*largest_that_fits) + "; or leave " + key +
               " out to have it chosen."
           : "Even one row does not fit: lower the sequence length or the "
             "model size.") +
      " (`orchard plan` shows the whole table.)");
}

BatchPlan plan_batch(
    const PlanModel& model,
    PlanSettings settings,
    int64_t total_batch_size,
    const MemoryBudget& budget,
    std::optional<bool> checkpointing) {
  BatchPlan plan;
  plan.budget = budget;
  const int64_t rows = total_batch_size / settings.seq_len;
  std::vector<bool> modes;
  if (checkpointing)
    modes = {*checkpointing};
  else
    modes = {false, true};
  for (bool ckpt : modes) {
    settings.gradient_checkpointing = ckpt;
    std::optional<PlanCandidate> best;
    for (int64_t b = 1; b <= rows; ++b) {
      if (rows % b != 0)
        continue;
      PlanCandidate c;
      c.batch = b;
      c.accum = rows / b;
      c.checkpointing = ckpt;
      c.estimate = estimate_memory(model, settings, b, c.accum);
      c.fits = c.estimate.total() <= double(budget.bytes);
      plan.candidates.push_back(c);
      if (c.fits)
        best = c;
    }
    if (best) {
      plan.choice = best;
      plan.why = "the largest micro-batch whose predicted peak (" +
          format_mb(best->estimate.total()) + ") fits the budget (" +
          format_mb(double(budget.bytes)) + ")" +
          (ckpt && !checkpointing
               ? "; nothing fits without gradient checkpointing, so it is on"
               : "");
      return plan;
    }
  }
  plan.why = "no micro-batch fits: even 1 sequence of " +
      std::to_string(settings.seq_len) + " tokens needs " +
      format_mb(plan.candidates.empty() ? 0.0
                    : plan.candidates.back().batch == 1
                    ? plan.candidates.back().estimate.total()
                    : plan.candidates.front().estimate.total()) +
      " against a budget of " + format_mb(double(budget.bytes)) +
      ". Shorten max_seq_len, use a smaller model (depth), or free memory.";
  return plan;
}

std::string plan_table(const BatchPlan& plan, int64_t seq_len) {
  std::string out = "Budget: " + format_mb(double(plan.budget.bytes)) + " (" +
      plan.budget.why + ")\n\n";
  char line[256];
  std::snprintf(
      line,
      sizeof line,
      "%6s %6s %5s %10s %10s %10s %10s %10s %10s %12s  %s\n",
      "batch",
      "accum",
      "ckpt",
      "weights",
      "grads",
      "optimizer",
      "casts",
      "activ.",
      "logits",
      "peak",
      "fits");
  out += line;
  for (const auto& c : plan.candidates) {
    const auto& e = c.estimate;
    const bool chosen = plan.choice && plan.choice->batch == c.batch &&
        plan.choice->checkpointing == c.checkpointing;
    std::snprintf(
        line,
        sizeof line,
        "%6lld %6lld %5s %10s %10s %10s %10s %10s %10s %12s  %s%s\n",
        (long long)c.batch,
        (long long)c.accum,
        c.checkpointing ? "on" : "off",
        format_mb(e.weights).c_str(),
        format_mb(e.gradients).c_str(),
        format_mb(e.optimizer).c_str(),
        format_mb(e.casts).c_str(),
        format_mb(e.activations).c_str(),
        format_mb(e.logits).c_str(),
        format_mb(e.total()).c_str(),
        c.fits ? "yes" : "no",
        chosen ? "   <- chosen" : "");
    out += line;
  }
  out += "\n";
  if (plan.choice)
    out += "Choice: device_batch_size=" + std::to_string(plan.choice->batch) +
        " (" + std::to_string(plan.choice->batch) + " x " +
        std::to_string(seq_len) + " tokens), gradient accumulation " +
        std::to_string(plan.choice->accum) + ", gradient checkpointing " +
        (plan.choice->checkpointing ? "on" : "off") + ": " + plan.why + ".\n";
  else
    out += "No choice: " + plan.why + "\n";
  return out;
}

nlohmann::json plan_json(const BatchPlan& plan, int64_t seq_len) {
  auto est = [](const MemoryEstimate& e) {
    return nlohmann::json{
        {"weights", e.weights},
        {"gradients", e.gradients},
        {"optimizer", e.optimizer},
        {"casts", e.casts},
        {"activations", e.activations},
        {"logits", e.logits},
        {"workspace", e.workspace},
        {"total", e.total()}};
  };
  nlohmann::json j;
  j["budget"] = {
      {"bytes", plan.budget.bytes},
      {"usable", plan.budget.usable},
      {"why", plan.budget.why}};
  j["seq_len"] = seq_len;
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : plan.candidates)
    j["candidates"].push_back(
        {{"device_batch_size", c.batch},
         {"grad_accum_steps", c.accum},
         {"gradient_checkpointing", c.checkpointing},
         {"fits", c.fits},
         {"bytes", est(c.estimate)}});
  if (plan.choice)
    j["choice"] = {
        {"device_batch_size", plan.choice->batch},
        {"grad_accum_steps", plan.choice->accum},
        {"gradient_checkpointing", plan.choice->checkpointing}};
  else
    j["choice"] = nullptr;
  j["why"] = plan.why;
  return j;
}

} // namespace orchard::train
