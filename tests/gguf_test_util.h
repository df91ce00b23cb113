// Helpers for the tests of `orchard export gguf`: llama.cpp as the judge
// (node-llama-cpp's prebuilt CPU build, which ./orchard.sh test installs
// into build/llama-judge; tests/gguf/llama_judge.mjs says what it reports),
// small random models of the fixtures' architectures, and the comparisons
// of llama.cpp's logits with Orchard's.
#pragma once

#include "core/safetensors.h"
#include "export/hf_gguf.h"
#include "models/hf/model.h"
#include "models/lora.h"
#include "test_util.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace orchard::test {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline std::string judge_dir() {
  return (fs::path(ORCHARD_BIN).parent_path() / "llama-judge").string();
}

// Why llama.cpp cannot judge here ("" when it can).
inline std::string judge_problem() {
  FILE* p = ::popen("node --version 2>/dev/null", "r");
  char buf[64] = {0};
  const bool read = p && std::fgets(buf, sizeof buf, p) != nullptr;
  if (p)
    ::pclose(p);
  if (!read || buf[0] != 'v')
    return "Node.js is not installed (./orchard.sh test installs the "
           "llama.cpp judge with it)";
  if (std::atoi(buf + 1) < 20)
    return std::string("node-llama-cpp needs Node.js 20 or newer, found ") +
        buf;
  if (!fs::exists(
          fs::path(judge_dir()) / "node_modules/node-llama-cpp/package.json"))
    return "llama.cpp (node-llama-cpp) is not installed in " + judge_dir() +
        "; run ./orchard.sh test, which installs it from npm";
  return "";
}

#define REQUIRE_JUDGE()                           \
  do {                                            \
    if (auto why = judge_problem(); !why.empty()) \
      GTEST_SKIP() << "SKIPPED: " << why;         \
  } while (0)

inline json run_judge(const json& request) {
  TempDir tmp;
  const std::string req = tmp.write("request.json", request.dump());
  const std::string res = tmp.file("result.json");
  // The script resolves its imports from its own folder: it runs from the
  // judge's.
  const std::string script =
      (fs::path(judge_dir()) / "llama_judge.mjs").string();
  fs::copy_file(
      fs::path(ORCHARD_SOURCE_DIR) / "tests/gguf/llama_judge.mjs",
      script,
      fs::copy_options::overwrite_existing);
  const std::string cmd = "node " + test::shell_quote(script) + " " +
      test::shell_quote(req) + " " + test::shell_quote(res) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0 || !fs::exists(res))
    throw std::runtime_error("the llama.cpp judge failed:\n" + out);
  return json::parse(test::read_text(res));
}

inline json read_json(const fs::path& p) {
  return json::parse(test::read_text(p.string()));
}

// How much each layer adds to the residual stream. At 1 the random
// network is chaotic (a relative error in any weight grows about eightfold
// by the logits), unlike a trained model; the tests use a calmer one.
inline constexpr double kBranchScale = 0.3;

// A model folder with `fixture`'s config (resized to width `C`, MLP `I`)
// and tokenizer files, and random weights.
inline void write_random_model(
    const std::string& fixture,
    const std::string& out,
    int64_t C,
    int64_t I,
    uint64_t seed,
    double branch_scale = kBranchScale) {
  const fs::path from = fs::path(ORCHARD_FIXTURES) / "hf" / fixture;
  fs::create_directories(out);
  json cfg = read_json(from / "config.json");
  const int64_t H = cfg["num_attention_heads"], L = cfg["num_hidden_layers"];
  const int64_t Hkv = cfg.value("num_key_value_heads", H);
  const int64_t V = cfg["vocab_size"], D = C / H;
  cfg["hidden_size"] = C;
  cfg["intermediate_size"] = I;
  cfg["head_dim"] = D;
  cfg.erase("sliding_window"); // llama.cpp's llama arch has none
  std::ofstream(fs::path(out) / "config.json") << cfg.dump(2);
  for (const char* f :
       {"tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json"})
    if (fs::exists(from / f))
      fs::copy_file(
          from / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
  const bool bias = cfg.value("model_type", "") == "qwen2" ||
      cfg.value("attention_bias", false);
  torch::manual_seed(seed);
  constexpr double kEmbedStd = 0.25; // logits of about 0.25 * sqrt(C) = 4
  auto mat = [](int64_t rows, int64_t cols) {
    return torch::randn({rows, cols}) / std::sqrt(static_cast<double>(cols));
  };
  std::vector<std::pair<std::string, torch::Tensor>> w;
  w.push_back({"model.embed_tokens.weight", torch::randn({V, C}) * kEmbedStd});
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.push_back({p + "input_layernorm.weight", 1 + 0.1 * torch::randn({C})});
    w.push_back(
        {p + "post_attention_layernorm.weight", 1 + 0.1 * torch::randn({C})});
    w.push_back({p + "self_attn.q_proj.weight", mat(H * D, C)});
    w.push_back({p + "self_attn.k_proj.weight", mat(Hkv * D, C)});
    w.push_back({p + "self_attn.v_proj.weight", mat(Hkv * D, C)});
    w.push_back({p + "self_attn.o_proj.weight", mat(C, H * D) * branch_scale});
    if (bias) {
      w.push_back({p + "self_attn.q_proj.bias", 0.1 * torch::randn({H * D})});
      w.push_back({p + "self_attn.k_proj.bias", 0.1 * torch::randn({Hkv * D})});
      w.push_back({p + "self_attn.v_proj.bias", 0.1 * torch::randn({Hkv * D})});
    }
    w.push_back({p + "mlp.gate_proj.weight", mat(I, C)});
    w.push_back({p + "mlp.up_proj.weight", mat(I, C)});
    w.push_back({p + "mlp.down_proj.weight", mat(C, I) * branch_scale});
  }
  w.push_back({"model.norm.weight", torch::ones({C})});
  if (!cfg.value("tie_word_embeddings", false))
    w.push_back({"lm_head.weight", torch::randn({V, C}) * kEmbedStd});
  safetensors::save(
      (fs::path(out) / "model.safetensors").string(), w, {{"format", "pt"}});
}

// Orchard's next-token logits after every prefix of `ids`: (T, V), with
// the LoRA adapter in `adapter` applied when given.
inline torch::Tensor orchard_logits(
    const std::string& dir,
    const std::vector<int64_t>& ids,
    const std::string& adapter = "") {
  torch::NoGradGuard no_grad;
  models::LoadOptions opt;
  opt.dtype = torch::kFloat32;
  opt.context = 0;
  models::Llama model = models::load_hf_model(dir, opt);
  if (!adapter.empty())
    models::load_adapter(model, adapter);
  auto idx = torch::tensor(ids, torch::kInt64).unsqueeze(0);
  return model->forward(idx).squeeze(0).to(torch::kFloat32);
}

// Trains the model in `dir` on `text` for `steps` Adam steps (every
// weight), so that its next-token choices are confident where it learned
// the text, as a trained model's are, and writes the weights back.
inline void train_briefly(
    const std::string& dir,
    const std::vector<int64_t>& ids,
    int steps,
    double lr = 3e-3) {
  models::LoadOptions opt;
  opt.dtype = torch::kFloat32;
  opt.context = 0;
  models::Llama model = models::load_hf_model(dir, opt);
  for (auto& p : model->parameters())
    p.set_requires_grad(true);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(lr));
  constexpr int64_t kRow = 128; // tokens a training row
  const int64_t rows = static_cast<int64_t>(ids.size() - 1) / kRow;
  const auto all = torch::tensor(ids, torch::kInt64);
  const auto x = all.slice(0, 0, rows * kRow).view({rows, kRow});
  const auto y = all.slice(0, 1, rows * kRow + 1).view({rows, kRow});
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    model->loss(x, y).backward();
    adam.step();
  }
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> w;
  for (auto& [k, v] : model->merged_state())
    w.push_back({k, v.detach().contiguous()});
  safetensors::save(
      (fs::path(dir) / "model.safetensors").string(), w, {{"format", "pt"}});
}

inline torch::Tensor judge_logits(const json& model_result, size_t seq) {
  const auto& rows = model_result.at("logits").at(seq);
  std::vector<torch::Tensor> out;
  for (const auto& r : rows)
    out.push_back(torch::tensor(r.get<std::vector<float>>()));
  return torch::stack(out);
}

// Mean negative log-likelihood of ids[t+1] given the logits after ids[..t].
inline double nll(
    const torch::Tensor& logits,
    const std::vector<int64_t>& ids) {
  auto lp = torch::log_softmax(logits.to(torch::kFloat64), -1);
  double sum = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t)
    sum -= lp[static_cast<int64_t>(t)][ids[t + 1]].item<double>();
  return sum / static_cast<double>(ids.size() - 1);
}

// Sentences of a small grammar: what the test models learn, and, with
// another seed, a held-out text they never see. Within a word the next
// token is certain; where the grammar chooses a word, several are equally
// likely, which is where a quantised model may pick another: a near-tie by
// construction.
inline std::string grammar_text(int sentences, uint32_t seed) {
  const char* const adj[] = {"red", "ripe", "green", "small", "sweet"};
  const char* const noun[] = {
      "apple", "pear", "tree", "farmer", "basket", "orchard"};
  const char* const verb[] = {"holds", "finds", "watches", "carries", "leaves"};
  std::mt19937 rng(seed);
  auto pick = [&](const auto& words) {
    return std::string(words[rng() % std::size(words)]);
  };
  std::string text;
  for (int i = 0; i < sentences; ++i)
    text += "The " + pick(adj) + " " + pick(noun) + " " + pick(verb) + " the " +
        pick(noun) + ". ";
  return text;
}

inline std::vector<int64_t> encode_with_bos(
    const std::string& dir,
    const std::string& text) {
  text::Tokenizer tok = text::load_tokenizer(dir);
  std::vector<int64_t> ids;
  if (auto bos = tok.document_start())
    ids.push_back(*bos);
  for (auto id : tok.encode(text))
    ids.push_back(id);
  return ids;
}

// A copy of model folder `dir` whose weights are what the file stores:
// each decoded from the encoding the export chose for it. Quantising a row
// does not depend on the other rows, so the rotary row permutation needs no
// undoing.
inline std::string write_as_stored(
    const std::string& dir,
    const gguf::ExportReport& r,
    const std::string& out) {
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() != ".safetensors")
      fs::copy_file(
          e.path(),
          fs::path(out) / e.path().filename(),
          fs::copy_options::overwrite_existing);
  auto w = safetensors::load((fs::path(dir) / "model.safetensors").string());
  std::vector<std::pair<std::string, torch::Tensor>> stored;
  for (const auto& [key, type] : r.types) {
    const torch::Tensor& x = w.at(key);
    stored.push_back(
        {key, gguf::decode(gguf::encode(x, type), type, x.sizes().vec())});
  }
  safetensors::save(
      (fs::path(out) / "model.safetensors").string(),
      stored,
      {{"format", "pt"}});
  return out;
}

// Relative error of logits `a` against `b`, both (T, V): the RMS of the
// difference over the RMS of b's spread about each row's mean.
inline double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto spread = b - b.mean(-1, true);
  return ((a - b).pow(2).mean() / spread.pow(2).mean()).sqrt().item<double>();
}

// Where the next-token choices of logits `a` and `b` (T, V) differ, the
// largest gap between the two likeliest tokens of `b` (0 when none differ).
struct ChoiceDiff {
  int64_t differ = 0, positions = 0;
  double worst_gap = 0;
};
inline ChoiceDiff choices(const torch::Tensor& a, const torch::Tensor& b) {
  const auto top2 = std::get<0>(torch::softmax(b, -1).topk(2, -1));
  const auto gap = top2.select(1, 0) - top2.select(1, 1);
  const auto differ = a.argmax(-1).ne(b.argmax(-1));
  ChoiceDiff d;
  d.differ = differ.sum().item<int64_t>();
  d.positions = differ.numel();
  d.worst_gap = d.differ ? gap.masked_select(differ).max().item<double>() : 0;
  return d;
}

// Positions where `theirs` moves a confident choice of `full` (its top two
// at least `min_gap` apart in probability) that `stored` does not move the
// same way: for a 4-bit file, moves that are not the quantisation's own.
inline int64_t moves_not_from(
    const torch::Tensor& theirs,
    const torch::Tensor& full,
    const torch::Tensor& stored,
    double min_gap) {
  const auto top2 = std::get<0>(torch::softmax(full, -1).topk(2, -1));
  const auto confident = (top2.select(1, 0) - top2.select(1, 1)).ge(min_gap);
  const auto choice = theirs.argmax(-1);
  return (choice.ne(full.argmax(-1)) & confident & choice.ne(stored.argmax(-1)))
      .sum()
      .item<int64_t>();
}

} // namespace orchard::test
