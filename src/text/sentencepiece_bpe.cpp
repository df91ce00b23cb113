#include "text/sentencepiece_bpe.h"

#include "core/error.h"

#include <queue>
#include <utility>

namespace orchard::text {
namespace {

const std::string_view kMetaspace = "\xE2\x96\x81"; // U+2581, "▁"

// Bytes in the UTF-8 character that starts with `lead`; 1 for a byte that
// cannot start one, so invalid input still falls back to byte tokens.
size_t char_length(unsigned char lead) {
  if (lead < 0x80)
    return 1;
  if ((lead >> 5) == 0x6)
    return 2;
  if ((lead >> 4) == 0xE)
    return 3;
  if ((lead >> 3) == 0x1E)
    return 4;
  return 1;
}

uint64_t pair_key(TokenId left, TokenId right) {
  return (uint64_t(left) << 32) | right;
}

} // namespace

SentencePieceBpe::SentencePieceBpe(SentencePieceStyle style)
    : style_(std::move(style)) {
  words_apart_ = true;
  for (const auto& [text, id] : style_.vocab) {
    if (!text.empty() && char_length(text[0]) == text.size())
      chars_.emplace(text, id);
    for (size_t i = 1; i < text.size(); ++i)
      if (text[i] == ' ' && text[i - 1] != ' ')
        words_apart_ = false;
  }
  pairs_.reserve(style_.merges.size());
  for (size_t r = 0; r < style_.merges.size(); ++r) {
    const auto& m = style_.merges[r];
    // The first listing of a pair wins, as in Hugging Face's BPE.
    pairs_.emplace(pair_key(m[0], m[1]), Merge{uint32_t(r), m[2]});
  }
  style_.vocab.clear(); // only chars_ needs it
  style_.vocab.shrink_to_fit();
}

void SentencePieceBpe::encode(
    std::string_view text,
    TextStart at,
    std::vector<TokenId>& out) const {
  using P = SentencePieceStyle::Prepend;
  const bool starts_with_space = !text.empty() &&
      (text[0] == ' ' || text.substr(0, kMetaspace.size()) == kMetaspace);
  bool prepend = false;
  if (text.empty())
    return; // no "▁" for an empty piece either
  switch (style_.prepend) {
    case P::Never:
      break;
    case P::First:
      prepend = at == TextStart::Input && !starts_with_space;
      break;
    case P::Always:
      prepend = at != TextStart::Continued && !starts_with_space;
      break;
    case P::Legacy:
      prepend = at != TextStart::Continued;
      break;
  }
  // Spaces are " " in the stored tokens, so a literal "▁" is one too.
  std::string norm = prepend ? " " : "";
  norm.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kMetaspace.size()) == kMetaspace) {
      norm += ' ';
      i += kMetaspace.size();
    } else {
      norm += text[i++];
    }
  }
  if (!style_.split_words && !words_apart_) {
    encode_word(norm, out);
    return;
  }
  // Metaspace split: every space starts a new word ("a  b" -> "a", " ",
  // " b"). Words apart: a space after another character does ("a  b" ->
  // "a", "  b"), which changes nothing but the speed.
  std::string_view all(norm);
  size_t start = 0;
  for (size_t i = 1; i <= all.size(); ++i)
    if (i == all.size() ||
        (all[i] == ' ' && (style_.split_words || all[i - 1] != ' '))) {
      encode_word(all.substr(start, i - start), out);
      start = i;
    }
}

void SentencePieceBpe::encode_word(
    std::string_view word,
    std::vector<TokenId>& out) const {
  if (word.empty())
    return;
  // Symbols: one per character (or per byte of an unknown character), in
  // a doubly linked list; a merged-away symbol has len 0.
  struct Symbol {
    TokenId id;
    int prev, next;
    size_t len;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto push = [&](TokenId id, size_t len) {
    int i = int(syms.size());
    syms.push_back({id, i - 1, i + 1, len});
  };
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min(char_length(word[i]), word.size() - i);
    auto it = chars_.find(std::string(word.substr(i, n)));
    if (it != chars_.end()) {
      push(it->second, n);
      last_unk = false;
    } else if (style_.byte_tokens) {
      for (size_t b = 0; b < n; ++b)
        push((*style_.byte_tokens)[(unsigned char)word[i + b]], 1);
      last_unk = false;
    } else if (style_.unk) {
      if (last_unk && style_.fuse_unk)
        syms.back().len += n;
      else
        push(*style_.unk, n);
      last_unk = true;
    } else {
      throw UserError(
          "the tokenizer has no token for the character '" +
          std::string(word.substr(i, n)) +
          "' and neither byte_fallback nor an unk_token to stand in for it.");
    }
    i += n;
  }
  syms.back().next = -1;

  // Hugging Face's order: the lowest-ranked pair first, the leftmost among
  // equals. A queued pair whose symbols changed since is skipped.
  struct Candidate {
    uint32_t rank;
    int pos;
    TokenId merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int left) {
    if (left < 0 || syms[left].next < 0)
      return;
    auto it = pairs_.find(pair_key(syms[left].id, syms[syms[left].next].id));
    if (it != pairs_.end())
      queue.push({it->second.rank, left, it->second.merged});
  };
  for (int i = 0; i + 1 < int(syms.size()); ++i)
    consider(i);
  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[c.pos];
    if (left.len == 0 || left.next < 0)
      continue;
    auto it = pairs_.find(pair_key(left.id, syms[left.next].id));
    if (it == pairs_.end() || it->second.merged != c.merged)
      continue;
    Symbol& right = syms[left.next];
    left.id = c.merged;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0)
      syms[left.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (const auto& s : syms)
    if (s.len > 0)
      out.push_back(s.id);
}

} // namespace orchard::text
