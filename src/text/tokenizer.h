// Byte-level BPE tokenizer: encode, decode, special tokens. The same class
// also carries SentencePiece-style BPE (text/sentencepiece_bpe.h: Llama 2,
// Mistral), which encodes differently but decodes the same way.
//
// Tokens are byte strings. Encoding splits text with the pre-tokenizer, then
// merges each piece's bytes pairwise, always merging the adjacent pair whose
// concatenation has the lowest rank, until no pair is in the vocabulary
// (tiktoken's algorithm; for Hugging Face files the rank is the merge's index
// in `merges`). Ids and ranks coincide for tiktoken files and differ for HF
// ones, so each token carries both.
//
// Special tokens (<|bos|>, <|endoftext|>, ...) come out of encode() only
// when the caller allows them: user text that contains "<|bos|>" is encoded
// as the plain characters, so it cannot inject control tokens.
#pragma once

#include "text/pretokenizer.h"
#include "text/sentencepiece_bpe.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace orchard::text {

using TokenId = uint32_t;

struct Allowed {
  // all: every special token; otherwise only those named.
  bool all = false;
  std::set<std::string> names;
  static Allowed none() {
    return {};
  }
  static Allowed every() {
    return {true, {}};
  }
};

struct TokenEntry {
  std::string bytes;
  TokenId id;
  uint32_t rank; // merge priority; kNoRank for tokens no merge produces
};

class Tokenizer {
 public:
  static constexpr uint32_t kNoRank = UINT32_MAX;

  // `tokens`: every non-special token; `special`: text -> id.
  Tokenizer(
      std::vector<TokenEntry> tokens,
      std::map<std::string, TokenId> special,
      const std::string& pattern,
      std::string format);
  // SentencePiece-style: the tokens are `sp.vocab` and the byte tokens.
  Tokenizer(
      std::map<std::string, TokenId> special,
      SentencePieceStyle sp,
      std::string format);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<TokenId> encode(
      std::string_view text,
      const Allowed& allowed = Allowed::none()) const;
  // Appends to `out`; the fast path the benchmarks and data prep use.
  // `at`: where the text sits in the whole input (SentencePiece-style
  // tokenizers mark a start with a space; byte-level ones ignore it).
  void encode_ordinary(
      std::string_view text,
      std::vector<TokenId>& out,
      TextStart at = TextStart::Input) const;
  // Exact bytes; throws UserError for an id outside the vocabulary.
  std::string decode(const std::vector<TokenId>& ids) const;

  // One more than the largest id, specials included.
  size_t vocab_size() const;
  const std::map<std::string, TokenId>& special_tokens() const;
  std::optional<TokenId> special_id(const std::string& text) const;
  // The special token a document starts with: <|bos|> (Orchard),
  // <|endoftext|> (GPT-2, Qwen2), <|begin_of_text|> (Llama 3) or <s>
  // (Llama 2, Mistral); nullopt when there is none.
  std::optional<TokenId> document_start() const;
  // Special tokens that end a document: </s>, <|end_of_text|>.
  std::vector<TokenId> document_ends() const;
  // The bytes of one id ("" and false when unknown).
  bool token_bytes(TokenId id, std::string& out) const;
  // The pre-tokenizer's regex ("" for SentencePiece-style tokenizers).
  const std::string& pattern() const;
  // SentencePiece-style: decoded text starts each word with a space, the
  // first one of a text too.
  bool sentencepiece() const;
  // "tiktoken", "huggingface" or "orchard": where it was read from.
  const std::string& format() const;
  // Every non-special token, in id order.
  std::vector<TokenEntry> entries() const;
  // The two tokens whose merge produced `bytes` (BPE over its bytes using
  // only merges ranked below its own); empty for tokens no merge produces.
  // This recovers a merges list from a rank file.
  std::vector<std::string> merge_pair(const std::string& bytes) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace orchard::text
