// `orchard export ollama` (the Modelfile's template, stops and system
// prompt against the model's own chat template) and `orchard export hf`
// (Orchard's own GPT, which has no llama.cpp architecture). The GGUF
// files themselves are judged by llama.cpp in export_test.cpp.
#include "gguf_test_util.h"
#include "models/gpt.h"
#include "runs/checkpoint.h"
#include "text/chat_template.h"
#include "text/conversation.h"
#include "text/model_template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace orchard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace test;

using test::contains;

// Orchard's own GPT: no llama.cpp architecture, said clearly, and
// `export hf` writes its weights and config instead.
TEST(GgufExport, OrchardRunsPointToExportHf) {
  TempDir tmp;
  const std::string tok_dir = tmp.file("tok");
  fs::create_directories(tok_dir);
  fs::copy_file(
      fs::path(ORCHARD_FIXTURES) / "hf/llama/tokenizer.json",
      fs::path(tok_dir) / "tokenizer.json");
  models::GptConfig c;
  c.vocab_size = 320;
  c.n_layer = 1;
  c.n_embd = 64;
  c.n_head = 1;
  c.n_kv_head = 1;
  c.max_seq_len = 32;
  models::Gpt gpt(c);
  runs::NamedTensors weights;
  for (const auto& p : gpt->named_parameters())
    weights.push_back({p.key(), p.value().detach()});
  const std::string run = tmp.file("run");
  runs::save_checkpoint(
      run,
      7,
      weights,
      {},
      {{"model",
        {{"vocab_size", 320},
         {"n_layer", 1},
         {"n_embd", 64},
         {"n_head", 1},
         {"n_kv_head", 1},
         {"max_seq_len", 32}}},
       {"tokenizer", tok_dir}});
  auto r = run_orchard(
      {"export", "gguf", "--model", run, "--out", tmp.file("x.gguf")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "no llama.cpp architecture")) << r.err;
  EXPECT_TRUE(contains(r.err, "orchard export hf --checkpoint")) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("x.gguf")));

  // A stage=full run is a Hugging Face model in its model/ folder: that
  // one exports, named after the run.
  const std::string full = tmp.file("full_run");
  fs::create_directories(fs::path(full) / "checkpoints");
  fs::copy(fs::path(ORCHARD_FIXTURES) / "hf/llama", fs::path(full) / "model");
  r = run_orchard(
      {"export", "gguf", "--model", full, "--out", tmp.file("full.gguf")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "the run's model folder")) << r.out;
  EXPECT_TRUE(fs::exists(tmp.file("full.gguf")));

  const std::string out = tmp.file("hf");
  r = run_orchard({"export", "hf", "--checkpoint", run, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json cfg = read_json(fs::path(out) / "config.json");
  EXPECT_EQ(cfg["model_type"], "orchard-gpt");
  EXPECT_EQ(cfg["n_embd"], 64);
  EXPECT_EQ(cfg["orchard_step"], 7);
  EXPECT_TRUE(fs::exists(fs::path(out) / "tokenizer.json"));
  auto back = safetensors::load((fs::path(out) / "model.safetensors").string());
  ASSERT_EQ(back.size(), weights.size());
  for (const auto& [k, v] : weights)
    EXPECT_TRUE(torch::equal(back.at(k), v)) << k;
}

// Ollama's Go template has no engine here, so a small evaluator of the
// subset the Modelfile uses ({{ if .X }}...{{ end }}, {{ .X }}) renders it,
// and the result must equal the model's Jinja template rendered by Orchard.
std::string render_go_template(
    const std::string& t,
    const std::map<std::string, std::string>& v) {
  std::string out;
  size_t i = 0;
  std::vector<bool> on = {true};
  while (i < t.size()) {
    const size_t open = t.find("{{", i);
    if (open == std::string::npos) {
      if (on.back())
        out += t.substr(i);
      break;
    }
    if (on.back())
      out += t.substr(i, open - i);
    const size_t close = t.find("}}", open);
    const std::string action =
        t.substr(open + 3, close - open - 4); // "if .X", ".X", "end"
    if (action.rfind("if .", 0) == 0) {
      const auto it = v.find(action.substr(4));
      on.push_back(on.back() && it != v.end() && !it->second.empty());
    } else if (action == "end") {
      on.pop_back();
    } else if (on.back()) {
      const auto it = v.find(action.substr(1));
      out += it == v.end() ? "" : it->second;
    }
    i = close + 2;
  }
  return out;
}

TEST(OllamaExport, ModelfileTemplateRendersTheModelsPromptAndStops) {
  TempDir tmp;
  struct Case {
    const char* fixture;
    const char* family;
    const char* stop;
  };
  for (const Case& c :
       {Case{"llama", "llama3", "<|eot_id|>"},
        Case{"qwen2", "chatml", "<|im_end|>"},
        Case{"mistral_sp", "mistral", "</s>"}}) {
    const std::string dir =
        (fs::path(ORCHARD_FIXTURES) / "hf" / c.fixture).string();
    const std::string out = tmp.file(std::string("ollama-") + c.fixture);
    auto r = run_orchard(
        {"export",
         "ollama",
         "--model",
         dir,
         "--out",
         out,
         "--type",
         "q8_0",
         "--name",
         "tiny"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_TRUE(contains(r.out, "ollama create tiny -f")) << r.out;
    EXPECT_TRUE(fs::exists(fs::path(out) / "tiny-q8_0.gguf"));
    const std::string mf =
        test::read_text((fs::path(out) / "Modelfile").string());
    EXPECT_TRUE(contains(mf, "FROM ./tiny-q8_0.gguf\n")) << mf;
    EXPECT_TRUE(contains(mf, std::string("PARAMETER stop \"") + c.stop + "\""))
        << mf;
    EXPECT_TRUE(contains(r.out, std::string("template: ") + c.family)) << r.out;
    // The TEMPLATE between its triple quotes, rendered for one user turn.
    const size_t a = mf.find("TEMPLATE \"\"\"") + 12, b = mf.find("\"\"\"", a);
    ASSERT_NE(b, std::string::npos) << mf;
    const std::string go = mf.substr(a, b - a);
    // Ollama renders the last turn up to .Response, adds BOS itself
    // (the GGUF's add_bos_token) and hands llama.cpp the text with its
    // special tokens: those ids must be the model's own prompt.
    const std::string user = "What grows in an orchard?", system = "Be brief.";
    text::Tokenizer tok = text::load_tokenizer(dir);
    auto t = text::read_chat_template(dir);
    ASSERT_TRUE(t.has_value());
    text::ModelTemplate jinja(t->text, t->file, t->bos, t->eos, tok);
    for (bool with_system : {false, true}) {
      std::map<std::string, std::string> vars = {{"Prompt", user}};
      std::vector<text::Message> conv = {{"user", user}};
      if (with_system) {
        vars["System"] = system;
        conv.insert(conv.begin(), {"system", system});
      }
      const std::string rendered =
          render_go_template(go.substr(0, go.find("{{ .Response }}")), vars);
      const auto want = jinja.render(conv, true).ids;
      std::vector<text::TokenId> got;
      if (!want.empty() && want.front() == tok.document_start())
        got.push_back(want.front());
      for (auto id : tok.encode(rendered, text::Allowed::every()))
        got.push_back(id);
      EXPECT_EQ(got, std::vector<text::TokenId>(want.begin(), want.end()))
          << c.fixture << (with_system ? " with a system prompt\n" : "\n")
          << rendered << "\n"
          << go;
    }
  }
}

} // namespace
} // namespace orchard
