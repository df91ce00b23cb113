#include "text/bpe_train.h"
#include "core/clock.h"

#include "core/error.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace orchard::text {
namespace {

using Pair = uint64_t; // (left id << 32) | right id
Pair make_pair(uint32_t a, uint32_t b) {
  return (uint64_t(a) << 32) | b;
}

struct Word {
  std::vector<uint32_t> ids;
  uint64_t count = 0;
};

} // namespace

const std::vector<std::string>& orchard_special_tokens() {
  static const std::vector<std::string> tokens = {
      "<|bos|>",
      "<|user_start|>",
      "<|user_end|>",
      "<|assistant_start|>",
      "<|assistant_end|>",
      "<|system_start|>",
      "<|system_end|>",
  };
  return tokens;
}

struct BpeTrainer::Impl {
  BpeTrainOptions opt;
  Pretokenizer pre;
  std::unordered_map<std::string, uint64_t> counts;
  BpeTrainStats stats;
  std::vector<std::string_view> scratch;

  explicit Impl(BpeTrainOptions o)
      : opt(std::move(o)),
        pre(opt.pattern.empty() ? std::string(kGpt4Pattern) : opt.pattern) {}
};

BpeTrainer::BpeTrainer(BpeTrainOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  size_t minimum = 256 + impl_->opt.special_tokens.size();
  if (impl_->opt.vocab_size < minimum)
    throw UserError(
        "--vocab-size " + std::to_string(impl_->opt.vocab_size) +
        " is too small: the 256 byte tokens and " +
        std::to_string(impl_->opt.special_tokens.size()) +
        " special tokens alone need " + std::to_string(minimum) + ".");
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
  double t0 = now_s();
  impl_->scratch.clear();
  impl_->pre.split(text, impl_->scratch);
  for (auto piece : impl_->scratch)
    ++impl_->counts[std::string(piece)];
  impl_->stats.bytes += text.size();
  impl_->stats.pieces += impl_->scratch.size();
  impl_->stats.count_seconds += now_s() - t0;
}

Tokenizer BpeTrainer::train(
    BpeTrainStats* stats_out,
    const std::function<void(size_t, size_t)>& progress) {
  Impl& m = *impl_;
  double t0 = now_s();
  m.stats.unique_pieces = m.counts.size();

  std::vector<Word> words;
  words.reserve(m.counts.size());
  for (auto& [piece, count] : m.counts) {
    Word w;
    w.count = count;
    for (unsigned char c : piece)
      w.ids.push_back(c);
    words.push_back(std::move(w));
  }
  m.counts.clear();

  std::unordered_map<Pair, int64_t> pair_count;
  std::unordered_map<Pair, std::unordered_set<uint32_t>> pair_words;
  for (uint32_t wi = 0; wi < words.size(); ++wi) {
    const Word& w = words[wi];
    for (size_t i = 0; i + 1 < w.ids.size(); ++i) {
      Pair p = make_pair(w.ids[i], w.ids[i + 1]);
      pair_count[p] += int64_t(w.count);
      pair_words[p].insert(wi);
    }
  }
  // Max-heap on (count, then the smaller pair); stale entries are skipped.
  using Entry = std::pair<int64_t, Pair>;
  auto cmp = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (const auto& [p, c] : pair_count)
    heap.push({c, p});

  std::vector<std::string> bytes_of(256);
  for (int b = 0; b < 256; ++b)
    bytes_of[b] = std::string(1, char(b));
  const size_t wanted = m.opt.vocab_size - 256 - m.opt.special_tokens.size();
  std::unordered_map<Pair, int64_t> delta;

  while (bytes_of.size() - 256 < wanted && !heap.empty()) {
    auto [c, p] = heap.top();
    heap.pop();
    auto it = pair_count.find(p);
    if (it == pair_count.end() || it->second != c) {
      if (it != pair_count.end() && it->second > 0)
        heap.push({it->second, p});
      continue;
    }
    if (c < 1)
      break;
    uint32_t a = uint32_t(p >> 32), b = uint32_t(p & 0xffffffffu);
    uint32_t id = uint32_t(bytes_of.size());
    bytes_of.push_back(bytes_of[a] + bytes_of[b]);

    delta.clear();
    std::unordered_set<uint32_t> affected;
    affected.swap(pair_words[p]);
    for (uint32_t wi : affected) {
      Word& w = words[wi];
      int64_t n = int64_t(w.count);
      for (size_t i = 0; i + 1 < w.ids.size(); ++i)
        delta[make_pair(w.ids[i], w.ids[i + 1])] -= n;
      std::vector<uint32_t> merged;
      merged.reserve(w.ids.size());
      for (size_t i = 0; i < w.ids.size();) {
        if (i + 1 < w.ids.size() && w.ids[i] == a && w.ids[i + 1] == b) {
          merged.push_back(id);
          i += 2;
        } else {
          merged.push_back(w.ids[i++]);
        }
      }
      w.ids.swap(merged);
      for (size_t i = 0; i + 1 < w.ids.size(); ++i) {
        Pair q = make_pair(w.ids[i], w.ids[i + 1]);
        delta[q] += n;
        pair_words[q].insert(wi);
      }
    }
    for (const auto& [q, d] : delta) {
      if (d == 0)
        continue;
      int64_t& cnt = pair_count[q];
      cnt += d;
      if (cnt > 0 && d > 0)
        heap.push({cnt, q});
    }
    pair_count.erase(p);
    pair_words.erase(p);
    if (progress && (id - 255) % 256 == 0)
      progress(id - 255, wanted);
  }
  m.stats.merges = bytes_of.size() - 256;
  m.stats.merge_seconds = now_s() - t0;

  // rank == id, single bytes included (as in tiktoken files; a single byte's
  // rank is never used as a merge).
  std::vector<TokenEntry> tokens;
  for (uint32_t id = 0; id < bytes_of.size(); ++id)
    tokens.push_back({bytes_of[id], id, id});
  std::map<std::string, TokenId> special;
  TokenId next = TokenId(bytes_of.size());
  for (const auto& s : m.opt.special_tokens)
    special[s] = next++;
  if (stats_out)
    *stats_out = m.stats;
  return Tokenizer(
      std::move(tokens), std::move(special), m.pre.pattern(), "orchard");
}

std::string BpeTrainStats::summary() const {
  char line[256];
  std::snprintf(
      line,
      sizeof line,
      "Read %.1f MB (%llu pieces, %llu unique) in %.1f s (%.1f MB/s); %llu "
      "merges in %.1f s.",
      double(bytes) / 1e6,
      (unsigned long long)pieces,
      (unsigned long long)unique_pieces,
      count_seconds,
      double(bytes) / 1e6 / std::max(count_seconds, 1e-9),
      (unsigned long long)merges,
      merge_seconds);
  return line;
}

} // namespace orchard::text
