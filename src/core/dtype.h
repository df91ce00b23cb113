// Dtype names and the per-device default: the one place they live.
//
// Users type float32, bfloat16 and float16 (and `auto`) in configs and
// flags; Hugging Face's config.json says the same in torch_dtype. `auto`
// has one answer for every command (training's autocast, a LoRA run's
// frozen base, a model loaded for generation), ARCHITECTURE.md's table:
// bfloat16 on CUDA GPUs that compute it natively (compute capability 8.0+,
// or unknown), float32 on older GPUs, on MPS (bfloat16 is opt-in there:
// `bf16=true` or `dtype=bfloat16`) and on the CPU.
#pragma once

#include "core/device.h"

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace orchard {

// bfloat16 arithmetic is native from Ampere (sm_80) on; older GPUs emulate
// it slowly.
constexpr int kFirstBf16ComputeCapability = 80;

// "float32", "bfloat16", "float16", "float64"; c10's name otherwise.
std::string dtype_name(c10::ScalarType type);

// float32 | bfloat16 | float16 -> the type; nullopt for "auto". UserError
// for anything else, naming `what` (the key or flag: "dtype", "--dtype").
std::optional<c10::ScalarType> parse_dtype(
    const std::string& name,
    const std::string& what);

// Whether `device` computes bfloat16 natively (CUDA sm_80+ or unknown).
bool computes_bfloat16_natively(const DeviceInfo& device);

// What `auto` means on `device` (see the header).
c10::ScalarType auto_dtype(const DeviceInfo& device);

// A dtype setting resolved: the explicit one, or auto_dtype(device).
c10::ScalarType resolve_dtype(
    const std::string& name,
    const std::string& what,
    const DeviceInfo& device);

// Why `auto` chose what it did: "auto: CUDA computes bfloat16 natively".
std::string auto_dtype_reason(const DeviceInfo& device);

// Bytes per element of a floating-point dtype (8, 4 or 2).
int dtype_bytes(c10::ScalarType type);

// The dtype a loss or log-probability over a head's logits computes in:
// float64 for float64 inputs (the tests' references), float32 for the rest.
inline c10::ScalarType loss_arithmetic(c10::ScalarType input) {
  return input == c10::ScalarType::Double ? c10::ScalarType::Double
                                          : c10::ScalarType::Float;
}

} // namespace orchard
