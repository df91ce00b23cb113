#include "export/hf_gguf.h"

#include "core/error.h"
#include "export/gguf_file.h"
#include "export/gguf_vocab.h"
#include "models/hf/model.h"
#include "models/lora.h"
#include "runs/load.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

namespace orchard::gguf {

namespace fs = std::filesystem;

namespace {

// llama_ftype's numbers (general.file_type).
enum FileType : uint32_t {
  kMostlyF16 = 1,
  kMostlyQ4_0 = 2,
  kMostlyQ8_0 = 7,
  kMostlyQ4_K_M = 15,
  kMostlyBF16 = 32,
};
constexpr uint32_t kQuantizationVersion = 2; // ggml's QNT_VERSION

struct TypeChoice {
  std::string name;
  FileType file_type;
  TensorType base; // the matrices' type
  bool quantized;
};

TypeChoice parse_type(const std::string& t) {
  if (t == "f16")
    return {t, kMostlyF16, TensorType::F16, false};
  if (t == "bf16")
    return {t, kMostlyBF16, TensorType::BF16, false};
  if (t == "q8_0")
    return {t, kMostlyQ8_0, TensorType::Q8_0, true};
  if (t == "q4_0")
    return {t, kMostlyQ4_0, TensorType::Q4_0, true};
  if (t == "q4_K_M" || t == "q4_k_m")
    return {"q4_K_M", kMostlyQ4_K_M, TensorType::Q4_K, true};
  std::string all;
  for (const auto& n : export_types())
    all += (all.empty() ? "" : ", ") + n;
  throw UserError(
      "--type " + t + " is not one Orchard writes; choose " + all + ".");
}

// Checkpoint key -> llama.cpp tensor name; layer index in `layer` (-1 when
// none). Empty for a key llama.cpp has no tensor for.
std::string gguf_name(const std::string& key, int64_t& layer) {
  static const std::map<std::string, std::string> kTop = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  layer = -1;
  if (auto it = kTop.find(key); it != kTop.end())
    return it->second;
  const std::string prefix = "model.layers.";
  if (key.rfind(prefix, 0) != 0)
    return "";
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos)
    return "";
  layer = std::stoll(key.substr(prefix.size(), dot - prefix.size()));
  auto it = kLayer.find(key.substr(dot + 1));
  if (it == kLayer.end())
    return "";
  return "blk." + std::to_string(layer) + "." + it->second;
}

// transformers' rotary pairs value i with i + D/2 in each head; llama.cpp's
// (arch llama) pairs 2i with 2i+1. Rows (H*D, ...) of q or k: per head,
// row i of the first half goes to 2i and row i of the second half to 2i+1.
torch::Tensor permute_rotary(const torch::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0);
  auto sizes = w.sizes().vec();
  std::vector<int64_t> split = {heads, 2, rows / heads / 2};
  split.insert(split.end(), sizes.begin() + 1, sizes.end());
  return w.reshape(split).transpose(1, 2).reshape(sizes).contiguous();
}

// llama.cpp's choice of which layers get more bits in the *_M mixes: the
// first and last eighth, and every third in between.
bool use_more_bits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The model's tensors under their checkpoint keys, each made on demand: a
// projection with an adapter is merged then, in float32 (rounding it to
// the base's bfloat16 first would lose bits an f16 file keeps); the others
// are the loaded tensors themselves (views of the mapped file).
using TensorOf = std::function<torch::Tensor()>;
std::vector<std::pair<std::string, TensorOf>> checkpoint_tensors(
    const models::LlamaImpl& model) {
  std::map<std::string, models::Proj> projs;
  for (auto& [name, p] : model.projections())
    projs.emplace(name, p);
  std::vector<std::pair<std::string, TensorOf>> out;
  for (const auto& named : model.named_parameters()) {
    const std::string& key = named.key();
    if (key.find(".lora_") != std::string::npos)
      continue;
    auto it = projs.find(key.substr(0, key.rfind('.')));
    if (it != projs.end() && it->second->has_lora() &&
        key.ends_with(".weight")) {
      models::Proj p = it->second;
      out.push_back({key, [p] { return p->merged_weight(torch::kFloat32); }});
    } else {
      torch::Tensor t = named.value().detach();
      out.push_back({key, [t] { return t; }});
    }
  }
  return out;
}

// "runs/full/mine/" -> "mine".
std::string folder_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty())
    p = p.parent_path();
  return p.filename().string();
}

} // namespace

const std::vector<std::string>& export_types() {
  static const std::vector<std::string> kTypes = {
      "f16", "bf16", "q8_0", "q4_0", "q4_K_M"};
  return kTypes;
}

bool is_orchard_run(const std::string& dir) {
  return fs::is_directory(fs::path(dir) / "checkpoints") ||
      (fs::exists(fs::path(dir) / "state.json") &&
       fs::exists(fs::path(dir) / "model.safetensors") &&
       !fs::exists(fs::path(dir) / "config.json"));
}

ExportReport export_gguf(const ExportOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  auto log = [&](const std::string& line) {
    if (opt.log)
      opt.log(line);
  };
  const TypeChoice type = parse_type(opt.type);
  // A stage=full run keeps its result in model/, a model folder.
  std::string model_dir = opt.model_dir;
  if (!fs::exists(fs::path(model_dir) / "config.json") &&
      fs::exists(fs::path(model_dir) / "model" / "config.json")) {
    model_dir = (fs::path(model_dir) / "model").string();
    log("Using " + model_dir + ", the run's model folder");
  }
  if (is_orchard_run(model_dir))
    throw UserError(
        "'" + model_dir +
        "' is an Orchard run: its GPT (ReLU² MLP, QK-norm, logit soft-cap) "
        "has no llama.cpp architecture, so it cannot become a GGUF that "
        "llama.cpp would run correctly. Export it as safetensors with "
        "Orchard's config instead: orchard export hf --checkpoint " +
        model_dir + " --out DIR (docs/export.md).");
  if (!fs::exists(fs::path(model_dir) / "config.json"))
    throw UserError(
        "'" + model_dir +
        "' has no config.json: --model takes a Hugging Face model folder "
        "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).");
  const std::string out_ext = fs::path(opt.out).extension().string();
  if (out_ext != ".gguf")
    throw UserError(
        "--out " + opt.out +
        " should end in .gguf (llama.cpp and Ollama "
        "look for that name).");

  models::LoadOptions load;
  load.context = 1;        // no rotary tables needed
  load.map_weights = true; // each tensor is read once, from the file
  log("Reading " + model_dir);
  models::Llama model = models::load_hf_model(model_dir, load);
  if (!opt.adapter.empty()) {
    const std::string adapter = runs::adapter_folder(opt.adapter);
    log("Merging the adapter " + adapter);
    models::load_adapter(model, adapter, torch::kFloat32);
  }
  const models::HfModelConfig& c = model->config;
  const bool qwen2 = c.model_type == "qwen2";
  const std::string arch = qwen2 ? "qwen2" : "llama";
  if (!qwen2 && c.model_type != "llama" && c.model_type != "mistral")
    throw UserError(
        "model_type '" + c.model_type +
        "' has no GGUF mapping in Orchard (llama, mistral, qwen2).");
  if (qwen2 && c.rope_type != "default")
    throw UserError(
        "a Qwen2 model with rope scaling '" + c.rope_type +
        "' is not exported: llama.cpp's qwen2 reads no rope_freqs.");

  Metadata meta;
  meta.add_string("general.architecture", arch);
  meta.add_string("general.name", folder_name(opt.model_dir));
  meta.add_u32("general.file_type", type.file_type);
  if (type.quantized)
    meta.add_u32("general.quantization_version", kQuantizationVersion);
  meta.add_u32("general.alignment", kAlignment);
  auto key = [&](const std::string& k) { return arch + "." + k; };
  meta.add_u32(
      key("context_length"), static_cast<uint32_t>(c.max_position_embeddings));
  meta.add_u32(key("embedding_length"), static_cast<uint32_t>(c.hidden_size));
  meta.add_u32(key("block_count"), static_cast<uint32_t>(c.num_hidden_layers));
  meta.add_u32(
      key("feed_forward_length"), static_cast<uint32_t>(c.intermediate_size));
  meta.add_u32(
      key("attention.head_count"),
      static_cast<uint32_t>(c.num_attention_heads));
  meta.add_u32(
      key("attention.head_count_kv"),
      static_cast<uint32_t>(c.num_key_value_heads));
  meta.add_f32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
  meta.add_f32(
      key("attention.layer_norm_rms_epsilon"),
      static_cast<float>(c.rms_norm_eps));
  meta.add_u32(key("rope.dimension_count"), static_cast<uint32_t>(c.head_dim));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    meta.add_u32(
        key("attention.key_length"), static_cast<uint32_t>(c.head_dim));
    meta.add_u32(
        key("attention.value_length"), static_cast<uint32_t>(c.head_dim));
  }
  meta.add_u32(key("vocab_size"), static_cast<uint32_t>(c.vocab_size));
  const VocabSummary vocab = add_vocab(model_dir, c.vocab_size, meta);

  ExportReport report;
  report.arch = arch;
  report.type = type.name;
  report.tokenizer = vocab.model + " (" +
      (vocab.model == "gpt2" ? "pre " + vocab.pre
                             : "scores from " + vocab.scores_from) +
      ")";
  report.chat_template = vocab.has_template;
  report.chat_template_text = vocab.chat_template;
  report.end_of_turn = vocab.end_of_turn;
  report.bos = vocab.bos;
  if (c.sliding_window && *c.sliding_window < c.max_position_embeddings)
    report.notes.push_back(
        "sliding_window " + std::to_string(*c.sliding_window) +
        ": llama.cpp's " + arch +
        " attends to the whole context, so its output agrees with Orchard's "
        "and transformers' only while prompt and reply fit in " +
        std::to_string(*c.sliding_window) + " tokens");

  // The tensors, in checkpoint order; each is produced, converted and
  // dropped when the writer reaches it, so the model is never held twice.
  const auto state = checkpoint_tensors(*model);
  const bool tied = !model->lm_head;
  std::vector<TensorEntry> entries;
  if (c.rope_type == "llama3") {
    // One divisor per rotary frequency (llama.cpp's rope_freqs): the plain
    // frequencies over the scaled ones.
    models::HfModelConfig plain = c;
    plain.rope_type = "default";
    torch::Tensor factors =
        (models::rope_inv_freq(plain) / models::rope_inv_freq(c)).contiguous();
    entries.push_back(
        {"rope_freqs.weight", {factors.size(0)}, TensorType::F32, [factors] {
           return encode(factors, TensorType::F32);
         }});
  }
  for (const auto& [ckpt_key, tensor_of] : state) {
    const torch::Tensor tensor = tensor_of();
    int64_t layer = -1;
    const std::string name = gguf_name(ckpt_key, layer);
    if (name.empty())
      throw UserError(
          "the checkpoint tensor '" + ckpt_key +
          "' has no llama.cpp counterpart; this model cannot be exported.");
    std::vector<int64_t> shape = tensor.sizes().vec();
    TensorType t = type.base;
    const bool output_role =
        name == "output.weight" || (tied && name == "token_embd.weight");
    if (shape.size() < 2) {
      t = TensorType::F32; // norms and biases, as llama.cpp keeps them
    } else if (type.name == "q4_0" && output_role) {
      t = TensorType::Q6_K;
    } else if (type.name == "q4_K_M") {
      const bool more = layer >= 0 &&
          use_more_bits(layer, c.num_hidden_layers) &&
          (name.ends_with("attn_v.weight") ||
           name.ends_with("ffn_down.weight"));
      if (output_role || more)
        t = TensorType::Q6_K;
    }
    // k-quants need rows of 256: fall back as llama-quantize does.
    const int64_t row = shape.back();
    if ((t == TensorType::Q4_K || t == TensorType::Q6_K) && row % 256 != 0) {
      const TensorType to =
          t == TensorType::Q4_K ? TensorType::Q5_0 : TensorType::Q8_0;
      report.fallbacks.push_back(
          name + ": " + traits(t).name + " -> " + traits(to).name +
          " (rows of " + std::to_string(row) +
          " values, not a multiple of 256)");
      t = to;
    }
    if (row % traits(t).block != 0)
      throw UserError(
          "--type " + type.name + ": " + name + " has rows of " +
          std::to_string(row) + " values, and " + traits(t).name +
          " packs blocks of " + std::to_string(traits(t).block) +
          "; llama.cpp has no such layout. Export with --type f16 or bf16.");
    report.types.push_back({ckpt_key, t});
    int64_t permute_heads = 0;
    if (!qwen2 && opt.permute_rotary) {
      if (name.ends_with("attn_q.weight") || name.ends_with("attn_q.bias"))
        permute_heads = c.num_attention_heads;
      else if (name.ends_with("attn_k.weight") || name.ends_with("attn_k.bias"))
        permute_heads = c.num_key_value_heads;
    }
    entries.push_back({name, shape, t, [tensor_of, t, permute_heads] {
                         torch::Tensor w = tensor_of();
                         if (permute_heads > 0)
                           w = permute_rotary(w, permute_heads);
                         return encode(w, t);
                       }});
  }
  report.parameters = 0;
  for (const auto& e : entries) {
    int64_t n = 1;
    for (int64_t d : e.shape)
      n *= d;
    report.parameters += n;
  }
  report.tensors = static_cast<int64_t>(entries.size());
  // Fallbacks, one line for each kind.
  std::map<std::string, int> kinds;
  for (const auto& f : report.fallbacks)
    ++kinds[f.substr(f.find(": ") + 2)];
  for (const auto& [what, n] : kinds)
    log("  " + std::to_string(n) + (n == 1 ? " tensor: " : " tensors: ") +
        what);
  for (const auto& n : report.notes)
    log("Note: " + n);
  log("Writing " + std::to_string(entries.size()) + " tensors (" + arch + ", " +
      type.name + ") to " + opt.out);
  const size_t every = std::max<size_t>(1, entries.size() / 10);
  report.bytes = write_file(
      opt.out,
      meta,
      entries,
      [&](size_t i, const TensorEntry& e, int64_t bytes) {
        if ((i + 1) % every == 0 || i + 1 == entries.size()) {
          char line[256];
          std::snprintf(
              line,
              sizeof line,
              "  [%3zu/%zu] %-28s %-5s %8.1f MiB",
              i + 1,
              entries.size(),
              e.name.c_str(),
              traits(e.type).name,
              static_cast<double>(bytes) / (1 << 20));
          log(line);
        }
      });
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return report;
}

} // namespace orchard::gguf
