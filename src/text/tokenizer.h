// Byte-level BPE tokenizer: encode, decode, special tokens.
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
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<TokenId> encode(
      std::string_view text,
      const Allowed& allowed = Allowed::none()) const;
  // Appends to `out`; the fast path the benchmarks and data prep use.
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out) const;
  // Exact bytes; throws UserError for an id outside the vocabulary.
  std::string decode(const std::vector<TokenId>& ids) const;

  // One more than the largest id, specials included.
  size_t vocab_size() const;
  const std::map<std::string, TokenId>& special_tokens() const;
  std::optional<TokenId> special_id(const std::string& text) const;
  // The bytes of one id ("" and false when unknown).
  bool token_bytes(TokenId id, std::string& out) const;
  const std::string& pattern() const;
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
