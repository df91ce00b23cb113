// Helpers for tests of LoRA on the Hugging Face models.
#pragma once

#include "models/hf/model.h"
#include "models/lora.h"

#include <torch/torch.h>

#include <vector>

namespace orchard::test {

// Adds `spec`'s adapters in `dtype`, then draws every A and B from
// N(0, 0.1) under `seed` (B would start at zero and not count otherwise).
inline void add_random_lora(
    models::Llama& model,
    const models::LoraSpec& spec,
    torch::ScalarType dtype,
    uint64_t seed) {
  torch::manual_seed(seed);
  model->add_lora(spec, dtype);
  torch::NoGradGuard no_grad;
  for (auto& [k, t] : models::adapter_tensors(model))
    t.normal_(0, 0.1);
}

// Copies of the adapters' gradients, in adapter_tensors() order.
inline std::vector<torch::Tensor> adapter_grads(const models::Llama& model) {
  std::vector<torch::Tensor> g;
  for (auto& [k, t] : models::adapter_tensors(model))
    g.push_back(t.grad().clone());
  return g;
}

} // namespace orchard::test
