#include "models/hf/family.h"

#include <stdexcept>

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

const HfFamily& family_of(const HfModelConfig& c) {
  if (const HfFamily* f = find_hf_family(c.architecture))
    return *f;
  throw std::invalid_argument(
      "[family_of] no family for architecture '" + c.architecture + "'");
}

std::string supported_architectures() {
  std::string s;
  for (const HfFamily* f : hf_families())
    s += (s.empty() ? "" : ", ") + f->architecture;
  return s;
}

} // namespace orchard::models
