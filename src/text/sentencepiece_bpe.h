// SentencePiece-style BPE, as tokenizer.json states it for Llama 2 and
// Mistral: merges start from Unicode characters, not bytes; a space is the
// character "▁" (U+2581) and the text gets one in front; a character the
// vocabulary lacks becomes the <0xXX> tokens of its UTF-8 bytes
// (byte_fallback), else the unknown token.
//
// How it differs from byte-level BPE (text/tokenizer.h):
// - no regex pre-tokenizer: unless Metaspace's `split` is on, the whole text
//   between two special tokens is one word, so merges may run over all of
//   it (a heap keeps that O(n log n)); when the vocabulary shows no merge
//   can cross a word start, words are encoded apart, which is faster;
// - merges are ranked pairs of ids (Hugging Face's BPE model), not the rank
//   of the merged bytes;
// - where a piece of text sits matters, because the leading "▁" goes only
//   where the file's scheme puts it (see Prepend).
//
// Format facts (huggingface/tokenizers): normalizer Sequence[Prepend("▁"),
// Replace(" ", "▁")] with no pre-tokenizer (Llama 2, Mistral v0.1: "legacy"),
// or no normalizer and pre_tokenizer Metaspace{replacement "▁",
// prepend_scheme first|always|never, split} (newer exports, Mistral v0.3).
// Token strings here are stored with "▁" already turned into " ", so
// decoding is plain concatenation.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace orchard::text {

using TokenId = uint32_t;

// Where a piece of text sits in the whole input. Byte-level BPE ignores it.
enum class TextStart {
  Input,        // the start of the input
  AfterSpecial, // right after a special token
  Continued,    // right after other text (one text split in two)
};

struct SentencePieceStyle {
  // Where the leading "▁" goes. Legacy (the Prepend normalizer): every
  // piece that starts the input or follows a special token, even one that
  // starts with a space. First: only the start of the input, unless it
  // starts with a space. Always: like Legacy, unless it starts with a space.
  enum class Prepend { Never, First, Always, Legacy };
  Prepend prepend = Prepend::Legacy;
  // Metaspace split: each "▁" starts a new word and merges stay in a word.
  bool split_words = false;
  // Ordinary tokens: text (spaces as " ") -> id.
  std::vector<std::pair<std::string, TokenId>> vocab;
  // Merges in priority order: left, right, merged.
  std::vector<std::array<TokenId, 3>> merges;
  // The ids of <0x00>..<0xFF> when the file has byte_fallback.
  std::optional<std::array<TokenId, 256>> byte_tokens;
  std::optional<TokenId> unk;
  bool fuse_unk = false;
};

class SentencePieceBpe {
 public:
  explicit SentencePieceBpe(SentencePieceStyle style);
  // Appends the ids of `text`. UserError for a character that has no
  // token, no byte tokens and no unknown token to fall back on.
  void encode(std::string_view text, TextStart at, std::vector<TokenId>& out)
      const;
  const SentencePieceStyle& style() const {
    return style_;
  }

 private:
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;
  SentencePieceStyle style_;
  std::unordered_map<std::string, TokenId> chars_; // one-character tokens
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  std::unordered_map<uint64_t, Merge> pairs_; // (left << 32 | right)
  // No token holds a space after another character, so no merge crosses
  // the start of a word ("x y" -> "x", " y") and words encode apart: the
  // same ids, in a heap per word rather than one over the whole text.
  bool words_apart_ = false;
};

} // namespace orchard::text
