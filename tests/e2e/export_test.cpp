// `orchard export gguf`, judged by llama.cpp itself: node-llama-cpp
// (llama.cpp's prebuilt CPU build, installed by ./orchard.sh test into
// build/llama-judge) loads each exported file and reports its logits, its
// greedy continuations, its tokenisation and its chat prompt
// (tests/gguf/llama_judge.mjs). Orchard's side is its own Hugging Face
// model (checked against transformers by the golden tests) and tokenizer.
// Where node or the judge is missing, these tests skip and say why.
//
// Models: the fixtures' own configs and tokenizers (Llama 3-style with
// llama3 rope scaling, Qwen2, SentencePiece Mistral) with random weights
// 256 wide, so every k-quant block layout is used, and with logits far from
// flat (embeddings of standard deviation 0.25: logits of about 4); the
// agreement test trains them briefly on a small grammar first, so that
// their choices are confident where a trained model's are.
#include "gguf_test_util.h"
#include "text/chat_template.h"
#include "text/conversation.h"
#include "text/hf_tokenizer.h"
#include "text/model_template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace orchard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace test;

using test::contains;

struct ArchCase {
  const char* fixture;
  const char* arch;
};
const ArchCase kArchs[] = {
    {"llama", "llama"},
    {"qwen2", "qwen2"},
    {"mistral_sp", "llama"}};

// The models of the agreement test: a fixture's architecture and
// tokenizer, 256 wide (so every k-quant block layout is used), trained on
// sentences of grammar_text so that its choices are confident where the
// grammar leaves no choice, as a trained model's are.
std::string trained_model(const std::string& fixture, const std::string& dir) {
  constexpr int kSentences = 300, kSteps = 50;
  write_random_model(fixture, dir, 256, 512, 7);
  train_briefly(dir, encode_with_bos(dir, grammar_text(kSentences, 1)), kSteps);
  return dir;
}

// For every architecture and type, llama.cpp's next-token logits after
// every prefix of a learned and of a held-out text, against Orchard's:
// - on the weights the file stores (decoded by Orchard): equal up to
//   llama.cpp's own rounding (8-bit activations in quantised products, an
//   f16 KV cache), and for q4_0/q4_K_M several times closer to them than to
//   the full-precision weights: this is what proves each block layout is
//   llama.cpp's. The choices differ only at near-ties.
// - on the full-precision model: f16 and q8_0 choose the same next tokens
//   (but at near-ties); q4_0 and q4_K_M agree at most positions and keep
//   the held-out perplexity near f16's. Quantising to 4 bits itself moves
//   some confident choices of these small models: every such move must be
//   one Orchard running the stored weights makes too.
// Margins measured on these models are in docs/export.md.
TEST(GgufExport, LlamaCppAgreesWithOrchardForEveryArchAndType) {
  REQUIRE_JUDGE();
  // Margins, with what they were on these models (each run prints them;
  // docs/export.md has them too):
  // the top-2 probability gap where a choice differs (0.05 seen)
  constexpr double kNearTie = 0.15;
  // ... for q4 against full precision, beyond which a move must be the
  // stored weights' own (0.21 seen; 0.64 on weights trained with
  // OpenBLAS's SkylakeX kernels, whose rounding trains other weights: a
  // move Orchard running the stored weights makes too)
  constexpr double kQ4NearTie = 0.3;
  // relative logit error of an f16 file (0.0003)
  constexpr double kF16Error = 0.005;
  // ... of a quantised file against the weights it stores (0.012)
  constexpr double kQuantizedError = 0.03;
  // q4: error to full precision over error to the stored weights (3.6)
  constexpr double kCloserToStored = 3;
  // q4: share of choices equal to full precision's (0.94)
  constexpr double kQ4Agreement = 0.9;
  // q4: held-out perplexity against f16's (3.6 % off)
  constexpr double kPplTolerance = 0.1;
  TempDir tmp;
  json request = {{"models", json::array()}};
  struct Job {
    std::string dir, stored, type;
    std::vector<int64_t> learned, held_out;
  };
  std::vector<Job> jobs;
  for (const auto& a : kArchs) {
    const std::string dir =
        trained_model(a.fixture, tmp.file(std::string(a.fixture) + "_wide"));
    const auto learned = encode_with_bos(dir, grammar_text(4, 1));
    const auto held_out = encode_with_bos(dir, grammar_text(4, 2));
    for (const char* type : {"f16", "q8_0", "q4_0", "q4_K_M"}) {
      gguf::ExportOptions opt;
      opt.model_dir = dir;
      opt.type = type;
      opt.out = tmp.file(std::string(a.fixture) + "-" + type + ".gguf");
      const gguf::ExportReport r = gguf::export_gguf(opt);
      EXPECT_EQ(r.arch, a.arch);
      const std::string stored = write_as_stored(
          dir, r, tmp.file(std::string(a.fixture) + "-" + type + "-stored"));
      request["models"].push_back(
          {{"path", opt.out}, {"sequences", {learned, held_out}}});
      jobs.push_back({dir, stored, type, learned, held_out});
    }
  }
  // The classic broken conversion: Llama's q and k rows left in
  // transformers' rotary order. llama.cpp loads and runs it; the checks an
  // f16 file passes below must fail on it, or they could not tell.
  gguf::ExportOptions unpermuted;
  unpermuted.model_dir = jobs[0].dir;
  unpermuted.out = tmp.file("llama-unpermuted.gguf");
  unpermuted.permute_rotary = false;
  gguf::export_gguf(unpermuted);
  request["models"].push_back(
      {{"path", unpermuted.out}, {"sequences", {jobs[0].learned}}});

  const json result = run_judge(request);
  {
    const json& m = result["models"][jobs.size()];
    ASSERT_FALSE(m.contains("error")) << m["error"];
    const torch::Tensor theirs = judge_logits(m, 0);
    const torch::Tensor full = orchard_logits(jobs[0].dir, jobs[0].learned);
    const ChoiceDiff d = choices(theirs, full);
    std::printf(
        "llama without the rotary permutation: logit error %.3f, choices differ %lld of %lld "
        "(largest top-2 gap there %.3f)\n",
        relative_error(theirs, full),
        static_cast<long long>(d.differ),
        static_cast<long long>(d.positions),
        d.worst_gap);
    EXPECT_GT(relative_error(theirs, full), 10 * kF16Error);
    EXPECT_GT(d.worst_gap, kNearTie);
  }
  std::map<std::string, double> f16_nll;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const json& m = result["models"][j];
    ASSERT_FALSE(m.contains("error")) << jobs[j].type << ": " << m["error"];
    const std::string& type = jobs[j].type;
    const std::string what =
        fs::path(jobs[j].dir).filename().string() + " " + type;
    const bool q4 = type == "q4_0" || type == "q4_K_M";
    double loss = 0;
    for (size_t seq = 0; seq < 2; ++seq) {
      const auto& ids = seq == 0 ? jobs[j].learned : jobs[j].held_out;
      const std::string where = what + (seq == 0 ? " learned" : " held-out");
      const torch::Tensor theirs = judge_logits(m, seq);
      const torch::Tensor stored = orchard_logits(jobs[j].stored, ids);
      const torch::Tensor full = orchard_logits(jobs[j].dir, ids);
      ASSERT_EQ(theirs.sizes(), full.sizes()) << where;
      const double to_stored = relative_error(theirs, stored);
      const double to_full = relative_error(theirs, full);
      const ChoiceDiff vs_stored = choices(theirs, stored),
                       vs_full = choices(theirs, full);
      std::printf(
          "%-30s logit error to stored %.4f, to full %.4f; choices differ from "
          "stored %lld, from full %lld of %lld (largest top-2 gap there %.3f)\n",
          where.c_str(),
          to_stored,
          to_full,
          static_cast<long long>(vs_stored.differ),
          static_cast<long long>(vs_full.differ),
          static_cast<long long>(vs_full.positions),
          vs_full.worst_gap);
      EXPECT_LT(to_stored, type == "f16" ? kF16Error : kQuantizedError)
          << where;
      EXPECT_LT(vs_stored.worst_gap, kNearTie)
          << where << ": a choice apart from the stored weights'";
      if (q4) {
        EXPECT_LT(to_stored * kCloserToStored, to_full) << where;
        EXPECT_GE(
            1.0 - double(vs_full.differ) / double(vs_full.positions),
            kQ4Agreement)
            << where;
        EXPECT_EQ(moves_not_from(theirs, full, stored, kQ4NearTie), 0)
            << where << ": a confident choice of full precision moved, "
            << "and not by the stored weights";
      } else {
        EXPECT_LT(vs_full.worst_gap, kNearTie)
            << where << ": a choice apart from full precision";
      }
      if (seq == 1) {
        loss = nll(theirs, ids);
        if (type == "f16")
          f16_nll[jobs[j].dir] = loss;
      }
    }
    const double ratio = std::exp(loss - f16_nll.at(jobs[j].dir));
    std::printf(
        "%-30s held-out perplexity x%.4f of f16's\n", what.c_str(), ratio);
    EXPECT_LT(std::fabs(ratio - 1), q4 ? kPplTolerance : 0.01) << what;
  }
}

// llama.cpp's greedy continuation of a prompt, decoded, is what
// `orchard generate --temperature 0` prints.
TEST(GgufExport, GreedyTextMatchesOrchardGenerate) {
  REQUIRE_JUDGE();
  TempDir tmp;
  json request = {{"models", json::array()}};
  std::vector<std::string> dirs;
  const std::string prompt = "The apples hung low over";
  constexpr int kNew = 12;
  for (const auto& a : kArchs) {
    const std::string dir = tmp.file(a.fixture);
    write_random_model(a.fixture, dir, 256, 512, 5);
    const std::string out = tmp.file(std::string(a.fixture) + ".gguf");
    ASSERT_EQ(
        run_orchard({"export", "gguf", "--model", dir, "--out", out}).exit_code,
        0);
    request["models"].push_back(
        {{"path", out},
         {"prompts", {encode_with_bos(dir, prompt)}},
         {"new_tokens", kNew}});
    dirs.push_back(dir);
  }
  const json r = run_judge(request);
  for (size_t i = 0; i < dirs.size(); ++i) {
    auto g = run_orchard(
        {"generate",
         "--model",
         dirs[i],
         "--prompt",
         prompt,
         "--temperature",
         "0",
         "--max-new-tokens",
         std::to_string(kNew),
         "--device",
         "cpu"});
    ASSERT_EQ(g.exit_code, 0) << g.err;
    text::Tokenizer tok = text::load_tokenizer(dirs[i]);
    std::vector<text::TokenId> ids;
    for (const auto& id : r["models"][i]["greedy"][0]) {
      const auto t = id.get<text::TokenId>();
      const auto ends = tok.document_ends();
      if (std::find(ends.begin(), ends.end(), t) != ends.end())
        break; // orchard generate stops there
      ids.push_back(t);
    }
    const std::string theirs = prompt + tok.decode(ids);
    // The text follows the device and model lines.
    const size_t at = g.out.find("\n" + prompt);
    ASSERT_NE(at, std::string::npos) << g.out;
    EXPECT_EQ(g.out.substr(at + 1, theirs.size()), theirs) << dirs[i];
  }
}

// llama.cpp's tokenizer on the exported metadata gives Orchard's ids: the
// fixtures' tokenizers, the real Mistral 7B one (32,000 SentencePiece
// pieces, scores from the merges) and Llama 3's (128,256 ids, pre-tokenizer
// llama-bpe), on the tokenizer fixtures' texts; and
// the chat template read back from the file renders the prompt Orchard
// renders.
TEST(GgufExport, TokenizerAndChatTemplateAgreeWithLlamaCpp) {
  REQUIRE_JUDGE();
  TempDir tmp;
  // Real tokenizers on small models of their vocabularies: Mistral's
  // (SentencePiece) as shipped, and Llama 3's (byte-level, 128,256 ids)
  // written as tokenizer.json by Orchard from the tiktoken fixture.
  auto with_vocab = [&](const char* fixture,
                        const std::string& dir,
                        int64_t V) {
    write_random_model(fixture, dir, 64, 64, 3);
    json cfg = read_json(fs::path(dir) / "config.json");
    cfg["vocab_size"] = V;
    std::ofstream(fs::path(dir) / "config.json") << cfg.dump(2);
    for (const char* f : {"tokenizer_config.json", "chat_template.jinja"})
      fs::remove(fs::path(dir) / f);
    auto w = safetensors::load((fs::path(dir) / "model.safetensors").string());
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (auto& [k, v] : w)
      out.push_back(
          {k,
           (k == "model.embed_tokens.weight" || k == "lm_head.weight")
               ? torch::randn({V, 64}) * 0.25
               : v});
    safetensors::save(
        (fs::path(dir) / "model.safetensors").string(),
        out,
        {{"format", "pt"}});
  };
  const std::string mistral = tmp.file("mistral_real");
  with_vocab("mistral_sp", mistral, 32000);
  const fs::path mistral_tok =
      fs::path(ORCHARD_FIXTURES) / "tokenizers/mistral";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(
        mistral_tok / f,
        fs::path(mistral) / f,
        fs::copy_options::overwrite_existing);
  const std::string llama3 = tmp.file("llama3_real");
  with_vocab("llama", llama3, 128256);
  text::save_hf_tokenizer(
      text::load_tokenizer(
          (fs::path(ORCHARD_FIXTURES) / "tokenizers/llama3").string()),
      (fs::path(llama3) / "tokenizer.json").string());
  const json ref = read_json(
      fs::path(ORCHARD_FIXTURES) / "tokenizers/mistral_reference.json");
  std::vector<std::string> texts = {
      "Hello world",
      "the quick brown fox jumps over the lazy dog",
      "  two spaces, a tab\tand\nnew lines\n\n",
      "café naïve 東京 🍎 123456",
      "Don't stop; it's 3.14!"};
  for (const auto& t : ref["random_texts"])
    if (texts.size() < 40)
      texts.push_back(t.get<std::string>());
  const std::vector<text::Message> conv = {
      {"system", "Be brief."}, {"user", "What grows in an orchard?"}};
  json messages = json::array();
  for (const auto& m : conv)
    messages.push_back({{"role", m.role}, {"content", m.content}});

  json request = {{"models", json::array()}};
  std::vector<std::string> dirs = {
      (fs::path(ORCHARD_FIXTURES) / "hf/llama").string(),
      (fs::path(ORCHARD_FIXTURES) / "hf/qwen2").string(),
      (fs::path(ORCHARD_FIXTURES) / "hf/mistral_sp").string(),
      mistral,
      llama3};
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string out = tmp.file("m" + std::to_string(i) + ".gguf");
    auto r = run_orchard({"export", "gguf", "--model", dirs[i], "--out", out});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    json job = {{"path", out}, {"texts", texts}};
    if (i < 3)
      job["messages"] = messages;
    request["models"].push_back(job);
  }
  const json r = run_judge(request);
  for (size_t i = 0; i < dirs.size(); ++i) {
    const json& m = r["models"][i];
    ASSERT_FALSE(m.contains("error")) << m["error"];
    text::Tokenizer tok = text::load_tokenizer(dirs[i]);
    int same = 0;
    for (size_t k = 0; k < texts.size(); ++k) {
      std::vector<int64_t> ours;
      for (auto id : tok.encode(texts[k]))
        ours.push_back(id);
      const auto theirs = m["tokens"][k].get<std::vector<int64_t>>();
      EXPECT_EQ(ours, theirs) << dirs[i] << " on \"" << texts[k] << "\"";
      same += ours == theirs;
    }
    std::printf(
        "%s: %d/%zu texts tokenised identically\n",
        dirs[i].c_str(),
        same,
        texts.size());
    if (i < 3) {
      auto t = text::read_chat_template(dirs[i]);
      ASSERT_TRUE(t.has_value());
      text::ModelTemplate tmpl(t->text, t->file, t->bos, t->eos, tok);
      const auto rendered = tmpl.render(conv, /*add_generation_prompt=*/true);
      std::vector<int64_t> ours(rendered.ids.begin(), rendered.ids.end());
      EXPECT_EQ(ours, m["prompt_tokens"].get<std::vector<int64_t>>())
          << dirs[i] << ": llama.cpp's prompt " << m["prompt"];
    }
  }
}

// Llama 3.1's rotary scaling travels as the rope_freqs tensor, and an
// adapter given to --adapter is merged into the file: llama.cpp's logits
// equal Orchard's for the model as Orchard runs it. The controls (the same
// weights without the scaling, the base without the adapter) must be far
// from llama.cpp's, so the test fails if either is dropped.
TEST(GgufExport, RopeScalingAndAMergedAdapterReachLlamaCpp) {
  REQUIRE_JUDGE();
  constexpr double kSame = 0.05; // f16 weights and KV cache
  constexpr double kControl = 0.5;
  TempDir tmp;
  // Scaling that acts at the positions read: an original context of 16
  // scales every frequency whose wavelength passes 16 positions.
  const std::string rope = tmp.file("llama_rope");
  write_random_model("llama", rope, 256, 512, 13);
  const std::string plain = tmp.file("llama_plain");
  fs::create_directories(plain);
  for (const auto& e : fs::directory_iterator(rope))
    fs::copy_file(e.path(), fs::path(plain) / e.path().filename());
  json cfg = read_json(fs::path(rope) / "config.json");
  cfg.erase("rope_parameters");
  cfg["rope_theta"] = 10000.0;
  std::ofstream(fs::path(plain) / "config.json") << cfg.dump(2);
  cfg["rope_scaling"] = {
      {"rope_type", "llama3"},
      {"factor", 8.0},
      {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0},
      {"original_max_position_embeddings", 16}};
  std::ofstream(fs::path(rope) / "config.json") << cfg.dump(2);
  const auto ids = encode_with_bos(rope, grammar_text(6, 2));
  const std::string rope_out = tmp.file("rope.gguf");
  auto r = run_orchard({"export", "gguf", "--model", rope, "--out", rope_out});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  const std::string base = (fs::path(ORCHARD_FIXTURES) / "hf/llama").string();
  const std::string adapter =
      (fs::path(ORCHARD_FIXTURES) / "hf/llama_lora").string();
  const auto base_ids = encode_with_bos(base, grammar_text(3, 2));
  const std::string merged_out = tmp.file("merged.gguf");
  r = run_orchard(
      {"export",
       "gguf",
       "--model",
       base,
       "--adapter",
       adapter,
       "--out",
       merged_out});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Merging the adapter")) << r.out;

  const json j = run_judge(
      {{"models",
        {{{"path", rope_out}, {"sequences", {ids}}},
         {{"path", merged_out}, {"sequences", {base_ids}}}}}});
  for (const auto& m : j["models"])
    ASSERT_FALSE(m.contains("error")) << m["error"];
  const torch::Tensor rope_theirs = judge_logits(j["models"][0], 0);
  const double rope_same =
      (orchard_logits(rope, ids) - rope_theirs).abs().max().item<double>();
  const double rope_control =
      (orchard_logits(plain, ids) - rope_theirs).abs().max().item<double>();
  const torch::Tensor lora_theirs = judge_logits(j["models"][1], 0);
  const double lora_same =
      (orchard_logits(base, base_ids, adapter) - lora_theirs)
          .abs()
          .max()
          .item<double>();
  const double lora_control =
      (orchard_logits(base, base_ids) - lora_theirs).abs().max().item<double>();
  std::printf(
      "rope scaling: %.4f (without it %.3f); adapter: %.4f (base alone %.3f)\n",
      rope_same,
      rope_control,
      lora_same,
      lora_control);
  EXPECT_LT(rope_same, kSame);
  EXPECT_GT(rope_control, kControl) << "the scaling does not act on this text";
  EXPECT_LT(lora_same, kSame);
  EXPECT_GT(lora_control, kControl) << "the adapter does not act on this text";
}

// Rows that are not multiples of 256 (Qwen2.5 0.5B's 896, here 96 and
// 160) cannot be k-quants: q4_K_M writes q5_0 and q8_0 there, as
// llama-quantize does, says so, and llama.cpp reads those blocks as the
// weights Orchard stored.
TEST(GgufExport, NarrowRowsFallBackToTypesLlamaCppReads) {
  REQUIRE_JUDGE();
  TempDir tmp;
  const std::string dir = tmp.file("narrow");
  write_random_model("qwen2", dir, 96, 160, 17);
  gguf::ExportOptions opt;
  opt.model_dir = dir;
  opt.type = "q4_K_M";
  opt.out = tmp.file("narrow.gguf");
  const gguf::ExportReport r = gguf::export_gguf(opt);
  std::map<std::string, int> seen;
  for (const auto& [key, type] : r.types)
    ++seen[gguf::traits(type).name];
  EXPECT_GT(seen["q5_0"], 0);
  EXPECT_GT(seen["q8_0"], 0);
  EXPECT_EQ(seen["q4_K"] + seen["q6_K"], 0);
  EXPECT_FALSE(r.fallbacks.empty());
  const auto ids = encode_with_bos(dir, grammar_text(3, 2));
  const json j =
      run_judge({{"models", {{{"path", opt.out}, {"sequences", {ids}}}}}});
  ASSERT_FALSE(j["models"][0].contains("error")) << j["models"][0]["error"];
  const torch::Tensor theirs = judge_logits(j["models"][0], 0);
  const std::string stored = write_as_stored(dir, r, tmp.file("stored"));
  const double to_stored = relative_error(theirs, orchard_logits(stored, ids));
  const double to_full = relative_error(theirs, orchard_logits(dir, ids));
  std::printf(
      "q5_0/q8_0 fallbacks: logit error to stored %.4f, to full %.4f\n",
      to_stored,
      to_full);
  EXPECT_LT(to_stored, 0.03);
  EXPECT_LT(to_stored * 3, to_full);
}

// SentencePiece's protobuf (ModelProto: field 1, repeated pieces of
// {1: text, 2: float score, 3: type}), written by hand.
std::string sentencepiece_proto(
    const std::vector<std::string>& pieces,
    const std::vector<float>& scores,
    const std::vector<int>& types) {
  auto varint = [](std::string& out, uint64_t v) {
    while (v >= 0x80) {
      out += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out += static_cast<char>(v);
  };
  std::string out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::string p;
    p += '\x0A'; // field 1, length-delimited
    varint(p, pieces[i].size());
    p += pieces[i];
    p += '\x15'; // field 2, fixed32
    p.append(reinterpret_cast<const char*>(&scores[i]), 4);
    p += '\x18'; // field 3, varint
    varint(p, static_cast<uint64_t>(types[i]));
    out += '\x0A';
    varint(out, p.size());
    out += p;
  }
  return out;
}

// With tokenizer.model beside tokenizer.json, the scores llama.cpp merges
// by are the SentencePiece model's own (read back from the file by an
// independent GGUF reader), and llama.cpp tokenises as Orchard does; a
// tokenizer.model cut short, or one that is another model's, is refused.
TEST(GgufExport, SentencePieceScoresComeFromTokenizerModel) {
  REQUIRE_JUDGE();
  TempDir tmp;
  const fs::path fixture = fs::path(ORCHARD_FIXTURES) / "hf/mistral_sp";
  const std::string dir = tmp.file("mistral_sp");
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture))
    fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  const json tj = read_json(fixture / "tokenizer.json");
  const int64_t V = read_json(fixture / "config.json")["vocab_size"];
  std::vector<std::string> pieces(static_cast<size_t>(V));
  for (const auto& [text, id] : tj["model"]["vocab"].items())
    pieces[id.get<size_t>()] = text;
  // Scores in the merges' order but not the values a conversion from the
  // merges would give (-rank): the file must carry these.
  std::vector<float> scores(pieces.size());
  std::vector<int> types(pieces.size(), 1);
  for (size_t i = 0; i < pieces.size(); ++i)
    scores[i] = -10000.0f - static_cast<float>(i);
  std::map<std::string, size_t> id_of;
  for (size_t i = 0; i < pieces.size(); ++i)
    id_of[pieces[i]] = i;
  const auto& merges = tj["model"]["merges"];
  for (size_t r = merges.size(); r-- > 0;) {
    std::string a, b;
    if (merges[r].is_string()) {
      const std::string m = merges[r];
      a = m.substr(0, m.find(' '));
      b = m.substr(m.find(' ') + 1);
    } else {
      a = merges[r][0];
      b = merges[r][1];
    }
    scores[id_of.at(a + b)] = -0.5f - 2.0f * static_cast<float>(r);
  }
  types[0] = 2;
  types[1] = types[2] = 3;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].size() == 6 && pieces[i].rfind("<0x", 0) == 0)
      types[i] = 6;
  const std::string proto = sentencepiece_proto(pieces, scores, types);
  std::ofstream(fs::path(dir) / "tokenizer.model", std::ios::binary) << proto;

  const std::string out = tmp.file("sp.gguf");
  auto r = run_orchard({"export", "gguf", "--model", dir, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "scores from tokenizer.model")) << r.out;
  const std::vector<std::string> texts = {
      "Hello world",
      "the quick brown fox jumps over the lazy dog",
      "  two spaces and\nnew lines",
      "apple orchard farmer"};
  const json j = run_judge(
      {{"models",
        {{{"path", out},
          {"texts", texts},
          {"metadata_keys",
           {"tokenizer.ggml.scores", "tokenizer.ggml.token_type"}}}}}});
  const json& m = j["models"][0];
  ASSERT_FALSE(m.contains("error")) << m["error"];
  const auto file_scores =
      m["values"]["tokenizer.ggml.scores"].get<std::vector<float>>();
  const auto file_types =
      m["values"]["tokenizer.ggml.token_type"].get<std::vector<int>>();
  EXPECT_EQ(file_scores, scores);
  EXPECT_EQ(file_types, types);
  text::Tokenizer tok = text::load_tokenizer(dir);
  for (size_t k = 0; k < texts.size(); ++k) {
    std::vector<int64_t> ours;
    for (auto id : tok.encode(texts[k]))
      ours.push_back(id);
    EXPECT_EQ(ours, m["tokens"][k].get<std::vector<int64_t>>()) << texts[k];
  }

  // Cut mid-piece, and a model of other pieces.
  std::ofstream(fs::path(dir) / "tokenizer.model", std::ios::binary)
      << proto.substr(0, proto.size() / 2 + 3);
  r = run_orchard(
      {"export", "gguf", "--model", dir, "--out", tmp.file("cut.gguf")});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(contains(r.err, "tokenizer.model")) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("cut.gguf")));
  std::vector<std::string> other = pieces;
  std::swap(other[10], other[11]);
  std::ofstream(fs::path(dir) / "tokenizer.model", std::ios::binary)
      << sentencepiece_proto(other, scores, types);
  r = run_orchard(
      {"export", "gguf", "--model", dir, "--out", tmp.file("other.gguf")});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(contains(r.err, "does not match")) << r.err;
}

TEST(GgufExport, BadInputSaysWhatAndExitsTwo) {
  TempDir tmp;
  const std::string fixture =
      (fs::path(ORCHARD_FIXTURES) / "hf/llama").string();
  auto r = run_orchard(
      {"export",
       "gguf",
       "--model",
       fixture,
       "--out",
       tmp.file("a.gguf"),
       "--type",
       "q3_K"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--type q3_K")) << r.err;
  EXPECT_TRUE(contains(r.err, "q4_K_M")) << r.err;

  r = run_orchard(
      {"export", "gguf", "--model", fixture, "--out", tmp.file("a.bin")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, ".gguf")) << r.err;

  // No tokenizer: a GGUF without one is useless.
  const std::string bare = tmp.file("bare");
  write_random_model("llama", bare, 64, 96, 1);
  fs::remove(fs::path(bare) / "tokenizer.json");
  r = run_orchard(
      {"export", "gguf", "--model", bare, "--out", tmp.file("b.gguf")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "no tokenizer.json")) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("b.gguf")));

  // Rows of 80 values: q4_0 packs blocks of 32, and so does q5_0, where
  // q4_K_M's rows that are not multiples of 256 fall back: llama.cpp has
  // no layout for them.
  const std::string odd = tmp.file("odd");
  write_random_model("llama", odd, 80, 160, 1);
  for (const char* type : {"q4_0", "q4_K_M"}) {
    r = run_orchard(
        {"export",
         "gguf",
         "--model",
         odd,
         "--out",
         tmp.file("c.gguf"),
         "--type",
         type});
    EXPECT_EQ(r.exit_code, 2) << type;
    EXPECT_TRUE(contains(r.err, "rows of 80")) << r.err;
    EXPECT_TRUE(contains(r.err, "--type f16")) << r.err;
    EXPECT_FALSE(fs::exists(tmp.file("c.gguf")));
  }

  // An existing file is not replaced without --force.
  tmp.write("d.gguf", "keep me");
  r = run_orchard(
      {"export", "gguf", "--model", fixture, "--out", tmp.file("d.gguf")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(test::read_text(tmp.file("d.gguf")), "keep me");

  // An unknown architecture.
  const std::string gemma = tmp.file("gemma");
  write_random_model("llama", gemma, 64, 96, 1);
  json cfg = read_json(fs::path(gemma) / "config.json");
  cfg["architectures"] = {"GemmaForCausalLM"};
  cfg["model_type"] = "gemma";
  std::ofstream(fs::path(gemma) / "config.json") << cfg.dump();
  r = run_orchard(
      {"export", "gguf", "--model", gemma, "--out", tmp.file("e.gguf")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "Gemma")) << r.err;
}

} // namespace
} // namespace orchard
