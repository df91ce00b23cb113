// The pre-tokenizer: splits text into the pieces BPE merges within (words,
// number groups, punctuation runs, whitespace), with a PCRE2 regex compiled
// in UTF + Unicode-property mode and JIT-compiled.
//
// Not a textbook regex split: bytes that are not valid UTF-8 never match the
// pattern (PCRE2_MATCH_INVALID_UTF), so they become pieces of their own.
// Every byte of the input lands in exactly one piece, which is what makes
// decode(encode(s)) == s hold for any byte string.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace orchard::text {

// GPT-2 / r50k / p50k (tiktoken's "gpt2" pat_str).
extern const char* const kGpt2Pattern;
// GPT-4 (cl100k_base); Llama 3 uses the same.
extern const char* const kGpt4Pattern;

class Pretokenizer {
 public:
  explicit Pretokenizer(const std::string& pattern);
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Appends the pieces of `text` (views into it) to `out`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  const std::string& pattern() const {
    return pattern_;
  }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

} // namespace orchard::text
