// What the op tests share: the error of a result against its oracle, a
// dtype's unit in the last place, and the device of the CUDA kernels
// (REQUIRE_KERNELS skips a test where they are not built or there is no
// GPU).
#pragma once

#include "ops/kernel_call.h"

#include <torch/torch.h>

#include <optional>

namespace orchard::test {

// ||got - want|| / ||want||, in float64 on the CPU.
inline double relative_error(
    const torch::Tensor& got,
    const torch::Tensor& want) {
  auto g = got.to(torch::kCPU, torch::kFloat64);
  auto w = want.to(torch::kCPU, torch::kFloat64);
  return (g - w).norm().item<double>() / w.norm().item<double>();
}

// max |got - want|, in float64 on the CPU.
inline double max_diff(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kCPU, torch::kFloat64) -
          want.to(torch::kCPU, torch::kFloat64))
      .abs()
      .max()
      .item<double>();
}

// One unit in the last place of the dtype at magnitude 1.
inline double ulp(torch::ScalarType t) {
  return t == torch::kFloat32 ? 1.2e-7 : t == torch::kFloat16 ? 9.8e-4 : 7.9e-3;
}

// The device with the kernels of src/ops/cuda, or nullopt.
inline std::optional<torch::Device> kernel_device() {
  if (!torch::cuda::is_available())
    return std::nullopt;
  const torch::Device cuda(torch::kCUDA, 0);
  if (!ops::kernel::usable_with_grad({torch::ones({2, 4}, cuda)}))
    return std::nullopt;
  return cuda;
}

} // namespace orchard::test

#define REQUIRE_KERNELS(dev)                                              \
  const auto dev##_opt = ::orchard::test::kernel_device();                \
  if (!dev##_opt)                                                         \
    GTEST_SKIP() << "SKIPPED: no CUDA device, or built without the CUDA " \
                    "kernels (ORCHARD_CUDA)";                             \
  const torch::Device dev = *dev##_opt
