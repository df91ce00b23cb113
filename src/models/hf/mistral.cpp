// MistralForCausalLM: Llama's decoder with a sliding attention window
// (sliding_window, 4096 in v0.1; null in later releases, which attend to
// everything) and Llama's optional biases.
#include "models/hf/family.h"

namespace orchard::models {

const HfFamily& mistral_family() {
  static const HfFamily family{
      "MistralForCausalLM",
      "mistral",
      [](const nlohmann::json& j, HfModelConfig& c, const std::string& file) {
        llama_family().read(j, c, file);
        if (j.contains("sliding_window") &&
            j["sliding_window"].is_number_integer())
          c.sliding_window = j["sliding_window"].get<int64_t>();
      },
      llama_layer_projections};
  return family;
}

} // namespace orchard::models
