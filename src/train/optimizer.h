// The optimizers of a run, as one object the Trainer drives: AdamW for
// every parameter group, or Muon for the transformer's 2-D matrices and
// AdamW for the rest (embeddings, lm_head, anything not 2-D), as
// modded-nanogpt and nanochat train.
//
// Muon (Keller Jordan, "Muon: an optimizer for hidden layers in neural
// networks", https://kellerjordan.github.io/posts/muon/): SGD momentum
// (Nesterov) whose update is replaced by the nearest semi-orthogonal
// matrix, computed with five iterations of a quintic Newton-Schulz map
// whose coefficients (3.4445, -4.7750, 2.0315) push every singular value
// into roughly [0.7, 1.2] quickly rather than exactly to 1; the update is
// scaled by sqrt(max(1, rows / cols)). Momentum warms up from 0.85 to
// 0.95 over the first 300 steps (nanochat's schedule).
//
// AdamW is decoupled weight decay (Loshchilov & Hutter) with bias-corrected
// moments, the same arithmetic as torch::optim::AdamW (the test holds them
// equal), applied to all tensors of a step at once. With 8-bit moments, or
// for a bfloat16 weight (weights_dtype=bfloat16), each tensor is updated
// in float32 a slice at a time instead: moments decoded, the step taken,
// moments encoded again and the weight rounded stochastically
// (train/low_precision_state.h); a bfloat16 weight's moments are float32
// unless 8-bit.
#pragma once

#include "runs/checkpoint.h"
#include "train/low_precision_state.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace orchard::train {

using runs::NamedTensors;

struct ParamGroup {
  std::string name; // "matrices", "embedding", "lm_head"
  NamedTensors params;
  double lr = 0;
  double weight_decay = 0;
  bool muon = false; // every tensor must be 2-D
  // Another update rule for the group (TRM's):
  //   "adam_atan2": Adam with atan2 in place of the division (Everett et
  //     al., "Scaling Exponents Across Parameterizations and Optimizers",
  //     2024): p <- p (1 - lr wd) - lr atan2(m_hat, sqrt(v_hat)); no
  //     epsilon, bounded steps. Moments and their names as AdamW's.
  //   "sign_sgd": p <- p (1 - lr wd) - lr sign(g) for the rows of a 2-D
  //     tensor whose gradient is not all zero (the puzzle embeddings a
  //     batch used; the others keep their values, decay included). No
  //     state.
  std::string rule;
};

struct OptimizerOptions {
  double adam_beta1 = 0.8, adam_beta2 = 0.95, adam_eps = 1e-10; // nanochat's
  double muon_momentum = 0.95;
  double muon_momentum_start = 0.85;
  int64_t muon_momentum_warmup = 300;
  int64_t newton_schulz_steps = 5;
  // Muon orthogonalises same-shaped matrices as one stack on GPUs (a few
  // launches for the stack instead of a few per matrix). On the CPU, where
  // a launch costs nothing, one at a time: stacking measured 2.5 % slower
  // there (d6, 2 cores, 2026-11-25). true stacks on the CPU too (tests).
  bool muon_stack_on_cpu = false;
  // Newton-Schulz runs in bfloat16 where the run computes in it (its
  // iterations are stable there, per the Muon write-up), float32 elsewhere.
  torch::ScalarType newton_schulz_dtype = torch::kFloat32;
  // AdamW updates tensors together in slices of at most this many elements
  // (a larger tensor alone; in pieces of this size on the float32-slice
  // path); it bounds the update's temporary memory (4M: 16 MB a
  // temporary, where 64M was 256 MB: a 3B model's LoRA step, 30M adapter
  // values, then peaked 120 MB above its state).
  int64_t adam_slice_elements = int64_t(1) << 22;
  // Float32 AdamW tensors on CUDA are updated by libtorch's fused kernel
  // (compat::fused_adamw) where it has one; false: the multi-tensor ops
  // everywhere (the tests' oracle for the fused kernel).
  bool fused_adamw = true;
  // AdamW's moments in 8 bits a value (train/low_precision_state.h), for
  // every AdamW tensor: optim=adamw_8bit.
  bool adam_8bit = false;
  // Seeds the stochastic rounding of bfloat16 weights (a stream per step,
  // so a resumed run rounds as the uninterrupted one did).
  uint64_t seed = 0;
};

// The orthogonalised update of Muon for a 2-D gradient: approximately
// U V^T for G = U S V^T. The test checks it against an SVD. A 3-D g is a
// stack of same-shaped gradients, each orthogonalised on its own with
// batched products (a few launches for the stack, where one matrix at a
// time takes a few for each).
torch::Tensor newton_schulz_orthogonalize(
    const torch::Tensor& g,
    int64_t steps,
    torch::ScalarType dtype);

class Optimizers {
 public:
  Optimizers(std::vector<ParamGroup> groups, OptimizerOptions options = {});
  ~Optimizers();

  void zero_grad();
  // One update with every group's lr times `lr_multiplier`; `step` is the
  // 0-based step (Muon's momentum warmup).
  void step(double lr_multiplier, int64_t step);

  // An AdamW step the host does not have to decide: each gradient is
  // divided by `grad_scale` (clipping) and nothing changes where
  // `found_inf` is 1 (a non-finite gradient), both float32 device scalars
  // the host never reads before the launch. Only where every group is
  // plain AdamW over float32 CUDA weights, each with a gradient and one
  // step count per group, that libtorch's fused kernel updates:
  // can_step_on_device() says so, and step_on_device() is then the same
  // update as step() after the host clipped (to rounding).
  bool can_step_on_device() const;
  void step_on_device(
      double lr_multiplier,
      const torch::Tensor& grad_scale,
      const torch::Tensor& found_inf);
  // After a step_on_device() whose found_inf was 1: the step counts back
  // to what they were (the kernel changed nothing else).
  void uncount_step();

  std::vector<torch::Tensor> parameters() const;
  const std::vector<ParamGroup>& groups() const {
    return groups_;
  }
  const OptimizerOptions& options() const {
    return options_;
  }
  std::string describe() const; // "Muon (matrices, lr 0.02) + AdamW (...)"

  // Per parameter name: "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step"
  // (AdamW; 8-bit: "<name>.exp_avg.q8", "<name>.exp_avg.absmax" and the
  // same for exp_avg_sq), "<name>.momentum_buffer" (Muon).
  NamedTensors state() const;
  // UserError when the saved state does not match these parameters.
  void load(const std::map<std::string, torch::Tensor>& saved);

 private:
  std::vector<ParamGroup> groups_;
  OptimizerOptions options_;
  // AdamW's state per parameter of the non-Muon groups (indexed as
  // groups_[g].params), updated with multi-tensor (_foreach_) kernels: a
  // LoRA run's few hundred adapter tensors take a few launches per step,
  // not a few per tensor as torch::optim::AdamW's loop does.
  struct AdamState {
    torch::Tensor exp_avg, exp_avg_sq;
    Quantized8 avg8, sq8; // optim=adamw_8bit
    int64_t step = 0;
  };
  void adamw_step(size_t group, double lr, int64_t step);
  void adam_atan2_step(size_t group, double lr);
  void sign_sgd_step(size_t group, double lr);
  // One tensor through the float32-slice path.
  void adamw_slices(
      const torch::Tensor& p,
      AdamState& s,
      double lr,
      double weight_decay,
      c10::optional<at::Generator> gen);
  std::vector<std::vector<AdamState>> adam_;
  std::map<std::string, torch::Tensor> muon_momentum_;
};

} // namespace orchard::train
