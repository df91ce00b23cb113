// A Hugging Face model folder's config.json, as every family reads it: the
// sizes, rotary settings and dtype all Llama-style decoders share, and the
// family's own fields (models/hf/family.h) read by its entry.
#pragma once

#include <c10/core/ScalarType.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace orchard::models {

struct HfModelConfig {
  std::string architecture; // "LlamaForCausalLM"
  std::string model_type;   // "llama"
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int64_t num_hidden_layers = 0, num_attention_heads = 0;
  int64_t num_key_value_heads = 0, head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000;
  // rope_scaling: "default" or "llama3".
  std::string rope_type = "default";
  double rope_factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
  bool tie_word_embeddings = false;
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  std::optional<int64_t> sliding_window;          // Mistral v0.1's 4096
  c10::ScalarType dtype = c10::ScalarType::Float; // as stored
  nlohmann::json raw;                             // config.json as read
  // Not from config.json: hold the layers' projections in 4 bits (NF4,
  // ops/nf4.h) as they load; a LoRA base only.
  bool load_in_4bit = false;
};

// Architectures Orchard reads, for messages.
std::string supported_architectures();

// config.json of a model folder (transformers 4.x and 5.x spellings: rope
// settings in rope_theta/rope_scaling or in rope_parameters; torch_dtype or
// dtype). UserError for a missing or malformed file, an architecture not
// supported (listing those that are), an activation other than silu or
// inconsistent sizes.
HfModelConfig read_hf_config(const std::string& model_dir);

} // namespace orchard::models
