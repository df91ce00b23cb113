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
// equal), applied to all tensors of a step at once.
#pragma once

#include "runs/checkpoint.h"

#include <torch/torch.h>

#include <map>
#include <memory>
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
};

struct OptimizerOptions {
  double adam_beta1 = 0.8, adam_beta2 = 0.95, adam_eps = 1e-10; // nanochat's
  double muon_momentum = 0.95;
  double muon_momentum_start = 0.85;
  int64_t muon_momentum_warmup = 300;
  int64_t newton_schulz_steps = 5;
  // Newton-Schulz runs in bfloat16 where the run computes in it (its
  // iterations are stable there, per the Muon write-up), float32 elsewhere.
  torch::ScalarType newton_schulz_dtype = torch::kFloat32;
  // AdamW updates tensors together in slices of at most this many elements
  // (a larger tensor alone); it bounds the update's temporary memory.
  int64_t adam_slice_elements = int64_t(1) << 26;
};

// The orthogonalised update of Muon for a 2-D gradient: approximately
// U V^T for G = U S V^T. The test checks it against an SVD.
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

  std::vector<torch::Tensor> parameters() const;
  const std::vector<ParamGroup>& groups() const {
    return groups_;
  }
  std::string describe() const; // "Muon (matrices, lr 0.02) + AdamW (...)"

  // Per parameter name: "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step"
  // (AdamW), "<name>.momentum_buffer" (Muon).
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
    int64_t step = 0;
  };
  void adamw_step(size_t group, double lr);
  std::vector<std::vector<AdamState>> adam_;
  std::map<std::string, torch::Tensor> muon_momentum_;
};

} // namespace orchard::train
