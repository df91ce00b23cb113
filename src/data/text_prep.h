// Text files -> token shards: `orchard data text`.
//
// Documents: each .jsonl line {"text": ...} is one; a prose file (.txt,
// .md, .text, .rst) is split at blank lines into paragraphs, or at line
// breaks when it has no blank line (one paragraph per line), so a single book
// has documents for validation; any other file (source code) is one whole. Each
// document starts with the tokenizer's BOS token (<|bos|>, or
// <|endoftext|> / <|begin_of_text|> / <s> for foreign tokenizers). Every
// round(1 / val_fraction)-th document, starting with the first, goes to
// validation, so the split is deterministic and never empty.
#pragma once

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace orchard::data {

struct TextPrepOptions {
  std::vector<std::string> inputs; // files or folders
  std::string out;
  std::string name; // "": the first input's name
  double val_fraction = 0.005;
  // How the caller's command spells the option, for error messages
  // (`orchard train` takes val_fraction=...).
  std::string val_fraction_option = "--val-fraction";
  // The last fix the "everything went to validation" error names.
  std::string no_train_fix = "or use --val-fraction 0 (no validation split)";
  // "auto": split by val_fraction; "train" / "val": every document there
  // (for corpora that come already split, like the WordNet one).
  std::string split = "auto";
  size_t shard_tokens = 100'000'000; // modded-nanogpt's shard size
  std::string tokenizer_path;        // recorded in the meta file
};

struct TextPrepStats {
  size_t files = 0, documents = 0, train_documents = 0, val_documents = 0;
  uint64_t bytes = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_files, val_files;
};

// What the input files were when they were read: each file's path, size
// and modification time, in order. prepare_text records it in the meta
// file under "inputs" (per split), so a cache can tell edited data.
nlohmann::json input_fingerprint(const std::vector<std::string>& inputs);

// The BOS id documents start with; UserError when the tokenizer has none.
text::TokenId bos_id(const text::Tokenizer& tok);

// The documents of a prose file: paragraphs separated by blank lines, or
// lines when there is no blank line. Whitespace-only pieces are dropped.
std::vector<std::string_view> prose_documents(std::string_view text);

// Whether a file is prose (split into paragraphs) by its extension.
bool is_prose_file(const std::string& path);

// Every regular file under `inputs`, folders walked recursively, sorted.
std::vector<std::string> list_input_files(
    const std::vector<std::string>& inputs);

TextPrepStats prepare_text(
    const text::Tokenizer& tok,
    const TextPrepOptions& opt);

} // namespace orchard::data
