#include "text/hf_tokenizer.h"

#include "core/error.h"
#include "core/files.h"
#include "core/json.h"

#include <nlohmann/json.hpp>

#include <array>
#include <fstream>
#include <functional>
#include <optional>
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

namespace {

using Fail = std::function<UserError(const std::string&)>;

// The steps of a normalizer or pre-tokenizer (a Sequence's, or itself).
std::vector<json> steps_of(const json& j, const char* list) {
  std::vector<json> steps;
  if (j.is_object() && j.value("type", "") == "Sequence" && j.contains(list))
    for (const auto& s : j[list])
      steps.push_back(s);
  else if (j.is_object())
    steps.push_back(j);
  return steps;
}

const std::string kMetaspace = "\xE2\x96\x81"; // "▁"

// The SentencePiece form of the file, or nullopt for byte-level BPE: a
// Metaspace pre-tokenizer, or a normalizer that spells spaces "▁".
std::optional<SentencePieceStyle> sentencepiece_form(
    const json& j,
    const Fail& fail) {
  using P = SentencePieceStyle::Prepend;
  bool prepend = false, replace = false;
  std::vector<std::string> other;
  for (const auto& n : steps_of(j.value("normalizer", json()), "normalizers")) {
    std::string t = n.value("type", "");
    if (t == "Prepend" && n.value("prepend", "") == kMetaspace)
      prepend = true;
    else if (
        t == "Replace" && n.contains("pattern") &&
        n["pattern"].value("String", "") == " " &&
        n.value("content", "") == kMetaspace)
      replace = true;
    else
      other.push_back(t);
  }
  std::optional<json> meta;
  for (const auto& p :
       steps_of(j.value("pre_tokenizer", json()), "pretokenizers"))
    if (p.value("type", "") == "Metaspace")
      meta = p;
  if (!meta && !replace)
    return std::nullopt;
  if (!other.empty())
    throw fail(
        "the normalizer step '" + other[0] +
        "' is not supported; Orchard reads SentencePiece-style files whose "
        "normalizer is none, or Prepend(\"▁\") and Replace(\" \", \"▁\") "
        "(Llama 2, Mistral).");
  SentencePieceStyle sp;
  if (meta) {
    if (meta->value("replacement", kMetaspace) != kMetaspace)
      throw fail("a Metaspace replacement other than \"▁\" is not supported.");
    std::string scheme = meta->contains("prepend_scheme")
        ? meta->value("prepend_scheme", "always")
        : (meta->value("add_prefix_space", true) ? "always" : "never");
    if (prepend)
      scheme = "legacy"; // the normalizer already adds it
    if (scheme == "first")
      sp.prepend = P::First;
    else if (scheme == "always")
      sp.prepend = P::Always;
    else if (scheme == "never")
      sp.prepend = P::Never;
    else if (scheme == "legacy")
      sp.prepend = P::Legacy;
    else
      throw fail(
          "Metaspace prepend_scheme '" + scheme +
          "' is unknown (first, always or never).");
    sp.split_words = meta->value("split", true);
  } else {
    sp.prepend = prepend ? P::Legacy : P::Never;
  }
  return sp;
}

std::string replace_metaspace(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kMetaspace.size(), kMetaspace) == 0) {
      out += ' ';
      i += kMetaspace.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// "<0x0A>" -> 10; -1 for anything else.
int byte_token(const std::string& text) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>')
    return -1;
  int v = 0;
  for (char c : text.substr(3, 2)) {
    v *= 16;
    if (c >= '0' && c <= '9')
      v += c - '0';
    else if (c >= 'A' && c <= 'F')
      v += c - 'A' + 10;
    else
      return -1;
  }
  return v;
}

// A merge as its two token strings: "a b" or ["a", "b"].
std::pair<std::string, std::string> merge_parts(
    const json& m,
    const Fail& fail) {
  if (m.is_string()) {
    std::string s = m.get<std::string>();
    auto sp = s.find(' ');
    if (sp == std::string::npos)
      throw fail("merge '" + s + "' is not two tokens separated by a space.");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  throw fail("a merge is neither \"a b\" nor [\"a\", \"b\"].");
}

// Special tokens: added_tokens, less ordinary tokens listed again (unless
// marked special: tokenizers' BpeTrainer puts its special tokens in the
// vocabulary too).
std::map<std::string, TokenId> special_tokens(
    const json& j,
    const std::function<bool(const std::string&, TokenId)>& ordinary) {
  std::map<std::string, TokenId> special;
  for (const auto& a : j.value("added_tokens", json::array())) {
    std::string content = a.value("content", "");
    TokenId id = a.value("id", 0u);
    if (ordinary(content, id) && !a.value("special", false))
      continue;
    special[content] = id;
  }
  return special;
}

Tokenizer load_sentencepiece(
    const json& j,
    SentencePieceStyle sp,
    const Fail& fail) {
  const json& model = j["model"];
  std::unordered_map<std::string, TokenId> ids; // as the file spells them
  std::array<TokenId, 256> bytes{};
  int byte_count = 0;
  const bool fallback = model.value("byte_fallback", false);
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_unsigned())
      throw fail("vocab entry '" + text + "' has no id.");
    ids[text] = id.get<TokenId>();
    int b = fallback ? byte_token(text) : -1;
    if (b >= 0) {
      bytes[size_t(b)] = id.get<TokenId>();
      ++byte_count;
    } else {
      sp.vocab.push_back({replace_metaspace(text), id.get<TokenId>()});
    }
  }
  if (fallback && byte_count != 256)
    throw fail(
        "byte_fallback is on but the vocabulary has " +
        std::to_string(byte_count) +
        " of the 256 <0xXX> byte tokens; the file is incomplete.");
  if (fallback)
    sp.byte_tokens = bytes;
  for (const auto& m : model.value("merges", json::array())) {
    auto [a, b] = merge_parts(m, fail);
    auto l = ids.find(a), r = ids.find(b), merged = ids.find(a + b);
    if (l == ids.end() || r == ids.end() || merged == ids.end())
      throw fail(
          "merge '" + a + " " + b + "' uses or makes a token the vocab lacks.");
    sp.merges.push_back({l->second, r->second, merged->second});
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = ids.find(model["unk_token"].get<std::string>());
    if (it != ids.end())
      sp.unk = it->second;
  }
  sp.fuse_unk = model.value("fuse_unk", false);
  auto special = special_tokens(j, [&](const std::string& text, TokenId id) {
    auto it = ids.find(text);
    return it != ids.end() && it->second == id;
  });
  return Tokenizer(std::move(special), std::move(sp), "huggingface");
}

// A parsed tokenizer.json; json::exception for a value of the wrong type.
Tokenizer from_json(const json& j, const Fail& fail) {
  if (!j.contains("model") || !j["model"].is_object())
    throw fail("no \"model\" section; is this a Hugging Face tokenizer.json?");
  const json& model = j["model"];
  std::string type = model.value("type", "BPE");
  if (type != "BPE")
    throw fail(
        "model type '" + type +
        "' is not supported; Orchard reads BPE tokenizers: byte-level (GPT-2, "
        "Llama 3, Qwen2) and SentencePiece-style (Llama 2, Mistral). Unigram "
        "and WordPiece files are not BPE.");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw fail("model.vocab is missing");
  if (auto sp = sentencepiece_form(j, fail))
    return load_sentencepiece(j, std::move(*sp), fail);

  // Pattern: ByteLevel(use_regex) means GPT-2's; a Split's Regex otherwise.
  std::string pattern;
  bool byte_level = false;
  for (const auto& s :
       steps_of(j.value("pre_tokenizer", json()), "pretokenizers")) {
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
        "the pre-tokenizer is neither ByteLevel (byte-level BPE) nor Metaspace "
        "(SentencePiece-style BPE), the two kinds Orchard reads.");
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
    auto [a, b] = merge_parts(m, fail);
    std::string merged;
    try {
      merged = unicode_to_bytes(a) + unicode_to_bytes(b);
    } catch (const std::invalid_argument&) {
      throw fail(
          "merge '" + a + " " + b + "' is not in GPT-2's byte-level alphabet.");
    }
    auto it = index.find(merged);
    if (it == index.end())
      throw fail("merge '" + a + " " + b + "' makes a token the vocab lacks.");
    TokenEntry& t = tokens[it->second];
    t.rank = std::min(t.rank, rank);
    ++rank;
  }
  auto special = special_tokens(j, [&](const std::string& text, TokenId id) {
    auto it = index.find(text);
    return it != index.end() && tokens[it->second].id == id;
  });
  return Tokenizer(
      std::move(tokens), std::move(special), pattern, "huggingface");
}

} // namespace

Tokenizer load_hf_tokenizer(const std::string& path) {
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw UserError("cannot read '" + path + "'.");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  Fail fail = [&](const std::string& what) -> UserError {
    return UserError("'" + path + "': " + what);
  };
  if (json_nesting(text) > kMaxJsonDepth)
    throw fail(
        "nests deeper than " + std::to_string(kMaxJsonDepth) +
        " levels; this is not a tokenizer.json.");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError("'" + path + "' is not valid JSON: " + e.what());
  }
  try {
    return from_json(j, fail);
  } catch (const json::exception& e) {
    throw fail(std::string("unexpected structure: ") + e.what());
  }
}

void save_hf_tokenizer(const Tokenizer& tok, const std::string& path) {
  if (tok.sentencepiece())
    throw UserError(
        "writing a SentencePiece-style tokenizer.json is not supported; copy "
        "the model's own file instead.");
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
