// config.json of a Hugging Face causal LM, read into HfModelConfig (both
// transformers 4.x and 5.x spellings); the family adds its own fields.
#include "models/hf/config.h"

#include "core/dtype.h"
#include "core/error.h"
#include "models/hf/family.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

namespace orchard::models {
namespace {

namespace fs = std::filesystem;

c10::ScalarType dtype_of(const std::string& name, const std::string& file) {
  if (name.empty() || name == "float32" || name == "bfloat16" ||
      name == "float16")
    return parse_dtype(name.empty() ? "float32" : name, "torch_dtype").value();
  throw UserError(
      "'" + file + "' has dtype '" + name +
      "'; Orchard reads float32, bfloat16 and float16 models.");
}

int64_t get_int(
    const nlohmann::json& j,
    const char* key,
    const std::string& file) {
  if (!j.contains(key) || !j[key].is_number_integer() ||
      j[key].get<int64_t>() <= 0)
    throw UserError(
        "'" + file + "' needs a positive integer '" + key +
        "'; is this a model folder transformers saved?");
  return j[key].get<int64_t>();
}

} // namespace

HfModelConfig read_hf_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  if (!fs::is_directory(dir))
    throw UserError(
        "model folder '" + dir +
        "' does not exist; give the folder a Hugging Face model was saved "
        "or downloaded to (config.json, *.safetensors, tokenizer.json).");
  std::ifstream in(file);
  if (!in)
    throw UserError(
        "'" + dir +
        "' has no config.json; it is not a Hugging Face model folder.");
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + file + "' is not valid JSON.");
  HfModelConfig c;
  c.raw = j;
  if (j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0].is_string())
    c.architecture = j["architectures"][0];
  c.model_type = j.value("model_type", "");
  const HfFamily* family = find_hf_family(c.architecture);
  if (!family)
    throw UserError(
        "'" + file + "' describes " +
        (c.architecture.empty() ? std::string("no architecture")
                                : "a " + c.architecture) +
        "; Orchard reads " + supported_architectures() + ".");
  const std::string act = j.value("hidden_act", "silu");
  if (act != "silu")
    throw UserError(
        "'" + file + "' uses hidden_act '" + act +
        "'; Orchard's Llama-family models use silu.");
  c.vocab_size = get_int(j, "vocab_size", file);
  c.hidden_size = get_int(j, "hidden_size", file);
  c.intermediate_size = get_int(j, "intermediate_size", file);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", file);
  c.num_attention_heads = get_int(j, "num_attention_heads", file);
  c.num_key_value_heads =
      j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
      ? get_int(j, "num_key_value_heads", file)
      : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
      ? get_int(j, "head_dim", file)
      : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = get_int(j, "max_position_embeddings", file);
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  family->read(j, c, file);
  // transformers 5 keeps rope settings in rope_parameters; 4.x in rope_theta
  // and rope_scaling ("type" in older files, "rope_type" in newer ones).
  nlohmann::json rope = nlohmann::json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    rope = j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
    rope = j["rope_scaling"];
  c.rope_theta = rope.contains("rope_theta") ? rope["rope_theta"].get<double>()
                                             : j.value("rope_theta", 10000.0);
  c.rope_type =
      rope.value("rope_type", rope.value("type", std::string("default")));
  if (c.rope_type == "llama3") {
    c.rope_factor = rope.value("factor", 8.0);
    c.low_freq_factor = rope.value("low_freq_factor", 1.0);
    c.high_freq_factor = rope.value("high_freq_factor", 4.0);
    c.original_max_position_embeddings =
        rope.value("original_max_position_embeddings", int64_t(8192));
  } else if (c.rope_type != "default") {
    throw UserError(
        "'" + file + "' uses rope scaling '" + c.rope_type +
        "'; Orchard supports the default rotary embedding and llama3 "
        "scaling.");
  }
  c.dtype = dtype_of(
      j.value("torch_dtype", j.value("dtype", std::string("float32"))), file);
  if (c.head_dim % 2 != 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    throw UserError(
        "'" + file +
        "' has an odd head_dim or num_attention_heads not divisible by "
        "num_key_value_heads; the file is damaged or not a Llama-family "
        "model.");
  return c;
}

} // namespace orchard::models
