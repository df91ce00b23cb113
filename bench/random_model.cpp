// A Hugging Face model folder with random weights in a real model's shape,
// for the benchmarks that need one on a machine without transformers:
//   orchard_bench_random_model SHAPE OUT_DIR [TOKENIZER]
// SHAPE: llama-3.2-3b | qwen2.5-0.5b (their config.json values; the
// vocabulary is the tokenizer's). TOKENIZER: a folder or file
// text::load_tokenizer reads (default: Llama 3's tiktoken fixture), written
// into the folder as tokenizer.json, so `orchard generate` can decode
// whatever the random model picks. Weights are bfloat16, as the real
// checkpoints ship, drawn N(0, 1/fan_in) so activations stay in range.
#include "core/safetensors.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer_io.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Shape {
  const char* name;
  const char* model_type;
  int64_t C, I, L, H, Hkv;
  double rope_theta, eps;
  bool tied, bias;
  int64_t context;
};

// From the models' own config.json files.
constexpr Shape kShapes[] = {
    {"llama-3.2-3b",
     "llama",
     3072,
     8192,
     28,
     24,
     8,
     500000.0,
     1e-5,
     true,
     false,
     131072},
    {"qwen2.5-0.5b",
     "qwen2",
     896,
     4864,
     24,
     14,
     2,
     1000000.0,
     1e-6,
     true,
     true,
     32768},
};

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: %s llama-3.2-3b|qwen2.5-0.5b OUT_DIR [TOKENIZER]\n",
        argv[0]);
    return 2;
  }
  const Shape* s = nullptr;
  for (const auto& k : kShapes)
    if (std::string(argv[1]) == k.name)
      s = &k;
  if (!s) {
    std::fprintf(stderr, "unknown shape %s\n", argv[1]);
    return 2;
  }
  const fs::path out(argv[2]);
  const std::string tok_path = argc > 3
      ? argv[3]
      : std::string(ORCHARD_SOURCE_DIR) + "/tests/fixtures/tokenizers/llama3";
  fs::create_directories(out);
  const orchard::text::Tokenizer tok = orchard::text::load_tokenizer(tok_path);
  orchard::text::save_hf_tokenizer(tok, (out / "tokenizer.json").string());
  const int64_t V = static_cast<int64_t>(tok.vocab_size());
  const int64_t D = s->C / s->H;
  json cfg = {
      {"architectures",
       {std::string(s->model_type) == "qwen2" ? "Qwen2ForCausalLM"
                                              : "LlamaForCausalLM"}},
      {"model_type", s->model_type},
      {"hidden_size", s->C},
      {"intermediate_size", s->I},
      {"num_hidden_layers", s->L},
      {"num_attention_heads", s->H},
      {"num_key_value_heads", s->Hkv},
      {"head_dim", D},
      {"vocab_size", V},
      {"max_position_embeddings", s->context},
      {"rope_theta", s->rope_theta},
      {"rms_norm_eps", s->eps},
      {"tie_word_embeddings", s->tied},
      {"hidden_act", "silu"},
      {"torch_dtype", "bfloat16"},
  };
  std::ofstream(out / "config.json") << cfg.dump(2);
  torch::manual_seed(0);
  auto mat = [](int64_t rows, int64_t cols) {
    return (torch::randn({rows, cols}) / std::sqrt(static_cast<double>(cols)))
        .to(torch::kBFloat16);
  };
  std::vector<std::pair<std::string, torch::Tensor>> w;
  w.push_back({"model.embed_tokens.weight", mat(V, s->C)});
  for (int64_t l = 0; l < s->L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.push_back(
        {p + "input_layernorm.weight", torch::ones({s->C}, torch::kBFloat16)});
    w.push_back(
        {p + "post_attention_layernorm.weight",
         torch::ones({s->C}, torch::kBFloat16)});
    w.push_back({p + "self_attn.q_proj.weight", mat(s->H * D, s->C)});
    w.push_back({p + "self_attn.k_proj.weight", mat(s->Hkv * D, s->C)});
    w.push_back({p + "self_attn.v_proj.weight", mat(s->Hkv * D, s->C)});
    w.push_back({p + "self_attn.o_proj.weight", mat(s->C, s->H * D)});
    if (s->bias)
      for (const char* b : {"q", "k", "v"})
        w.push_back(
            {p + "self_attn." + b + "_proj.bias",
             torch::zeros(
                 {(b[0] == 'q' ? s->H : s->Hkv) * D}, torch::kBFloat16)});
    w.push_back({p + "mlp.gate_proj.weight", mat(s->I, s->C)});
    w.push_back({p + "mlp.up_proj.weight", mat(s->I, s->C)});
    w.push_back({p + "mlp.down_proj.weight", mat(s->C, s->I)});
  }
  w.push_back({"model.norm.weight", torch::ones({s->C}, torch::kBFloat16)});
  if (!s->tied)
    w.push_back({"lm_head.weight", mat(V, s->C)});
  int64_t n = 0;
  for (const auto& [k, t] : w)
    n += t.numel();
  orchard::safetensors::save(
      (out / "model.safetensors").string(), w, {{"format", "pt"}});
  std::printf(
      "%s: %s shape, %.3f B parameters, vocabulary %lld\n",
      out.c_str(),
      s->name,
      static_cast<double>(n) / 1e9,
      static_cast<long long>(V));
  return 0;
}
