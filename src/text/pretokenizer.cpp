#include "text/pretokenizer.h"

#include "core/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <mutex>

namespace orchard::text {

// Patterns as tiktoken states them (the npm `tiktoken` package's pat_str).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kGpt4Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  // Match data is per call; a thread-local pool would do, but one match
  // data per split() call costs ~100 ns, negligible against the matching.
  ~Impl() {
    if (code)
      pcre2_code_free(code);
  }
};

Pretokenizer::Pretokenizer(const std::string& pattern)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(pattern.data()),
      pattern.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
      &err,
      &offset,
      nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw UserError(
        "pre-tokenizer pattern does not compile at offset " +
        std::to_string(offset) + ": " + reinterpret_cast<char*>(msg) +
        "\n  pattern: " + pattern);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;

void Pretokenizer::split(
    std::string_view text,
    std::vector<std::string_view>& out) const {
  pcre2_match_data* md =
      pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = impl_->jit
        ? pcre2_jit_match(
              impl_->code, subject, text.size(), pos, 0, md, nullptr)
        : pcre2_match(impl_->code, subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) { // no further match: the rest is one piece
      out.push_back(text.substr(pos));
      break;
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t start = ov[0], end = ov[1];
    if (start > pos) // bytes no alternative matched (invalid UTF-8)
      out.push_back(text.substr(pos, start - pos));
    if (end == start) { // cannot happen with these patterns; never loop
      end = start + 1;
      out.push_back(text.substr(start, 1));
    } else {
      out.push_back(text.substr(start, end - start));
    }
    pos = end;
  }
  pcre2_match_data_free(md);
}

} // namespace orchard::text
