// Reading tokenizers from disk: tiktoken rank files and Hugging Face
// tokenizer.json, found from a folder or a file path.
#pragma once

#include "text/tokenizer.h"

#include <optional>
#include <string>

namespace orchard::text {

// A tokenizer compiled into the binary: a tiktoken rank file and its
// tiktoken.json. Only "gpt2" (GPT-2's byte-level BPE, 50,257 tokens).
struct BuiltinTokenizer {
  const char* ranks;
  const char* meta;
};
std::optional<BuiltinTokenizer> builtin_tokenizer(const std::string& name);

// A tiktoken rank file: "<base64 token bytes> <rank>" per line (the format of
// cl100k_base.tiktoken and of Llama 3's tokenizer.model). The pattern and
// special tokens come from a `tiktoken.json` beside it when present
// ({"pattern": ..., "special_tokens": {text: id}}); otherwise GPT-2's
// pattern for files named gpt2/r50k/p50k, GPT-4's for the rest.
Tokenizer load_tiktoken(const std::string& path);

// A folder holding tokenizer.json (Hugging Face) or a *.tiktoken file
// (tokenizer.model is tried as tiktoken), or such a file itself; or, where
// no such file or folder exists, a built-in tokenizer's name ("gpt2").
Tokenizer load_tokenizer(const std::string& path);

// How a run records the tokenizer it used: a path made absolute, or a
// built-in name as it is (where no such path exists).
std::string tokenizer_reference(const std::string& path);

// RFC 4648 base64 (with padding); throws std::invalid_argument on bad input.
std::string base64_decode(std::string_view in);

// Token ids written as whole numbers separated by blanks (what `orchard
// tokenizer encode` prints); UserError naming the first that is not one.
std::vector<TokenId> parse_token_ids(const std::string& text);

// Bytes with newlines, tabs and control bytes escaped (\n, \t, \xNN), for
// printing special tokens.
std::string printable(const std::string& bytes);
std::string base64_encode(std::string_view in);

} // namespace orchard::text
