// LoRA adapters in PEFT's format (Hu et al. 2021, "LoRA: Low-Rank
// Adaptation of Large Language Models", https://arxiv.org/abs/2106.09685;
// file layout from huggingface/peft's save_pretrained):
//
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha",
//                               "lora_dropout", "target_modules", "bias":
//                               "none", "task_type": "CAUSAL_LM", ...}
//   adapter_model.safetensors  base_model.model.<module>.lora_A.weight (r, in)
//                              base_model.model.<module>.lora_B.weight (out, r)
//
// The adapted layer computes W x + (alpha / r) B A x (alpha / sqrt(r) with
// use_rslora). Adapters Orchard cannot apply exactly (DoRA, fan_in_fan_out,
// per-module ranks, trained biases, modules_to_save) are refused with what
// is unsupported, never loaded approximately.
#pragma once

#include "models/hf/model.h"

#include <string>
#include <type_traits>

namespace orchard::models {

// PEFT's prefix before a module path in adapter_model.safetensors.
constexpr const char* kPeftPrefix = "base_model.model.";

// adapter_config.json of an adapter folder (UserError as described above).
LoraSpec read_adapter_config(const std::string& adapter_dir);

// Adds the adapters of `adapter_dir` to `model` and loads their weights
// (float32 unless `dtype` says otherwise). UserError when a tensor is
// missing, extra or of the wrong shape.
void load_adapter(
    AdaptableModel& model,
    const std::string& adapter_dir,
    torch::ScalarType dtype = torch::kFloat32);

// Writes the model's adapters to `dir` (created) in PEFT's format.
// `base_model` goes into base_model_name_or_path.
void save_adapter(
    const AdaptableModel& model,
    const LoraSpec& spec,
    const std::string& dir,
    const std::string& base_model);

// The adapters only, under PEFT's keys.
std::vector<std::pair<std::string, torch::Tensor>> adapter_tensors(
    const AdaptableModel& model);

// The same for a module holder (models::Llama, models::Gpt).
template <
    class Holder,
    class = std::enable_if_t<
        std::is_base_of_v<AdaptableModel, typename Holder::ContainedType>>>
void load_adapter(
    Holder& model,
    const std::string& adapter_dir,
    torch::ScalarType dtype = torch::kFloat32) {
  load_adapter(*model, adapter_dir, dtype);
}
template <
    class Holder,
    class = std::enable_if_t<
        std::is_base_of_v<AdaptableModel, typename Holder::ContainedType>>>
void save_adapter(
    const Holder& model,
    const LoraSpec& spec,
    const std::string& dir,
    const std::string& base_model) {
  save_adapter(*model, spec, dir, base_model);
}
template <
    class Holder,
    class = std::enable_if_t<
        std::is_base_of_v<AdaptableModel, typename Holder::ContainedType>>>
std::vector<std::pair<std::string, torch::Tensor>> adapter_tensors(
    const Holder& model) {
  return adapter_tensors(*model);
}

// Writes a full model folder: the weights with adapters folded in
// (model.safetensors, in the model's dtype), config.json, and the
// tokenizer and generation files copied from `base_dir`.
void write_merged_model(
    const Llama& model,
    const std::string& base_dir,
    const std::string& out_dir);

} // namespace orchard::models
