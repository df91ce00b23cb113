// The Hugging Face families Orchard reads, keyed by config.json's
// `architectures` entry. Each family is one file (hf/llama.cpp,
// hf/qwen2.cpp, hf/mistral.cpp) saying what its config.json adds to the
// fields every Llama-style decoder shares (hf/config.cpp), and how its
// model is built. Adding a family: one file and one line in family.cpp.
#pragma once

#include "models/hf/config.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace orchard::models {

struct HfFamily {
  std::string architecture; // "LlamaForCausalLM"
  std::string model_type;   // "llama"
  // Reads the family's own fields of config.json `j` into `c` (the shared
  // ones are read already); UserError naming `file` for a bad value.
  std::function<
      void(const nlohmann::json& j, HfModelConfig& c, const std::string& file)>
      read;
};

const HfFamily& llama_family();
const HfFamily& qwen2_family();
const HfFamily& mistral_family();

// Every family, and the one an architecture names (nullptr if none).
const std::vector<const HfFamily*>& hf_families();
const HfFamily* find_hf_family(const std::string& architecture);

} // namespace orchard::models
