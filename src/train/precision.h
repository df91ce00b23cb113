// Mixed precision: which dtype the matrix products run in, and dynamic loss
// scaling for float16.
//
// `dtype=bfloat16|float16` keeps float32 master weights and optimizer state
// and computes the forward under autocast (compat::AutocastGuard), as
// PyTorch's torch.autocast + torch.optim does. float16's narrow exponent
// underflows small gradients, so its loss is multiplied by a scale before
// backward and the gradients divided by it after; a step whose gradients
// overflowed is skipped and the scale halved, and after `growth_interval`
// good steps it doubles (Micikevicius et al. 2018, "Mixed Precision
// Training", https://arxiv.org/abs/1710.03740; the constants are
// torch.amp.GradScaler's defaults).
#pragma once

#include "core/device.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <string>

namespace orchard::train {

struct Precision {
  torch::ScalarType compute = torch::kFloat32;
  bool loss_scaling = false; // float16
  std::string name;          // "bfloat16 autocast, float32 weights"
  std::string why;           // "auto: CUDA with bfloat16 support"
};

// `dtype` is auto|float32|bfloat16|float16. auto: bfloat16 on CUDA GPUs
// that compute it natively (compute capability 8.0+, or unknown), float32
// on older GPUs, MPS and the CPU (ARCHITECTURE.md's table). An explicit
// dtype the device's libtorch cannot autocast is a UserError that says
// which dtypes work there.
Precision resolve_precision(const std::string& dtype, const DeviceInfo& device);

class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0; // 2^16
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

  explicit LossScaler(bool enabled) : enabled_(enabled) {}
  bool enabled() const {
    return enabled_;
  }
  double scale() const {
    return enabled_ ? scale_ : 1.0;
  }
  // After a step's gradients are known to be finite (or not): adjusts the
  // scale. Returns whether the optimizer step should be taken.
  bool update(bool grads_finite);

  nlohmann::json state() const;
  void load(const nlohmann::json& state);

 private:
  bool enabled_;
  double scale_ = kInitialScale;
  int64_t good_steps_ = 0;
};

} // namespace orchard::train
