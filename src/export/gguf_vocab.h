// A Hugging Face tokenizer as GGUF's tokenizer.* metadata, for llama.cpp.
//
// Two kinds, as llama.cpp's `tokenizer.ggml.model` names them:
// - "gpt2": byte-level BPE (Llama 3, Qwen2, GPT-2). Tokens are stored in
//   the byte-to-unicode spelling tokenizer.json uses, with the merges, and
//   `tokenizer.ggml.pre` naming the split pattern llama.cpp should apply
//   (llama-bpe, qwen2, gpt-2), recognised from the pre-tokenizer's regex.
// - "llama": SentencePiece-style BPE (Llama 2, Mistral). llama.cpp merges
//   by token score, so real scores are needed: from tokenizer.model (the
//   SentencePiece protobuf) when the folder has one; otherwise from the
//   merges' order in tokenizer.json (a token made by merge r scores -r,
//   which is the order SentencePiece's own BPE scores give). A constant
//   score, what a naive conversion of tokenizer.json writes, makes llama.cpp
//   merge left to right and tokenise differently.
// Token types are llama.cpp's (and SentencePiece's) numbers: 1 normal,
// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
//
// Also the special ids (bos, eos, end of turn, unknown, padding), whether
// a BOS is added, and the chat template (tokenizer.chat_template).
#pragma once

#include "export/gguf_file.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::gguf {

struct VocabSummary {
  std::string model;       // "gpt2" or "llama"
  std::string pre;         // "llama-bpe", "qwen2", "gpt-2", "default"
  std::string scores_from; // "tokenizer.model", "merges", "" (byte-level)
  int64_t tokens = 0;      // including padding up to the model's vocab
  bool has_template = false;
  std::string chat_template;
  // Texts that end a turn (eos, <|eot_id|>, <|im_end|>, ...), for stop
  // sequences.
  std::vector<std::string> end_of_turn;
  std::string bos; // "" when there is none
  bool add_bos = false;
};

// Adds the tokenizer of `model_dir` to `meta`. `vocab_size`: the model's
// (embedding rows); the token list is padded to it. UserError for a
// missing or unsupported tokenizer.
VocabSummary add_vocab(
    const std::string& model_dir,
    int64_t vocab_size,
    Metadata& meta);

} // namespace orchard::gguf
