// The Hugging Face families Orchard reads, keyed by config.json's
// `architectures` entry. Each family is one file (hf/llama.cpp,
// hf/qwen2.cpp, hf/mistral.cpp) saying what its config.json adds to the
// fields every Llama-style decoder shares (hf/config.cpp), and how its
// model is built. Adding a family: one file and one line in family.cpp.
#pragma once

#include "models/hf/config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::models {

// One linear projection of a decoder layer: its own module name and sizes.
struct ProjectionShape {
  std::string name; // "q_proj"
  int64_t in = 0, out = 0;
};

struct HfFamily {
  std::string architecture; // "LlamaForCausalLM"
  std::string model_type;   // "llama"
  // Reads the family's own fields of config.json `j` into `c` (the shared
  // ones are read already); UserError naming `file` for a bad value.
  std::function<
      void(const nlohmann::json& j, HfModelConfig& c, const std::string& file)>
      read;
  // The linear projections of one layer, from the config alone: what the
  // memory estimate counts (weights, 4-bit codes, LoRA adapters).
  std::function<std::vector<ProjectionShape>(const HfModelConfig& c)>
      layer_projections;
};

// Llama's seven (q, k, v, o, gate, up, down), which Qwen2 and Mistral share.
std::vector<ProjectionShape> llama_layer_projections(const HfModelConfig& c);

const HfFamily& llama_family();
const HfFamily& qwen2_family();
const HfFamily& mistral_family();

// Every family, and the one an architecture names (nullptr if none).
const std::vector<const HfFamily*>& hf_families();
const HfFamily* find_hf_family(const std::string& architecture);
// The family of a config read by read_hf_config (std::invalid_argument for
// one that did not come from there).
const HfFamily& family_of(const HfModelConfig& c);

} // namespace orchard::models
