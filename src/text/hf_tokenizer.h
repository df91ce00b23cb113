// Hugging Face tokenizer.json for byte-level BPE (GPT-2, Llama 3, Qwen2,
// and Orchard's own trained tokenizers) and SentencePiece-style BPE (Llama 2,
// Mistral; text/sentencepiece_bpe.h says how that form is recognised).
//
// Format facts (huggingface/tokenizers, "tokenizer.json"): model.type "BPE"
// with `vocab` {token string: id} and `merges` (["a b", ...] or [["a","b"],
// ...], in priority order); token strings spell bytes through GPT-2's
// byte-to-unicode table; the pre-tokenizer is either ByteLevel with
// use_regex (GPT-2's pattern) or a Sequence of Split(Regex) and ByteLevel;
// `added_tokens` lists the special tokens.
#pragma once

#include "text/tokenizer.h"

#include <string>

namespace orchard::text {

Tokenizer load_hf_tokenizer(const std::string& path);

// Writes `tok` as tokenizer.json (atomically); byte-level only. Merges come from
// Tokenizer::merge_pair, so a tokenizer read from a tiktoken rank file can
// be written too.
void save_hf_tokenizer(const Tokenizer& tok, const std::string& path);

// GPT-2's byte <-> printable-unicode table: bytes that are printable stand
// for themselves, the others map to U+0100 upwards.
std::string bytes_to_unicode(const std::string& bytes);
// Throws std::invalid_argument for a character outside the table.
std::string unicode_to_bytes(const std::string& text);

} // namespace orchard::text
