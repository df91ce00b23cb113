#include "train/precision.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/torch_compat.h"

namespace orchard::train {

Precision resolve_precision(
    const std::string& dtype,
    const DeviceInfo& device) {
  Precision p;
  const auto type = device.device.type();
  const std::optional<torch::ScalarType> asked = parse_dtype(dtype, "dtype");
  if (!asked) {
    p.compute = auto_dtype(device);
    p.why = auto_dtype_reason(device);
  } else {
    p.compute = *asked;
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
