#include "text/hf_tokenizer.h"

#include "core/error.h"
#include "core/files.h"

#include <nlohmann/json.hpp>

#include <array>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace orchard::text {
namespace {

using json = nlohmann::json;

// byte -> code point, per GPT-2's encoder.py table.
const std::array<uint32_t, 256>& byte_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
          (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

} // namespace

std::string bytes_to_unicode(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes)
    append_utf8(out, byte_table()[b]);
  return out;
}

std::string unicode_to_bytes(const std::string& text) {
  static const std::unordered_map<uint32_t, unsigned char> inverse = [] {
    std::unordered_map<uint32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b)
      m[byte_table()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = text[i];
    uint32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1F) << 6) | (text[i + 1] & 0x3F);
      len = 2;
    } else {
      throw std::invalid_argument("character outside the byte-level table");
    }
    auto it = inverse.find(cp);
    if (it == inverse.end())
      throw std::invalid_argument("character outside the byte-level table");
    out += static_cast<char>(it->second);
    i += len;
  }
  return out;
}

Tokenizer load_hf_tokenizer(const std::string& path) {
  json j;
  {
    std::ifstream in(path);
    if (!in)
      throw UserError("cannot read '" + path + "'.");
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw UserError("'" + path + "' is not valid JSON: " + e.what());
    }
  }
  auto fail = [&](const std::string& what) -> UserError {
    return UserError("'" + path + "': " + what);
  };
  if (!j.contains("model") || !j["model"].is_object())
    throw fail("no \"model\" section; is this a Hugging Face tokenizer.json?");
  const json& model = j["model"];
  std::string type = model.value("type", "BPE");
  if (type != "BPE")
    throw fail(
        "model type '" + type +
        "' is not supported; Orchard reads byte-level BPE tokenizers (GPT-2, "
        "Llama 3, Qwen2). SentencePiece-style files (Llama 2, Mistral v0.1) "
        "are not byte-level.");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw fail("model.vocab is missing");

  // Pattern: ByteLevel(use_regex) means GPT-2's; a Split's Regex otherwise.
  std::string pattern;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence")
    for (const auto& s : pre["pretokenizers"])
      steps.push_back(s);
  else if (pre.is_object())
    steps.push_back(pre);
  bool byte_level = false;
  for (const auto& s : steps) {
    std::string t = s.value("type", "");
    if (t == "Split" && s.contains("pattern") && s["pattern"].contains("Regex"))
      pattern = s["pattern"]["Regex"].get<std::string>();
    else if (t == "ByteLevel") {
      byte_level = true;
      if (s.value("use_regex", true) && pattern.empty())
        pattern = kGpt2Pattern;
    }
  }
  if (!byte_level)
    throw fail(
        "the pre-tokenizer is not ByteLevel, so this is not a byte-level BPE "
        "tokenizer Orchard can read.");
  if (pattern.empty())
    pattern = kGpt2Pattern;

  std::vector<TokenEntry> tokens;
  std::unordered_map<std::string, size_t> index;
  try {
    for (const auto& [text, id] : model["vocab"].items()) {
      std::string bytes = unicode_to_bytes(text);
      index[bytes] = tokens.size();
      tokens.push_back({bytes, id.get<TokenId>(), Tokenizer::kNoRank});
    }
  } catch (const std::invalid_argument&) {
    throw fail("a vocab entry is not in GPT-2's byte-level alphabet.");
  }
  uint32_t rank = 0;
  for (const auto& m : model.value("merges", json::array())) {
    std::string a, b;
    if (m.is_string()) {
      std::string s = m.get<std::string>();
      auto sp = s.find(' ');
      if (sp == std::string::npos)
        throw fail("merge '" + s + "' is not two tokens separated by a space.");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw fail("a merge is neither \"a b\" nor [\"a\", \"b\"].");
    }
    std::string merged = unicode_to_bytes(a) + unicode_to_bytes(b);
    auto it = index.find(merged);
    if (it == index.end())
      throw fail("merge '" + a + " " + b + "' makes a token the vocab lacks.");
    TokenEntry& t = tokens[it->second];
    t.rank = std::min(t.rank, rank);
    ++rank;
  }
  std::map<std::string, TokenId> special;
  for (const auto& a : j.value("added_tokens", json::array())) {
    std::string content = a.value("content", "");
    TokenId id = a.value("id", 0u);
    auto it = index.find(content);
    // An ordinary token listed again, unless marked special (tokenizers'
    // BpeTrainer puts its special tokens in the vocabulary too).
    if (it != index.end() && tokens[it->second].id == id &&
        !a.value("special", false))
      continue;
    special[content] = id;
  }
  return Tokenizer(
      std::move(tokens), std::move(special), pattern, "huggingface");
}

void save_hf_tokenizer(const Tokenizer& tok, const std::string& path) {
  json vocab = json::object();
  std::vector<std::pair<uint32_t, std::string>> merges;
  for (const auto& e : tok.entries()) {
    vocab[bytes_to_unicode(e.bytes)] = e.id;
    auto pair = tok.merge_pair(e.bytes);
    if (pair.size() == 2)
      merges.push_back(
          {e.rank,
           bytes_to_unicode(pair[0]) + " " + bytes_to_unicode(pair[1])});
  }
  std::sort(merges.begin(), merges.end());
  json merge_list = json::array();
  for (auto& [r, m] : merges)
    merge_list.push_back(m);
  json added = json::array();
  for (const auto& [text, id] : tok.special_tokens())
    added.push_back(
        {{"id", id},
         {"content", text},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}});
  json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", tok.pattern()}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", merge_list}}}};
  atomic_write(path, j.dump(1) + "\n");
}

} // namespace orchard::text
