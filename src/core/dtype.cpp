#include "core/dtype.h"

#include "core/error.h"

namespace orchard {

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::Double:
      return "float64";
    default:
      return c10::toString(type);
  }
}

std::optional<c10::ScalarType> parse_dtype(
    const std::string& name,
    const std::string& what) {
  if (name == "auto")
    return std::nullopt;
  if (name == "float32")
    return c10::ScalarType::Float;
  if (name == "bfloat16")
    return c10::ScalarType::BFloat16;
  if (name == "float16")
    return c10::ScalarType::Half;
  // A key is written key=value, a flag --flag value, as the user typed it.
  const std::string given =
      what.rfind("--", 0) == 0 ? what + " " + name : what + "=" + name;
  throw UserError(given + ": expected auto, float32, bfloat16 or float16.");
}

bool computes_bfloat16_natively(const DeviceInfo& device) {
  return device.kind == "cuda" &&
      (device.compute_capability == 0 ||
       device.compute_capability >= kFirstBf16ComputeCapability);
}

c10::ScalarType auto_dtype(const DeviceInfo& device) {
  return computes_bfloat16_natively(device) ? c10::ScalarType::BFloat16
                                            : c10::ScalarType::Float;
}

c10::ScalarType resolve_dtype(
    const std::string& name,
    const std::string& what,
    const DeviceInfo& device) {
  return parse_dtype(name, what).value_or(auto_dtype(device));
}

std::string auto_dtype_reason(const DeviceInfo& device) {
  if (computes_bfloat16_natively(device))
    return "auto: CUDA computes bfloat16 natively";
  if (device.kind == "cuda")
    return "auto: this GPU predates bfloat16 (compute capability " +
        std::to_string(device.compute_capability) +
        "); dtype=float16 is the faster choice";
  if (device.kind == "mps")
    return "auto: float32 on MPS (bfloat16 is opt-in: bf16=true)";
  return "auto: the default on " + device.kind;
}

int dtype_bytes(c10::ScalarType type) {
  return type == c10::ScalarType::Double ? 8
      : type == c10::ScalarType::Float   ? 4
                                         : 2;
}

} // namespace orchard
