// Qwen2ForCausalLM (Qwen2, Qwen2.5): Llama's decoder with biases on the q,
// k and v projections (none on o and the MLP), always.
#include "models/hf/family.h"

namespace orchard::models {

const HfFamily& qwen2_family() {
  static const HfFamily family{
      "Qwen2ForCausalLM",
      "qwen2",
      [](const nlohmann::json&, HfModelConfig& c, const std::string&) {
        c.qkv_bias = true;
      },
      llama_layer_projections};
  return family;
}

} // namespace orchard::models
