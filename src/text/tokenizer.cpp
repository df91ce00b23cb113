#include "text/tokenizer.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace orchard::text {
namespace {

// A fast non-cryptographic hash for short byte strings (8 bytes per step,
// multiply-xorshift mixing). std::hash is noticeably slower here.
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
    const char* p = s.data();
    size_t n = s.size();
    while (n >= 8) {
      uint64_t v;
      std::memcpy(&v, p, 8);
      h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
      p += 8;
      n -= 8;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    h = (h ^ tail) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
  }
};
struct BytesEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept {
    return a == b;
  }
};

struct IdRank {
  TokenId id;
  uint32_t rank;
};

} // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, IdRank, BytesHash, BytesEq> by_bytes;
  std::vector<std::string> by_id; // id -> bytes (specials included)
  std::vector<bool> known;        // id is assigned
  std::map<std::string, TokenId> special;
  std::optional<Pretokenizer> special_all; // matches any special token
  std::optional<Pretokenizer> pre;         // byte-level BPE
  std::optional<SentencePieceBpe> sp;      // SentencePiece-style BPE
  std::string format;

  // Both constructors: ids, bytes, special tokens.
  void add_tokens(
      std::vector<TokenEntry> tokens,
      std::map<std::string, TokenId> special,
      const std::vector<std::pair<TokenId, std::string>>& unindexed = {});

  uint32_t rank_of(std::string_view bytes, uint32_t below = kNoRank) const {
    auto it = by_bytes.find(bytes);
    return it == by_bytes.end() || it->second.rank >= below ? kNoRank
                                                            : it->second.rank;
  }

  // The final part boundaries of a byte-pair merge of `piece`, using only
  // merges ranked below `below`.
  std::vector<size_t> merge_bounds(std::string_view piece, uint32_t below)
      const {
    const size_t n = piece.size();
    struct Part {
      size_t start;
      uint32_t rank;
    };
    std::vector<Part> parts;
    parts.reserve(n + 1);
    for (size_t i = 0; i + 1 < n; ++i)
      parts.push_back({i, rank_of(piece.substr(i, 2), below)});
    parts.push_back({n - 1, kNoRank});
    parts.push_back({n, kNoRank});
    // The rank of parts i and i+1 merged (parts has a sentinel at `n`).
    auto pair_rank = [&](size_t i) -> uint32_t {
      if (i + 2 >= parts.size())
        return kNoRank;
      return rank_of(
          piece.substr(parts[i].start, parts[i + 2].start - parts[i].start),
          below);
    };
    while (parts.size() > 2) {
      uint32_t best = kNoRank;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i)
        if (parts[i].rank < best) {
          best = parts[i].rank;
          at = i;
        }
      if (best == kNoRank)
        break;
      parts.erase(parts.begin() + at + 1);
      parts[at].rank = pair_rank(at);
      if (at > 0)
        parts[at - 1].rank = pair_rank(at - 1);
    }
    std::vector<size_t> bounds;
    for (const auto& p : parts)
      bounds.push_back(p.start);
    return bounds;
  }

  // tiktoken's byte-pair merge over one piece. parts[i] is the start of the
  // i-th part; rank[i] the rank of parts i and i+1 merged.
  void merge_piece(std::string_view piece, std::vector<TokenId>& out) const {
    if (piece.empty())
      return;
    auto whole = by_bytes.find(piece);
    if (whole != by_bytes.end()) {
      out.push_back(whole->second.id);
      return;
    }
    std::vector<size_t> bounds = merge_bounds(piece, kNoRank);
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      std::string_view bytes =
          piece.substr(bounds[i], bounds[i + 1] - bounds[i]);
      auto it = by_bytes.find(bytes);
      if (it == by_bytes.end())
        throw UserError(
            "the tokenizer has no token for a byte it needs: its vocabulary "
            "lacks some of the 256 single bytes (not a byte-level BPE file?)");
      out.push_back(it->second.id);
    }
  }
};

static std::string escape_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c))
      out += '\\';
    out += c;
  }
  return out;
}

void Tokenizer::Impl::add_tokens(
    std::vector<TokenEntry> tokens,
    std::map<std::string, TokenId> special_tokens,
    const std::vector<std::pair<TokenId, std::string>>& unindexed) {
  Impl& m = *this;
  TokenId max_id = 0;
  for (const auto& t : tokens)
    max_id = std::max(max_id, t.id);
  for (const auto& [id, bytes] : unindexed)
    max_id = std::max(max_id, id);
  for (const auto& [text, id] : special_tokens)
    max_id = std::max(max_id, id);
  // Ids index a table here: an id far past any real vocabulary (the largest
  // in use hold ~256k tokens) means a damaged file, not gigabytes to
  // allocate.
  constexpr TokenId kMaxTokenId = (TokenId(1) << 24) - 1;
  if (max_id > kMaxTokenId)
    throw UserError(
        "the tokenizer uses token id " + std::to_string(max_id) +
        ", past the largest Orchard accepts (" + std::to_string(kMaxTokenId) +
        "); the vocabulary file is damaged.");
  m.by_id.resize(size_t(max_id) + 1);
  m.known.assign(size_t(max_id) + 1, false);
  m.by_bytes.reserve(tokens.size() * 2);
  auto claim = [&](TokenId id) {
    if (m.known[id])
      throw UserError(
          "the tokenizer assigns id " + std::to_string(id) +
          " to two tokens; the vocabulary file is inconsistent.");
    m.known[id] = true;
  };
  for (auto& t : tokens) {
    claim(t.id);
    m.by_id[t.id] = t.bytes;
    m.by_bytes.emplace(std::move(t.bytes), IdRank{t.id, t.rank});
  }
  // Decoded, never looked up by their bytes (SentencePiece's byte tokens,
  // whose bytes other tokens spell too).
  for (const auto& [id, bytes] : unindexed) {
    claim(id);
    m.by_id[id] = bytes;
  }
  std::string alternation;
  for (const auto& [text, id] : special_tokens) {
    if (m.known[id] && m.by_id[id] != text)
      throw UserError(
          "special token '" + text + "' reuses id " + std::to_string(id) +
          " of an ordinary token.");
    m.known[id] = true;
    m.by_id[id] = text;
    alternation += (alternation.empty() ? "" : "|") + escape_regex(text);
  }
  m.special = std::move(special_tokens);
  if (!alternation.empty())
    m.special_all.emplace(alternation);
}

Tokenizer::Tokenizer(
    std::vector<TokenEntry> tokens,
    std::map<std::string, TokenId> special,
    const std::string& pattern,
    std::string format)
    : impl_(std::make_unique<Impl>()) {
  impl_->pre.emplace(pattern);
  impl_->format = std::move(format);
  impl_->add_tokens(std::move(tokens), std::move(special));
}

Tokenizer::Tokenizer(
    std::map<std::string, TokenId> special,
    SentencePieceStyle sp,
    std::string format)
    : impl_(std::make_unique<Impl>()) {
  std::vector<TokenEntry> tokens;
  tokens.reserve(sp.vocab.size());
  for (const auto& [text, id] : sp.vocab)
    tokens.push_back({text, id, kNoRank});
  std::vector<std::pair<TokenId, std::string>> bytes;
  if (sp.byte_tokens)
    for (int b = 0; b < 256; ++b)
      bytes.push_back({(*sp.byte_tokens)[size_t(b)], std::string(1, char(b))});
  impl_->format = std::move(format);
  impl_->add_tokens(std::move(tokens), std::move(special), bytes);
  impl_->sp.emplace(std::move(sp));
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::encode_ordinary(
    std::string_view text,
    std::vector<TokenId>& out,
    TextStart at) const {
  if (impl_->sp) {
    impl_->sp->encode(text, at, out);
    return;
  }
  std::vector<std::string_view> pieces;
  pieces.reserve(text.size() / 4 + 1);
  impl_->pre->split(text, pieces);
  for (auto piece : pieces)
    impl_->merge_piece(piece, out);
}

std::vector<TokenId> Tokenizer::encode(
    std::string_view text,
    const Allowed& allowed) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 1);
  if ((!allowed.all && allowed.names.empty()) || !impl_->special_all) {
    encode_ordinary(text, out);
    return out;
  }
  for (const auto& name : allowed.names)
    if (!impl_->special.count(name))
      throw UserError(
          "'" + name + "' is not a special token of this tokenizer.");
  // Every special token occurrence splits the text; allowed ones become
  // their id, the others stay text.
  std::vector<std::string_view> pieces;
  impl_->special_all->split(text, pieces);
  size_t ordinary_start = 0, pos = 0;
  for (auto piece : pieces) {
    auto it = impl_->special.find(std::string(piece));
    bool is_allowed = it != impl_->special.end() &&
        (allowed.all || allowed.names.count(it->first));
    if (is_allowed) {
      encode_ordinary(
          text.substr(ordinary_start, pos - ordinary_start),
          out,
          ordinary_start == 0 ? TextStart::Input : TextStart::AfterSpecial);
      out.push_back(it->second);
      ordinary_start = pos + piece.size();
    }
    pos += piece.size();
  }
  encode_ordinary(
      text.substr(ordinary_start),
      out,
      ordinary_start == 0 ? TextStart::Input : TextStart::AfterSpecial);
  return out;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const {
  std::string out;
  for (TokenId id : ids) {
    if (id >= impl_->by_id.size() || !impl_->known[id])
      throw UserError(
          "token id " + std::to_string(id) +
          " is not in the vocabulary (size " + std::to_string(vocab_size()) +
          ").");
    out += impl_->by_id[id];
  }
  return out;
}

size_t Tokenizer::vocab_size() const {
  return impl_->by_id.size();
}

const std::map<std::string, TokenId>& Tokenizer::special_tokens() const {
  return impl_->special;
}

std::optional<TokenId> Tokenizer::special_id(const std::string& text) const {
  auto it = impl_->special.find(text);
  if (it == impl_->special.end())
    return std::nullopt;
  return it->second;
}

std::optional<TokenId> Tokenizer::document_start() const {
  for (const char* name :
       {"<|bos|>", "<|endoftext|>", "<|begin_of_text|>", "<s>"})
    if (auto id = special_id(name))
      return id;
  return std::nullopt;
}

std::vector<TokenId> Tokenizer::document_ends() const {
  std::vector<TokenId> out;
  for (const char* name : {"</s>", "<|end_of_text|>"})
    if (auto id = special_id(name))
      out.push_back(*id);
  return out;
}

bool Tokenizer::token_bytes(TokenId id, std::string& out) const {
  if (id >= impl_->by_id.size() || !impl_->known[id])
    return false;
  out = impl_->by_id[id];
  return true;
}

const std::string& Tokenizer::pattern() const {
  static const std::string none;
  return impl_->pre ? impl_->pre->pattern() : none;
}

bool Tokenizer::sentencepiece() const {
  return impl_->sp.has_value();
}

const std::string& Tokenizer::format() const {
  return impl_->format;
}

std::vector<std::string> Tokenizer::merge_pair(const std::string& bytes) const {
  auto it = impl_->by_bytes.find(bytes);
  if (bytes.size() < 2 || it == impl_->by_bytes.end() ||
      it->second.rank == kNoRank)
    return {};
  std::vector<size_t> b = impl_->merge_bounds(bytes, it->second.rank);
  if (b.size() != 3) // not the merge of exactly two lower-ranked tokens
    return {};
  return {bytes.substr(0, b[1]), bytes.substr(b[1])};
}

std::vector<TokenEntry> Tokenizer::entries() const {
  std::vector<TokenEntry> out;
  out.reserve(impl_->by_bytes.size());
  for (const auto& [bytes, ir] : impl_->by_bytes)
    out.push_back({bytes, ir.id, ir.rank});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.id < b.id;
  });
  return out;
}

} // namespace orchard::text
