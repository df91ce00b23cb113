#include "text/tokenizer_io.h"

#include "core/error.h"
#include "text/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace orchard::text {
namespace {

namespace fs = std::filesystem;

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UserError("cannot read '" + path + "'.");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

std::string base64_decode(std::string_view in) {
  if (in.size() % 4 != 0)
    throw std::invalid_argument("length is not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = b64_value(c)) < 0)
        throw std::invalid_argument("invalid character");
    }
    uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>((n >> 16) & 0xff);
    if (pad < 2)
      out += static_cast<char>((n >> 8) & 0xff);
    if (pad < 1)
      out += static_cast<char>(n & 0xff);
  }
  return out;
}

std::string base64_encode(std::string_view in) {
  static const char* abc =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size())
      n |= uint32_t(uint8_t(in[i + 1])) << 8;
    if (i + 2 < in.size())
      n |= uint8_t(in[i + 2]);
    out += abc[(n >> 18) & 63];
    out += abc[(n >> 12) & 63];
    out += i + 1 < in.size() ? abc[(n >> 6) & 63] : '=';
    out += i + 2 < in.size() ? abc[n & 63] : '=';
  }
  return out;
}

namespace {

// A rank file's text; `meta_text` the tiktoken.json beside it ("" for
// none: the pattern then follows the file's name).
Tokenizer parse_tiktoken(
    const std::string& text,
    const std::string& path,
    const std::string& meta_text,
    const std::string& meta_path) {
  std::vector<TokenEntry> tokens;
  std::istringstream in(text);
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.empty())
      continue;
    auto space = line.find(' ');
    std::string where = path + ":" + std::to_string(line_no);
    if (space == std::string::npos)
      throw UserError(
          where +
          ": expected '<base64 token> <rank>', found no space; is this a "
          "tiktoken rank file?");
    std::string bytes;
    try {
      bytes = base64_decode(std::string_view(line).substr(0, space));
    } catch (const std::invalid_argument& e) {
      throw UserError(
          where + ": the token is not valid base64 (" + e.what() + ").");
    }
    char* end = nullptr;
    std::string rank_text = line.substr(space + 1);
    unsigned long rank = std::strtoul(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || rank >= Tokenizer::kNoRank)
      throw UserError(
          where + ": the rank '" + rank_text + "' is not a number.");
    tokens.push_back({std::move(bytes), TokenId(rank), uint32_t(rank)});
  }
  if (tokens.empty())
    throw UserError("'" + path + "' holds no tokens.");

  std::string pattern;
  std::map<std::string, TokenId> special;
  if (!meta_text.empty()) {
    try {
      auto j = nlohmann::json::parse(meta_text);
      pattern = j.at("pattern").get<std::string>();
      if (j.contains("special_tokens"))
        for (const auto& [k, v] : j["special_tokens"].items())
          special[k] = v.get<TokenId>();
    } catch (const nlohmann::json::exception& e) {
      throw UserError(
          "'" + meta_path +
          "' must be {\"pattern\": ..., \"special_tokens\": {text: id}}: " +
          e.what());
    }
  } else {
    std::string name = fs::path(path).filename().string();
    bool gpt2 = name.find("gpt2") != std::string::npos ||
        name.find("r50k") != std::string::npos ||
        name.find("p50k") != std::string::npos;
    pattern = gpt2 ? kGpt2Pattern : kGpt4Pattern;
  }
  return Tokenizer(std::move(tokens), std::move(special), pattern, "tiktoken");
}

} // namespace

Tokenizer load_tiktoken(const std::string& path) {
  fs::path meta = fs::path(path).parent_path() / "tiktoken.json";
  return parse_tiktoken(
      read_all(path),
      path,
      fs::exists(meta) ? read_all(meta.string()) : "",
      meta.string());
}

std::string tokenizer_reference(const std::string& path) {
  if (!fs::exists(path) && builtin_tokenizer(path))
    return path;
  return fs::absolute(path).string();
}

Tokenizer load_tokenizer(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p)) {
    if (auto b = builtin_tokenizer(path))
      return parse_tiktoken(
          b->ranks, "(built-in " + path + ")", b->meta, "(built-in)");
    throw UserError(
        "tokenizer '" + path +
        "' does not exist; give a folder holding tokenizer.json or a "
        "*.tiktoken rank file, the file itself, or gpt2 (built in).");
  }
  if (fs::is_directory(p)) {
    if (fs::exists(p / "tokenizer.json"))
      return load_hf_tokenizer((p / "tokenizer.json").string());
    for (const auto& e : fs::directory_iterator(p))
      if (e.path().extension() == ".tiktoken")
        return load_tiktoken(e.path().string());
    if (fs::exists(p / "tokenizer.model"))
      return load_tiktoken((p / "tokenizer.model").string());
    throw UserError(
        "folder '" + path +
        "' has no tokenizer: expected a *.tiktoken rank file or "
        "tokenizer.model.");
  }
  if (p.extension() == ".json")
    return load_hf_tokenizer(path);
  return load_tiktoken(path);
}

std::vector<TokenId> parse_token_ids(const std::string& text) {
  std::istringstream words(text);
  std::vector<TokenId> ids;
  std::string word;
  for (size_t n = 1; words >> word; ++n) {
    char* end = nullptr;
    unsigned long v = std::strtoul(word.c_str(), &end, 10);
    if (*end != '\0' || word[0] == '-' || v > UINT32_MAX)
      throw UserError(
          "decode input, token " + std::to_string(n) + ": '" + word +
          "' is not a token id (whole numbers separated "
          "by spaces, as `orchard tokenizer encode` prints).");
    ids.push_back(TokenId(v));
  }
  return ids;
}

std::string printable(const std::string& bytes) {
  std::ostringstream out;
  for (unsigned char c : bytes) {
    if (c == '\n')
      out << "\\n";
    else if (c == '\t')
      out << "\\t";
    else if (c < 0x20 || c == 0x7f)
      out << "\\x" << std::hex << int(c) << std::dec;
    else
      out << c;
  }
  return out.str();
}

} // namespace orchard::text
