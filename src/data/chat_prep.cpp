#include "data/chat_prep.h"

#include "core/error.h"
#include "core/json.h"
#include "data/loader.h"
#include "data/text_prep.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orchard::data {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// A record that cannot be used; `where` is file:line.
struct BadRecord {
  std::string message;
};

std::string detect_format(const json& j) {
  if (j.is_object()) {
    if (j.contains("messages"))
      return "messages";
    if (j.contains("conversations"))
      return "sharegpt";
    if (j.contains("prompt") && j.contains("completion"))
      return "completion";
    if (j.contains("text"))
      return "text";
  }
  throw BadRecord{
      "cannot tell the format: expected \"messages\" (OpenAI), "
      "\"conversations\" (ShareGPT), \"prompt\"+\"completion\" or \"text\"; "
      "or pass --format"};
}

std::string string_field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string())
    throw BadRecord{std::string("\"") + key + "\" is missing or not a string"};
  const std::string& s = j[key].get_ref<const std::string&>();
  if (!valid_utf8(s))
    throw BadRecord{std::string("\"") + key + "\" is not valid UTF-8"};
  return s;
}

std::vector<text::Message> to_messages(
    const json& j,
    const std::string& format) {
  if (!j.is_object())
    throw BadRecord{"a record must be a JSON object"};
  std::vector<text::Message> msgs;
  if (format == "messages") {
    // contains() first: operator[] on a const object lacking the key is
    // undefined behaviour (a record unlike the file's first one).
    if (!j.contains("messages") || !j["messages"].is_array())
      throw BadRecord{"\"messages\" is missing or not a list"};
    for (const auto& m : j["messages"])
      msgs.push_back({string_field(m, "role"), string_field(m, "content")});
  } else if (format == "sharegpt") {
    if (!j.contains("conversations") || !j["conversations"].is_array())
      throw BadRecord{"\"conversations\" is missing or not a list"};
    for (const auto& m : j["conversations"]) {
      std::string from = string_field(m, "from");
      std::string role = from == "human" || from == "user" ? "user"
          : from == "gpt" || from == "assistant" || from == "model"
          ? "assistant"
          : from == "system" ? "system"
                             : "";
      if (role.empty())
        throw BadRecord{
            "unknown role '" + from + "' (ShareGPT: human, gpt, system)"};
      msgs.push_back({role, string_field(m, "value")});
    }
  } else if (format == "completion") {
    msgs.push_back({"user", string_field(j, "prompt")});
    msgs.push_back({"assistant", string_field(j, "completion")});
  }
  if (msgs.empty())
    throw BadRecord{"the conversation is empty"};
  for (const auto& m : msgs)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw BadRecord{
          "unknown role '" + m.role + "' (system, user or assistant)"};
  if (std::none_of(msgs.begin(), msgs.end(), [](const auto& m) {
        return m.role == "assistant";
      }))
    throw BadRecord{"the conversation has no assistant message to learn from"};
  return msgs;
}

} // namespace

bool valid_utf8(std::string_view s) {
  static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000}; // no overlongs
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      n = 1, cp = c & 0x1f;
    } else if ((c >> 4) == 0xe) {
      n = 2, cp = c & 0x0f;
    } else if ((c >> 3) == 0x1e) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= size_t(n))
      return false;
    for (int k = 1; k <= n; ++k) {
      unsigned char cc = s[i + k];
      if ((cc >> 6) != 2)
        return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

ChatPrepStats prepare_chat(
    const text::Tokenizer& tok,
    const text::ChatTemplate& tmpl,
    const ChatPrepOptions& opt) {
  static const char* formats[] = {
      "auto", "messages", "sharegpt", "completion", "text"};
  if (std::find(std::begin(formats), std::end(formats), opt.format) ==
      std::end(formats))
    throw UserError(
        "--format must be auto, messages, sharegpt, completion or text (got '" +
        opt.format + "').");
  if (opt.max_length < 2)
    throw UserError("--max-length must be at least 2.");
  ChatPrepStats st;
  auto files = list_input_files(opt.inputs);
  st.files = files.size();
  std::vector<Conversation> convs;
  const text::TokenId bos = bos_id(tok);

  auto handle = [&](const std::string& where,
                    const std::string& raw_or_empty,
                    const json* parsed,
                    std::string& format) {
    ++st.records;
    try {
      json j;
      if (parsed) {
        j = *parsed;
      } else {
        if (json_nesting(raw_or_empty) > kMaxJsonDepth)
          throw BadRecord{
              "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
        j = json::parse(raw_or_empty, nullptr, false);
        if (j.is_discarded())
          throw BadRecord{
              valid_utf8(raw_or_empty) ? "not valid JSON"
                                       : "not valid UTF-8 (JSON text must be)"};
      }
      if (format == "auto")
        format = detect_format(j);
      Conversation c;
      if (format == "text") {
        std::string text = string_field(j, "text");
        c.ids.push_back(bos);
        tok.encode_ordinary(text, c.ids);
        c.mask.assign(c.ids.size(), 1);
        c.mask[0] = 0;
      } else {
        auto messages = to_messages(j, format);
        text::Rendered r;
        try {
          r = tmpl.render(messages);
        } catch (const UserError& e) { // the template refused this record
          throw BadRecord{e.what()};
        }
        c.ids = std::move(r.ids);
        c.mask = std::move(r.mask);
      }
      if (c.ids.size() > opt.max_length) {
        c.ids.resize(opt.max_length);
        c.mask.resize(opt.max_length);
        ++st.truncated;
      }
      convs.push_back(std::move(c));
    } catch (const BadRecord& e) {
      std::string msg = where + ": " + e.message;
      if (!opt.skip_bad)
        throw UserError(msg + ".\n  " + opt.bad_record_hint, kExitFailure);
      ++st.bad;
      if (st.bad_examples.size() < 5)
        st.bad_examples.push_back(msg);
    }
  };

  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw UserError("cannot read '" + file + "'.", kExitFailure);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string content = ss.str();
    std::string format = opt.format; // detected per file
    size_t first = content.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && content[first] == '[') {
      json arr = json_nesting(content) > kMaxJsonDepth
          ? json(json::value_t::discarded)
          : json::parse(content, nullptr, false);
      if (arr.is_discarded() || !arr.is_array())
        throw UserError(
            file +
                (valid_utf8(content)
                     ? ": starts with '[' but is not a valid JSON array; fix it "
                       "or write one JSON object per line (JSONL)."
                     : ": is not valid UTF-8 (JSON text must be)."),
            kExitFailure);
      for (size_t i = 0; i < arr.size(); ++i)
        handle(file + ": item " + std::to_string(i + 1), "", &arr[i], format);
    } else {
      std::istringstream lines(content);
      std::string line;
      for (size_t n = 1; std::getline(lines, line); ++n)
        if (line.find_first_not_of(" \t\r") != std::string::npos)
          handle(file + ":" + std::to_string(n), line, nullptr, format);
    }
  }
  if (opt.subsample > 0 && opt.subsample < convs.size()) {
    // Orchard's own permutation: the same subset on every platform.
    std::vector<uint64_t> idx = permutation(convs.size(), opt.seed);
    idx.resize(opt.subsample);
    std::sort(idx.begin(), idx.end());
    std::vector<Conversation> kept;
    for (uint64_t i : idx)
      kept.push_back(std::move(convs[i]));
    convs = std::move(kept);
  }
  if (convs.empty())
    throw UserError("no usable conversations in the input.", kExitFailure);
  for (const auto& c : convs) {
    st.tokens += c.ids.size();
    st.trained_tokens += std::count(c.mask.begin(), c.mask.end(), 1);
  }
  st.written = convs.size();
  std::string name = opt.name.empty()
      ? fs::path(opt.inputs.front()).stem().string()
      : opt.name;
  fs::create_directories(opt.out);
  st.path = opt.out + "/" + name + ".chat";
  write_chat_file(st.path, convs);
  return st;
}

} // namespace orchard::data
