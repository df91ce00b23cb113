#include "train/precision.h"

#include "core/error.h"
#include "core/torch_compat.h"

namespace orchard::train {
namespace {

// bfloat16 arithmetic is native from Ampere (sm_80) on; older GPUs emulate
// it slowly.
constexpr int kFirstBf16ComputeCapability = 80;

torch::ScalarType parse_dtype(const std::string& dtype) {
  if (dtype == "float32")
    return torch::kFloat32;
  if (dtype == "bfloat16")
    return torch::kBFloat16;
  if (dtype == "float16")
    return torch::kFloat16;
  throw UserError(
      "dtype=" + dtype + ": expected auto, float32, bfloat16 or float16.");
}

} // namespace

Precision resolve_precision(
    const std::string& dtype,
    const DeviceInfo& device) {
  Precision p;
  const auto type = device.device.type();
  if (dtype == "auto") {
    bool bf16_native = type == torch::kCUDA &&
        (device.compute_capability == 0 ||
         device.compute_capability >= kFirstBf16ComputeCapability);
    p.compute = bf16_native ? torch::kBFloat16 : torch::kFloat32;
    p.why = bf16_native ? "auto: CUDA computes bfloat16 natively"
        : type == torch::kCUDA
        ? "auto: this GPU predates bfloat16 (compute capability " +
            std::to_string(device.compute_capability) +
            "); dtype=float16 is the faster choice"
        : "auto: the default on " + device.kind;
  } else {
    p.compute = parse_dtype(dtype);
    p.why = "dtype=" + dtype;
    if (!compat::autocast_supported(type, p.compute))
      throw UserError(
          "dtype=" + dtype + " is not available on " + device.kind +
          " with libtorch " + compat::torch_version() +
          (type == torch::kMPS
               ? " (MPS autocast needs PyTorch 2.5 or later)"
               : " (CPU autocast there supports bfloat16 only)") +
          "; use dtype=float32" +
          (type == torch::kCPU ? " or dtype=bfloat16." : "."));
  }
  p.loss_scaling = p.compute == torch::kFloat16;
  p.name = p.compute == torch::kFloat32 ? "float32"
      : p.compute == torch::kBFloat16
      ? "bfloat16 autocast, float32 weights"
      : "float16 autocast, float32 weights, dynamic loss scaling";
  return p;
}

bool LossScaler::update(bool grads_finite) {
  if (!enabled_)
    return grads_finite;
  if (!grads_finite) {
    scale_ *= kBackoffFactor;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ == kGrowthInterval) {
    scale_ *= kGrowthFactor;
    good_steps_ = 0;
  }
  return true;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"good_steps", good_steps_}};
}

void LossScaler::load(const nlohmann::json& state) {
  if (state.is_object()) {
    scale_ = state.value("scale", kInitialScale);
    good_steps_ = state.value("good_steps", int64_t(0));
  }
}

} // namespace orchard::train
