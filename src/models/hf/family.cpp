#include "models/hf/family.h"

namespace orchard::models {

const std::vector<const HfFamily*>& hf_families() {
  static const std::vector<const HfFamily*> all = {
      &llama_family(), &qwen2_family(), &mistral_family()};
  return all;
}

const HfFamily* find_hf_family(const std::string& architecture) {
  for (const HfFamily* f : hf_families())
    if (f->architecture == architecture)
      return f;
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const HfFamily* f : hf_families())
    s += (s.empty() ? "" : ", ") + f->architecture;
  return s;
}

} // namespace orchard::models
