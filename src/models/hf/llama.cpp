// LlamaForCausalLM: Llama 2, 3, 3.1, 3.2 (rope_scaling of type llama3 is
// read with the shared rotary settings). Optional biases on the attention
// projections (attention_bias) and the MLP (mlp_bias), as transformers'
// LlamaConfig has them.
#include "models/hf/family.h"

namespace orchard::models {

const HfFamily& llama_family() {
  static const HfFamily family{
      "LlamaForCausalLM",
      "llama",
      [](const nlohmann::json& j, HfModelConfig& c, const std::string&) {
        c.qkv_bias = c.o_bias = j.value("attention_bias", false);
        c.mlp_bias = j.value("mlp_bias", false);
      }};
  return family;
}

} // namespace orchard::models
