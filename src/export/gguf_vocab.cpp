#include "export/gguf_vocab.h"

#include "core/error.h"
#include "core/json.h"
#include "text/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace orchard::gguf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

enum TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The split patterns llama.cpp knows by name (llama-vocab.cpp), as
// tokenizer.json writes them.
const char* const kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Texts that end a turn in the chat families Orchard knows.
const char* const kEndOfTurnTexts[] =
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|eom_id|>"};

json read_json_file(const fs::path& path) {
  std::ifstream f(path);
  if (!f)
    throw UserError("cannot read " + path.string() + ".");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (json_nesting(text) > kMaxJsonDepth)
    throw UserError(
        path.string() + " nests too deeply to be a tokenizer file.");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(
        path.string() + " is not valid JSON (" + e.what() +
        "); re-save the model with save_pretrained.");
  }
}

// "special token" fields are a string or {"content": ...}.
std::string token_content(const json& v) {
  if (v.is_string())
    return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

// Whether any node of a pre-tokenizer or decoder tree has `type`.
bool has_type(const json& node, const std::string& type) {
  if (node.is_object()) {
    if (node.contains("type") && node["type"] == type)
      return true;
    for (const auto& [k, v] : node.items())
      if (has_type(v, type))
        return true;
  } else if (node.is_array()) {
    for (const auto& v : node)
      if (has_type(v, type))
        return true;
  }
  return false;
}

void split_patterns(const json& node, std::vector<std::string>& out) {
  if (node.is_object()) {
    if (node.contains("type") && node["type"] == "Split" &&
        node.contains("pattern") && node["pattern"].is_object() &&
        node["pattern"].contains("Regex") &&
        node["pattern"]["Regex"].is_string())
      out.push_back(node["pattern"]["Regex"].get<std::string>());
    for (const auto& [k, v] : node.items())
      split_patterns(v, out);
  } else if (node.is_array()) {
    for (const auto& v : node)
      split_patterns(v, out);
  }
}

std::string pre_tokenizer_name(const json& tj, const std::string& file) {
  const json pre = tj.value("pre_tokenizer", json());
  std::vector<std::string> patterns;
  split_patterns(pre, patterns);
  if (patterns.empty())
    return "gpt-2"; // ByteLevel with use_regex: GPT-2's own pattern
  if (patterns.size() == 1 && patterns[0] == kLlama3Split)
    return "llama-bpe";
  if (patterns.size() == 1 && patterns[0] == kQwen2Split)
    return "qwen2";
  throw UserError(
      file +
      ": the pre-tokenizer's split pattern is not one llama.cpp "
      "knows by name (Orchard maps Llama 3's to llama-bpe, Qwen2's to qwen2 "
      "and GPT-2's ByteLevel to gpt-2); this model's tokenizer cannot be "
      "exported to GGUF.");
}

bool is_byte_token(const std::string& t) {
  auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
  };
  return t.size() == 6 && t.rfind("<0x", 0) == 0 && hex(t[3]) && hex(t[4]) &&
      t[5] == '>';
}

// --- tokenizer.model: SentencePiece's ModelProto ----------------------------
// Protobuf facts: each field is a varint key (number << 3 | wire type);
// wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
// ModelProto field 1 = repeated SentencePiece {1: piece, 2: float score,
// 3: type}; other fields (trainer and normalizer specs) are skipped.
struct Piece {
  std::string text;
  float score = 0;
  int32_t type = kNormal;
};

struct ProtoReader {
  const std::string& buf;
  size_t pos, end;
  std::string file;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= end)
        break;
      const uint8_t b = static_cast<uint8_t>(buf[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80))
        return v;
    }
    throw UserError(file + " is truncated or not a SentencePiece model.");
  }
  // Skips a field's value; returns the sub-range of a length-delimited one.
  std::pair<size_t, size_t> skip(uint32_t wire) {
    size_t n = 0;
    switch (wire) {
      case 0:
        varint();
        return {pos, pos};
      case 1:
        n = 8;
        break;
      case 5:
        n = 4;
        break;
      case 2:
        n = static_cast<size_t>(varint());
        break;
      default:
        throw UserError(
            file + " is not a SentencePiece model (wire type " +
            std::to_string(wire) + ").");
    }
    if (n > end - pos)
      throw UserError(file + " is truncated.");
    pos += n;
    return {pos - n, pos};
  }
};

std::vector<Piece> read_sentencepiece_model(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw UserError("cannot read " + path.string() + ".");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string buf = ss.str();
  ProtoReader top{buf, 0, buf.size(), path.string()};
  std::vector<Piece> pieces;
  while (top.pos < top.end) {
    const uint64_t key = top.varint();
    auto [b, e] = top.skip(static_cast<uint32_t>(key & 7));
    if ((key >> 3) != 1 || (key & 7) != 2)
      continue;
    ProtoReader sub{buf, b, e, path.string()};
    Piece p;
    while (sub.pos < sub.end) {
      const uint64_t k = sub.varint();
      const uint32_t field = static_cast<uint32_t>(k >> 3), wire = k & 7;
      if (field == 2 && wire == 5) {
        if (sub.end - sub.pos < 4)
          throw UserError(path.string() + " is truncated.");
        std::memcpy(&p.score, buf.data() + sub.pos, 4);
        sub.pos += 4;
      } else if (field == 3 && wire == 0) {
        p.type = static_cast<int32_t>(sub.varint());
      } else {
        auto [sb, se] = sub.skip(wire);
        if (field == 1 && wire == 2)
          p.text.assign(buf, sb, se - sb);
      }
    }
    pieces.push_back(std::move(p));
  }
  if (pieces.empty())
    throw UserError(
        path.string() + " holds no pieces: not a SentencePiece model.");
  return pieces;
}

std::optional<int64_t> first_id(const json& v) {
  if (v.is_number_integer())
    return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer())
    return v[0].get<int64_t>();
  return std::nullopt;
}

} // namespace

VocabSummary add_vocab(
    const std::string& model_dir,
    int64_t vocab_size,
    Metadata& meta) {
  const fs::path dir(model_dir);
  const fs::path tok_path = dir / "tokenizer.json";
  if (!fs::exists(tok_path))
    throw UserError(
        "'" + model_dir +
        "' has no tokenizer.json; GGUF files carry their tokenizer, so copy "
        "the base model's tokenizer files into the folder (save it with "
        "tokenizer.save_pretrained).");
  const std::string file = tok_path.string();
  const json tj = read_json_file(tok_path);
  const json model = tj.value("model", json::object());
  if (model.value("type", "") != "BPE")
    throw UserError(
        file + ": model type '" + model.value("type", "?") +
        "' is not exported; Orchard writes BPE tokenizers (byte-level or "
        "SentencePiece-style) to GGUF.");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw UserError(file + " has no model.vocab.");
  json cfg = json::object();
  if (fs::exists(dir / "tokenizer_config.json"))
    cfg = read_json_file(dir / "tokenizer_config.json");

  const bool byte_level =
      has_type(tj.value("pre_tokenizer", json()), "ByteLevel") ||
      has_type(tj.value("decoder", json()), "ByteLevel");
  VocabSummary s;
  s.model = byte_level ? "gpt2" : "llama";
  s.pre = byte_level ? pre_tokenizer_name(tj, file) : "default";

  // Every id, padded to the model's vocabulary with unused tokens.
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), kUnused);
  std::vector<bool> set(static_cast<size_t>(vocab_size), false);
  std::map<std::string, int64_t> id_of;
  auto place = [&](int64_t id, const std::string& text, int32_t type) {
    if (id < 0 || id >= vocab_size)
      throw UserError(
          file + ": token '" + text + "' has id " + std::to_string(id) +
          ", outside the model's vocabulary of " + std::to_string(vocab_size) +
          " (config.json's vocab_size); the tokenizer does not belong to "
          "this model.");
    tokens[static_cast<size_t>(id)] = text;
    types[static_cast<size_t>(id)] = type;
    set[static_cast<size_t>(id)] = true;
    id_of[text] = id;
  };
  const std::string unk = token_content(model.value("unk_token", json()));
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      throw UserError(file + ": vocab entry '" + text + "' has no integer id.");
    int32_t type = kNormal;
    if (!byte_level && is_byte_token(text))
      type = kByte;
    else if (!unk.empty() && text == unk)
      type = kUnknown;
    place(id.get<int64_t>(), text, type);
  }
  for (const auto& a : tj.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("id") || !a.contains("content"))
      throw UserError(file + ": an added_tokens entry lacks id or content.");
    const std::string text = a["content"].get<std::string>();
    int32_t type = a.value("special", false) ? kControl : kUserDefined;
    if (!unk.empty() && text == unk)
      type = kUnknown;
    place(a["id"].get<int64_t>(), text, type);
  }
  for (int64_t i = 0; i < vocab_size; ++i)
    if (!set[static_cast<size_t>(i)])
      tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
  s.tokens = vocab_size;

  // Merges: "a b" strings or ["a", "b"] pairs.
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", json::array())) {
    if (m.is_string())
      merges.push_back(m.get<std::string>());
    else if (
        m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else
      throw UserError(file + ": a merges entry is neither \"a b\" nor [a, b].");
  }

  meta.add_string("tokenizer.ggml.model", s.model);
  meta.add_string("tokenizer.ggml.pre", s.pre);
  meta.add_strings("tokenizer.ggml.tokens", tokens);
  if (byte_level) {
    meta.add_i32s("tokenizer.ggml.token_type", types);
    meta.add_strings("tokenizer.ggml.merges", merges);
  } else {
    std::vector<float> scores(static_cast<size_t>(vocab_size), 0.0f);
    const fs::path sp = dir / "tokenizer.model";
    if (fs::exists(sp)) {
      s.scores_from = "tokenizer.model";
      const auto pieces = read_sentencepiece_model(sp);
      // Both files must describe one tokenizer: every piece where
      // tokenizer.json has the same id.
      const size_t in_json = model["vocab"].size();
      if (pieces.size() < in_json)
        throw UserError(
            sp.string() + " holds " + std::to_string(pieces.size()) +
            " pieces and tokenizer.json " + std::to_string(in_json) +
            ": it is cut short or another model's; remove it (scores then "
            "come from the merges) or copy the base model's.");
      for (size_t i = 0; i < pieces.size() && i < tokens.size(); ++i)
        if (set[i] && tokens[i] != pieces[i].text)
          throw UserError(
              sp.string() + " does not match tokenizer.json: id " +
              std::to_string(i) + " is '" + pieces[i].text + "' in one and '" +
              tokens[i] +
              "' in the other; copy both files from the same "
              "model.");
      for (size_t i = 0; i < pieces.size() && i < scores.size(); ++i) {
        scores[i] = pieces[i].score;
        if (types[i] == kNormal || types[i] == kUnused) {
          types[i] = pieces[i].type;
          if (!set[i])
            tokens[i] = pieces[i].text;
        }
      }
    } else {
      // A merge's result scores minus its rank; tokens no merge makes
      // score below every merge, so llama.cpp prefers what the merges do.
      s.scores_from = "merges";
      std::vector<bool> scored(static_cast<size_t>(vocab_size), false);
      for (size_t r = 0; r < merges.size(); ++r) {
        const auto space = merges[r].find(' ');
        const std::string merged =
            merges[r].substr(0, space) + merges[r].substr(space + 1);
        auto it = id_of.find(merged);
        if (it == id_of.end() || scored[static_cast<size_t>(it->second)])
          continue;
        scores[static_cast<size_t>(it->second)] = -static_cast<float>(r);
        scored[static_cast<size_t>(it->second)] = true;
      }
      for (int64_t i = 0; i < vocab_size; ++i)
        if (!scored[static_cast<size_t>(i)] &&
            types[static_cast<size_t>(i)] == kNormal)
          scores[static_cast<size_t>(i)] =
              -static_cast<float>(merges.size() + static_cast<size_t>(i));
    }
    meta.add_f32s("tokenizer.ggml.scores", scores);
    meta.add_i32s("tokenizer.ggml.token_type", types);
    // SentencePiece puts "▁" before the text unless told not to.
    bool prefix = true;
    const json pre = tj.value("pre_tokenizer", json());
    if (pre.is_object() && pre.value("type", "") == "Metaspace")
      prefix = pre.value("prepend_scheme", "always") != "never" &&
          pre.value("add_prefix_space", true);
    else if (!has_type(tj.value("normalizer", json()), "Prepend"))
      prefix = has_type(pre, "Metaspace");
    meta.add_bool("tokenizer.ggml.add_space_prefix", prefix);
  }

  // Special tokens.
  auto id_for = [&](const std::string& text) -> std::optional<int64_t> {
    auto it = id_of.find(text);
    if (text.empty() || it == id_of.end())
      return std::nullopt;
    return it->second;
  };
  json gen = json::object(), config = json::object();
  if (fs::exists(dir / "generation_config.json"))
    gen = read_json_file(dir / "generation_config.json");
  if (fs::exists(dir / "config.json"))
    config = read_json_file(dir / "config.json");
  std::optional<int64_t> bos =
      id_for(token_content(cfg.value("bos_token", json())));
  if (!bos && !cfg.contains("bos_token"))
    bos = first_id(
        gen.value("bos_token_id", config.value("bos_token_id", json())));
  std::optional<int64_t> eos =
      id_for(token_content(cfg.value("eos_token", json())));
  if (!eos)
    eos = first_id(
        gen.value("eos_token_id", config.value("eos_token_id", json())));
  if (bos) {
    meta.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*bos));
    s.bos = tokens[static_cast<size_t>(*bos)];
  }
  if (eos)
    meta.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*eos));
  if (auto u = id_for(unk))
    meta.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*u));
  if (auto p = id_for(token_content(cfg.value("pad_token", json()))))
    meta.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*p));
  for (const char* t : kEndOfTurnTexts)
    if (auto id = id_for(t)) {
      if (!meta.has("tokenizer.ggml.eot_token_id"))
        meta.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(*id));
      s.end_of_turn.push_back(t);
    }
  // Every id generation stops at (generation_config's list included).
  std::vector<int64_t> stops;
  if (eos)
    stops.push_back(*eos);
  const json gen_eos = gen.value("eos_token_id", json());
  if (gen_eos.is_array())
    for (const auto& v : gen_eos)
      if (v.is_number_integer())
        stops.push_back(v.get<int64_t>());
  for (int64_t id : stops)
    if (id >= 0 && id < vocab_size) {
      const std::string& t = tokens[static_cast<size_t>(id)];
      if (std::find(s.end_of_turn.begin(), s.end_of_turn.end(), t) ==
          s.end_of_turn.end())
        s.end_of_turn.push_back(t);
    }

  // Whether encoding adds BOS/EOS: tokenizer_config's flags, else the
  // post-processor's template.
  auto template_adds = [&](bool first) {
    const json pp = tj.value("post_processor", json());
    const json single = pp.is_object() ? pp.value("single", json()) : json();
    if (!single.is_array() || single.empty())
      return false;
    return (first ? single.front() : single.back()).contains("SpecialToken");
  };
  s.add_bos = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()
      ? cfg["add_bos_token"].get<bool>()
      : template_adds(true);
  const bool add_eos =
      cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()
      ? cfg["add_eos_token"].get<bool>()
      : template_adds(false);
  meta.add_bool("tokenizer.ggml.add_bos_token", s.add_bos && bos.has_value());
  meta.add_bool("tokenizer.ggml.add_eos_token", add_eos);

  if (auto t = text::read_chat_template(model_dir)) {
    s.has_template = true;
    s.chat_template = t->text;
    meta.add_string("tokenizer.chat_template", t->text);
  }
  return s;
}

} // namespace orchard::gguf
