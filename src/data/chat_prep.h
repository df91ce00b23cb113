// Chat files -> tokenized conversations: `orchard data chat`.
//
// Accepts, detected per file from its first record (or forced with
// `format`): OpenAI messages {"messages":[{"role","content"}]}, ShareGPT
// {"conversations":[{"from","value"}]}, {"prompt","completion"} and
// {"text"}; as JSONL or as one JSON array. Conversations are rendered with a
// chat template (ids + loss mask); those longer than max_length are
// truncated and counted, never dropped. Bad records (malformed JSON, an
// unknown role, an empty conversation, invalid UTF-8) stop the command with
// file:line, unless skip_bad, which counts them instead.
#pragma once

#include "data/chat_file.h"
#include "text/chat_template.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::data {

struct ChatPrepOptions {
  std::vector<std::string> inputs;
  std::string out;  // folder
  std::string name; // "": the first input's name -> <out>/<name>.chat
  std::string format = "auto"; // auto|messages|sharegpt|completion|text
  size_t max_length = 1024;
  size_t subsample = 0; // 0: all
  uint64_t seed = 0;
  bool skip_bad = false;
  // What the error for a bad record tells the user to do.
  std::string bad_record_hint =
      "Fix the record, or pass --skip-bad to count and skip such records.";
};

struct ChatPrepStats {
  size_t files = 0, records = 0, written = 0, truncated = 0, bad = 0;
  uint64_t tokens = 0, trained_tokens = 0;
  std::vector<std::string> bad_examples; // the first few reasons
  std::string path;
};

// Whether `s` is well-formed UTF-8 (no overlongs, no surrogates).
bool valid_utf8(std::string_view s);

ChatPrepStats prepare_chat(
    const text::Tokenizer& tok,
    const text::ChatTemplate& tmpl,
    const ChatPrepOptions& opt);

} // namespace orchard::data
