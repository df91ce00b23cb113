// LoRA as a wrapper over named linear layers, for any model: a Proj is a
// linear layer y = x W^T + b that can carry adapters, and a model whose
// linear layers are Projs (AdaptableModel: the Hugging Face decoder of
// models/hf, Orchard's GPT) lists them by module path, so adapters attach
// to any of them by name and models/lora.h saves and loads them in PEFT's
// format. Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
// Models", https://arxiv.org/abs/2106.09685.
#pragma once

#include "models/language_model.h"
#include "ops/nf4.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orchard::models {

// The linear layers of a Llama-family layer, in order: q, k, v, o, gate,
// up, down (each "_proj").
const std::vector<std::string>& llama_projections();

// Which linear layers get LoRA adapters, their rank, alpha and dropout.
struct LoraSpec {
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0.0;
  bool rslora = false; // scaling alpha / sqrt(r) (Kalajdzievski 2023)
  // Module names (q_proj, ...); "q", "k", "v", "o", "gate", "up", "down"
  // are accepted for short.
  std::vector<std::string> target_modules = llama_projections();
  double scaling() const {
    return rslora ? alpha / std::sqrt(double(r)) : alpha / double(r);
  }
};

// The projection names LoRA can target; UserError for another name.
std::vector<std::string> normalize_target_modules(
    const std::vector<std::string>& names);

// A holder of one parameter named "weight" (embeddings, norms, LoRA's A
// and B), so checkpoint keys come out as "...lora_A.weight".
struct WeightImpl : torch::nn::Module {
  explicit WeightImpl(torch::Tensor w) {
    weight = register_parameter("weight", std::move(w));
  }
  torch::Tensor weight;
};
TORCH_MODULE(Weight);

// A linear layer y = x W^T + b, with an optional LoRA branch
// + scaling * B(A(dropout(x))). With a float32 base it is computed in the
// adapters' dtype (PEFT's order of operations: the input cast to the
// adapter dtype, the sum cast back); with a bfloat16/float16 base in the
// base's dtype, the adapters cast to it (as PEFT under autocast), fused
// into one addmm.
struct ProjImpl : torch::nn::Module {
  ProjImpl(torch::Tensor w, torch::Tensor b);
  torch::Tensor forward(const torch::Tensor& x);
  // A (r, in) from PEFT's default init (Kaiming-uniform, a = sqrt(5):
  // U(-1/sqrt(in), 1/sqrt(in))), B (out, r) zero, in `dtype` on the
  // weight's device; drawn from the current torch seed.
  void add_lora(
      int64_t r,
      double scaling,
      double dropout,
      torch::ScalarType dtype);
  bool has_lora() const {
    return !lora_A.is_empty();
  }
  // W + scaling * B A (the merged weight), computed in float32 at least,
  // returned in `dtype` (default: W's).
  torch::Tensor merged_weight(
      std::optional<torch::ScalarType> dtype = std::nullopt) const;
  // Folds the adapter into the weight (W := merged_weight()) and drops it,
  // for inference: an adapter then costs nothing per token. A 4-bit weight
  // keeps its adapter (its codes cannot take the sum). Returns whether it
  // merged.
  bool merge_lora();
  // Replaces the weight by its 4-bit NF4 codes (models/nf4.h): `weight`
  // becomes empty, products expand the codes as they go.
  void quantize_4bit();
  // x2 (N, in) -> (N, out): x W^T + b, from the 4-bit codes where quantised.
  torch::Tensor base(const torch::Tensor& x2) const;
  torch::Tensor full_weight() const; // W, expanded where quantised
  torch::Tensor weight, bias;
  ops::Nf4Weight q4;
  int64_t out_features = 0, in_features = 0;
  Weight lora_A{nullptr}, lora_B{nullptr};
  double scaling = 0, dropout = 0;
};
TORCH_MODULE(Proj);

// A model whose linear layers are Projs, reachable by module path.
class AdaptableModel : public LanguageModel {
 public:
  // Every projection by module path ("blocks.0.attn.c_q",
  // "model.layers.0.self_attn.q_proj").
  virtual std::vector<std::pair<std::string, Proj>> projections() const = 0;
  // Adds adapters (in `dtype`) to every projection whose own name (the
  // path's last part) is in spec.target_modules and freezes every other
  // parameter. Returns how many were added; UserError when none matched.
  virtual int64_t add_lora(const LoraSpec& spec, torch::ScalarType dtype);
  // For generation only: adapters folded into the weights where they can
  // be (ProjImpl::merge_lora). Returns how many were merged.
  int64_t prepare_inference() override;
};

} // namespace orchard::models
