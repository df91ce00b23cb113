#include "models/lora.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json.h"
#include "core/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

namespace orchard::models {

const std::vector<std::string>& llama_projections() {
  static const std::vector<std::string> all = {
      "q_proj",
      "k_proj",
      "v_proj",
      "o_proj",
      "gate_proj",
      "up_proj",
      "down_proj"};
  return all;
}

std::vector<std::string> normalize_target_modules(
    const std::vector<std::string>& names) {
  const std::vector<std::string>& all = llama_projections();
  std::vector<std::string> out;
  for (auto n : names) {
    if (n == "all-linear" || n == "all_linear") {
      out = all;
      continue;
    }
    if (n.find("_proj") == std::string::npos)
      n += "_proj";
    if (std::find(all.begin(), all.end(), n) == all.end())
      throw UserError(
          "lora.target_modules names '" + n +
          "'; the Llama-family projections are q_proj, k_proj, v_proj, "
          "o_proj, gate_proj, up_proj and down_proj (or q, k, v, o, gate, "
          "up, down, all-linear).");
    if (std::find(out.begin(), out.end(), n) == out.end())
      out.push_back(n);
  }
  if (out.empty())
    throw UserError(
        "lora.target_modules is empty; name at least one projection.");
  return out;
}

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw UserError("cannot read '" + file + "'.");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  auto j = json_nesting(text) > kMaxJsonDepth
      ? nlohmann::json(nlohmann::json::value_t::discarded)
      : nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + file + "' is not valid JSON.");
  return j;
}

bool set_and_not_empty(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null())
    return false;
  const auto& v = j[key];
  return !(v.is_object() || v.is_array() || v.is_string()) || !v.empty();
}

// adapter_config.json's fields; nlohmann::json::exception for a value of
// the wrong type.
LoraSpec adapter_spec(const nlohmann::json& j, const std::string& file) {
  if (j.value("peft_type", "") != "LORA")
    throw UserError(
        "'" + file + "' is a " + j.value("peft_type", std::string("?")) +
        " adapter; Orchard reads LoRA adapters (peft_type LORA).");
  auto refuse = [&](const std::string& what) {
    throw UserError(
        "'" + file + "' uses " + what +
        ", which Orchard does not apply; merge the adapter with PEFT "
        "(merge_and_unload) and load the merged model instead.");
  };
  if (j.value("use_dora", false))
    refuse("DoRA (use_dora)");
  if (j.value("fan_in_fan_out", false))
    refuse("fan_in_fan_out");
  if (j.value("bias", std::string("none")) != "none")
    refuse("trained biases (bias != none)");
  for (const char* k :
       {"rank_pattern",
        "alpha_pattern",
        "modules_to_save",
        "layers_to_transform",
        "target_parameters"})
    if (set_and_not_empty(j, k))
      refuse(k);
  LoraSpec s;
  if (!j.contains("r") || !j["r"].is_number_integer() ||
      j["r"].get<int64_t>() < 1)
    throw UserError("'" + file + "' needs a positive integer 'r'.");
  s.r = j["r"];
  s.alpha = j.value("lora_alpha", double(s.r));
  s.dropout = j.value("lora_dropout", 0.0);
  s.rslora = j.value("use_rslora", false);
  static const nlohmann::json kMissing; // a temporary would copy the value
  const auto& t = j.contains("target_modules") ? j["target_modules"] : kMissing;
  if (t.is_array()) {
    s.target_modules.clear();
    for (const auto& m : t)
      s.target_modules.push_back(m.get<std::string>());
  } else if (t.is_string() && t.get<std::string>() == "all-linear") {
    s.target_modules = {"all-linear"};
  } else {
    refuse(
        "a target_modules pattern (only a list of module names or "
        "all-linear is read)");
  }
  s.target_modules = normalize_target_modules(s.target_modules);
  return s;
}

} // namespace

LoraSpec read_adapter_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "adapter_config.json").string();
  if (!fs::exists(file))
    throw UserError(
        "'" + dir +
        "' has no adapter_config.json; give a folder PEFT or Orchard saved "
        "an adapter to.");
  auto j = read_json(file);
  try {
    return adapter_spec(j, file);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(
        "'" + file + "' has a value of the wrong type (" + e.what() +
        "); compare it with an adapter_config.json PEFT writes.");
  }
}

std::vector<std::pair<std::string, torch::Tensor>> adapter_tensors(
    const AdaptableModel& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, p] : model.projections()) {
    if (!p->has_lora())
      continue;
    out.push_back({kPeftPrefix + name + ".lora_A.weight", p->lora_A->weight});
    out.push_back({kPeftPrefix + name + ".lora_B.weight", p->lora_B->weight});
  }
  return out;
}

void load_adapter(
    AdaptableModel& model,
    const std::string& dir,
    torch::ScalarType dtype) {
  LoraSpec spec = read_adapter_config(dir);
  const std::string file =
      (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(file))
    throw UserError(
        "'" + dir +
        "' has no adapter_model.safetensors (adapter_model.bin, "
        "PyTorch's pickle format, is not read: save with "
        "safe_serialization=True).");
  auto f = safetensors::File::open(file);
  f.verify_checksum();
  model.add_lora(spec, dtype);
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& [key, tensor] : adapter_tensors(model)) {
    // Older PEFT versions kept the adapter name in saved keys.
    std::string k = key;
    if (!f.contains(k)) {
      std::string alt = k;
      alt.insert(alt.rfind(".weight"), ".default");
      if (f.contains(alt))
        k = alt;
    }
    if (!f.contains(k))
      throw UserError(
          "adapter '" + file + "' lacks '" + key +
          "', which its adapter_config.json (target_modules) implies; the "
          "adapter was made for another model or is incomplete.");
    auto t = f.get(k);
    if (t.sizes() != tensor.sizes())
      throw UserError(
          "adapter tensor '" + k + "' has shape " + c10::str(t.sizes()) +
          " but this model needs " + c10::str(tensor.sizes()) +
          "; the adapter was made for another model.");
    tensor.copy_(t);
    used.insert(k);
  }
  for (const auto& info : f.tensors())
    if (!used.count(info.name))
      throw UserError(
          "adapter '" + file + "' holds '" + info.name +
          "', which does not match a LoRA layer of this model; the "
          "adapter was made for another model.");
}

void save_adapter(
    const AdaptableModel& model,
    const LoraSpec& spec,
    const std::string& dir,
    const std::string& base_model) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [k, t] : adapter_tensors(model))
    tensors.push_back({k, t.detach()});
  // target_modules: the adapted modules' own names, in the model's order
  // (what PEFT writes), whatever the spec's spelling ("q" for q_proj).
  std::vector<std::string> targets;
  for (const auto& [name, p] : model.projections()) {
    const std::string leaf = name.substr(name.rfind('.') + 1);
    if (p->has_lora() &&
        std::find(targets.begin(), targets.end(), leaf) == targets.end())
      targets.push_back(leaf);
  }
  safetensors::save(
      (fs::path(dir) / "adapter_model.safetensors").string(),
      tensors,
      {{"format", "pt"}},
      /*with_checksum=*/true);
  nlohmann::json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", spec.r},
      {"lora_alpha", spec.alpha},
      {"lora_dropout", spec.dropout},
      {"target_modules", targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", spec.rslora},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"revision", nullptr},
  };
  atomic_write(
      (fs::path(dir) / "adapter_config.json").string(), j.dump(2) + "\n");
}

void write_merged_model(
    const Llama& model,
    const std::string& base_dir,
    const std::string& final_dir) {
  // The folder is written whole under <out>.partial and renamed into place
  // at the end: a merge killed part way leaves only the .partial folder,
  // which the next merge replaces, never a folder that looks finished.
  std::string final_name = fs::path(final_dir).lexically_normal().string();
  while (final_name.size() > 1 && final_name.back() == '/')
    final_name.pop_back();
  const std::string out_dir = final_name + ".partial";
  remove_tree(out_dir);
  fs::create_directories(out_dir);
  auto state = model->merged_state();
  safetensors::save(
      (fs::path(out_dir) / "model.safetensors").string(),
      state,
      {{"format", "pt"}});
  nlohmann::json config = model->config.raw;
  const std::string dtype = dtype_name(model->config.dtype);
  if (config.contains("dtype"))
    config["dtype"] = dtype;
  else
    config["torch_dtype"] = dtype;
  atomic_write(
      (fs::path(out_dir) / "config.json").string(), config.dump(2) + "\n");
  for (const char* name :
       {"tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "chat_template.jinja",
        "tokenizer.model"}) {
    fs::path from = fs::path(base_dir) / name;
    if (fs::exists(from))
      fs::copy_file(
          from, fs::path(out_dir) / name, fs::copy_options::overwrite_existing);
  }
  // --force over an existing folder: the old one goes only once the new one
  // is complete.
  const std::string old = final_name + ".replaced";
  remove_tree(old);
  if (fs::exists(final_name) && ::rename(final_name.c_str(), old.c_str()) != 0)
    throw UserError(
        "cannot replace " + final_name + ": " + std::strerror(errno) +
        "; the merged model is complete in " + out_dir + ".");
  if (::rename(out_dir.c_str(), final_name.c_str()) != 0)
    throw UserError(
        "cannot move " + out_dir + " to " + final_name + ": " +
        std::strerror(errno) + "; the merged model is complete there.");
  remove_tree(old);
}

} // namespace orchard::models
