// What the op tests share: the error of a result against its oracle.
#pragma once

#include <torch/torch.h>

namespace orchard::test {

// ||got - want|| / ||want||, in float64 on the CPU.
inline double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  auto g = got.to(torch::kCPU, torch::kFloat64);
  auto w = want.to(torch::kCPU, torch::kFloat64);
  return (g - w).norm().item<double>() / w.norm().item<double>();
}

} // namespace orchard::test
