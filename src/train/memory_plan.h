// The memory planner: the predicted peak of a training step, and the
// largest micro-batch that fits a budget.
//
// Predicted peak (bytes) for micro-batch B, sequence T, L layers, width C,
// H heads, vocabulary V, P parameters (P_m of them the blocks' matrices):
//
//   weights      4 P                      float32 master weights
//   gradients    4 P                      every parameter is trained; 8 P
//                with several processes (dist::GradientAverager's buckets
//                beside .grad), 10 P when they are sent in bfloat16
//   optimizer    AdamW: 8 P (two moments); Muon: 4 P_m (momentum) + 8 (P -
//   P_m);
//                divided by the processes with zero_stage=1 (each rank
//                keeps its share)
//   casts        2 P_m under bf16/fp16 autocast (the low-precision copies of
//                the matrices that the backward keeps)
//   activations  L B T (a C + h H T)        without checkpointing
//                L B T k C + B T (a C + h H T)   with it (each block keeps
//                its float32 input, k = 4 by count; one block's
//                intermediates live again while it is recomputed)
//   logits       R V g + 8 V C            one chunk of R = min(B T, the loss's
//                chunk rows) rows of lm_head output, soft-cap, softmax and
//                gradient (float32 plain ops on the CPU and MPS; on CUDA
//                one kernel over the logits in autocast's dtype); the
//                head's gradient and its scaled copy (the loss takes the
//                gradients in its forward)
//   workspace    a constant per device (cuBLAS/cuDNN scratch, allocator slack)
//
// a: bytes per token per unit of width kept by one block (all coefficients
// are bytes, so the compute dtype is inside them). Counting what
// autograd saves in models/gpt.cpp's block gives about 20-21 tensors of
// width C (x, the norms' outputs, q/k/v before and after rotary and
// QK-norm, the attention output, the MLP's ReLU and ReLU² of width 4C), i.e.
// a = 20 * 4 = 80 in float32; under autocast the linear outputs are 2 bytes
// and the norms 4. The values below are fitted to measurements (bench/
// memory_probe.cpp; bench/RESULTS.md has the grid and the errors).
// h: the explicit attention (libtorch 1.13, and MPS/CPU without a fused
// kernel) keeps the softmax probabilities, H T values per token, and
// briefly two more of the same size; fused kernels keep none (h = 0).
// g: floats per token per vocabulary entry at the peak of the backward.
//
// The peak is taken at the start of the backward of a micro-step that
// already has gradients (gradient accumulation), so the sum above applies;
// with a single micro-step the gradients of the blocks are not yet there
// while the activations are, and the peak is the larger of the two ends of
// the backward.
#pragma once

#include "core/device.h"
#include "models/gpt.h"

#include <nlohmann/json.hpp>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard::train {

struct PlanModel {
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, vocab_size = 0;
  int64_t params = 0;        // all (trained) parameters
  int64_t matrix_params = 0; // the blocks' matrices (Muon's share)
};
PlanModel plan_model_of(const models::GptConfig& c);

// Whether a training step's attention on `device` keeps no scores for the
// backward, as the coefficients for that device were measured: CUDA's
// fused attention (libtorch 2.x). MPS trains through PyTorch's math SDPA,
// which keeps them (its backward is the math path's), and the CPU's
// coefficients come from explicit attention: both keep the per-key term.
bool attention_keeps_no_scores(c10::DeviceType device);

struct PlanSettings {
  int64_t seq_len = 256;
  c10::ScalarType compute = c10::ScalarType::Float;
  bool muon = true;
  bool gradient_checkpointing = false;
  c10::DeviceType device = c10::DeviceType::CPU;
  // The attention keeps no scores for the backward (no per-key term):
  // attention_keeps_no_scores(device).
  bool no_attention_scores = false;
  int processes = 1;            // data-parallel ranks (dist::size())
  bool shard_optimizer = false; // zero_stage=1: 1/processes of the state
  // grad_reduce_dtype=bfloat16 on CUDA: the buckets again in bfloat16.
  bool reduce_in_bfloat16 = false;
  // Where the GPUs' copy engines average the buckets (dist's
  // CopyEngineMean), bucket_cap_mb in bytes: their scratch holds the
  // largest bucket's share from every other rank.
  double copy_engine_bucket = 0;
};

struct MemoryEstimate {
  double weights = 0, gradients = 0, optimizer = 0, casts = 0;
  double activations = 0, logits = 0, workspace = 0;
  double total() const {
    return weights + gradients + optimizer + casts + activations + logits +
        workspace;
  }
};

// Whether the GPUs' copy engines may average the gradient buckets (dist's
// CopyEngineMean, where the processes are on one CUDA host): float32
// gradients, not sent in bfloat16, grad_average not nccl.
bool copy_engines_may_average(
    bool float32_gradients,
    const std::string& grad_reduce_dtype,
    const std::string& grad_average);
// Their scratch, bytes: the largest bucket's share from every other
// process; a bucket holds at most bucket_bytes (with zero_stage=1, a
// process's share: pass bucket_cap x processes) and at most all
// gradients.
double copy_engine_scratch(
    double gradient_bytes,
    double bucket_bytes,
    int processes);

MemoryEstimate estimate_memory(
    const PlanModel& model,
    const PlanSettings& settings,
    int64_t batch,
    int64_t accum);

// What the planner may use. Default fraction 0.8 of usable memory: free GPU
// memory on CUDA; on MPS the GPU's working-set limit (65 % of RAM, the
// recommended maximum macOS gives the GPU when libtorch cannot report it);
// on the CPU the available RAM.
struct MemoryBudget {
  uint64_t usable = 0, bytes = 0;
  std::string why;
};
constexpr double kDefaultBudgetFraction = 0.8;
constexpr double kMpsWorkingSetShare = 0.65;
MemoryBudget memory_budget(
    const DeviceInfo& device,
    double fraction = kDefaultBudgetFraction);

struct PlanCandidate {
  int64_t batch = 0, accum = 0;
  bool checkpointing = false;
  MemoryEstimate estimate;
  bool fits = false;
};

struct BatchPlan {
  std::vector<PlanCandidate> candidates; // every size considered
  std::optional<PlanCandidate> choice;
  std::string why;
  MemoryBudget budget;
};

// Micro-batches considered: the divisors of total_batch_size / seq_len
// (so total_batch_size stays fixed), smallest first. The choice is the
// largest that fits; when none fits without checkpointing and
// `checkpointing` is auto (nullopt), the same with checkpointing. No fit
// at all: no choice, and `why` says what would help.
BatchPlan plan_batch(
    const PlanModel& model,
    PlanSettings settings,
    int64_t total_batch_size,
    const MemoryBudget& budget,
    std::optional<bool> checkpointing = std::nullopt);

// On the CPU and on a Mac (unified memory) the system kills a process that
// runs out of memory instead of failing its allocation, so the
// halve-and-redo path never runs and the step is lost with no message. A
// micro-batch set by hand (`key`=N) whose predicted peak is beyond the
// memory there is refused with the largest size that fits.
bool killed_when_out_of_memory(const DeviceInfo& device);
void refuse_beyond_memory(
    const DeviceInfo& device,
    const std::string& key,
    int64_t batch,
    double predicted_bytes,
    const MemoryBudget& budget,
    std::optional<int64_t> largest_that_fits);

std::string format_mb(double bytes); // "1,234 MB"

// The plan as the table `orchard plan` prints, and as JSON (--json).
std::string plan_table(const BatchPlan& plan, int64_t seq_len);
nlohmann::json plan_json(const BatchPlan& plan, int64_t seq_len);

} // namespace orchard::train
