// A fixture written by a tests/reference/*.py script: initial weights in
// one safetensors file, the reference's inputs and outputs in another with
// the sizes and settings as JSON under the metadata key "config".
#pragma once
#include "core/safetensors.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace orchard::test {

struct ReferenceFixture {
  nlohmann::json config;
  std::map<std::string, torch::Tensor> weights, tensors;
  const torch::Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw std::invalid_argument(
          "the reference fixture has no tensor " + name);
    return it->second;
  }
};

inline ReferenceFixture load_reference_fixture(
    const std::string& model_path,
    const std::string& reference_path) {
  ReferenceFixture r;
  r.weights = safetensors::load(model_path);
  r.tensors = safetensors::load(reference_path);
  r.config = nlohmann::json::parse(
      safetensors::File::open(reference_path).metadata().at("config"));
  return r;
}

// max |a - b| / max(1, max |b|): relative to the tensor's scale, absolute
// below 1.
inline double scaled_diff(const torch::Tensor& a, const torch::Tensor& b) {
  auto want = b.to(torch::kFloat64);
  const double scale = std::max(1.0, want.abs().max().item<double>());
  return (a.to(torch::kFloat64) - want).abs().max().item<double>() / scale;
}

} // namespace orchard::test
