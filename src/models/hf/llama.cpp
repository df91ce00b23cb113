// LlamaForCausalLM: Llama 2, 3, 3.1, 3.2 (rope_scaling of type llama3 is
// read with the shared rotary settings). Optional biases on the attention
// projections (attention_bias) and the MLP (mlp_bias), as transformers'
// LlamaConfig has them.
#include "models/hf/family.h"

namespace orchard::models {

std::vector<ProjectionShape> llama_layer_projections(const HfModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  return {
      {"q_proj", C, q},
      {"k_proj", C, kv},
      {"v_proj", C, kv},
      {"o_proj", q, C},
      {"gate_proj", C, I},
      {"up_proj", C, I},
      {"down_proj", I, C}};
}

const HfFamily& llama_family() {
  static const HfFamily family{
      "LlamaForCausalLM",
      "llama",
      [](const nlohmann::json& j, HfModelConfig& c, const std::string&) {
        c.qkv_bias = c.o_bias = j.value("attention_bias", false);
        c.mlp_bias = j.value("mlp_bias", false);
      },
      llama_layer_projections};
  return family;
}

} // namespace orchard::models
