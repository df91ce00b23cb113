// Learning a byte-level BPE vocabulary from text.
//
// Text is split by the pre-tokenizer (GPT-4's pattern by default) and the
// pieces are counted; merges never cross a piece. Then, repeatedly, the most
// frequent adjacent pair of tokens (ties: the smaller pair of ids) becomes a
// new token, until the vocabulary is full. Only the words that contain the
// merged pair are rewritten, and pair counts are kept up to date
// incrementally with a lazily-invalidated max-heap, so each merge costs time
// proportional to where the pair occurs, not to the corpus.
//
// Ids are tiktoken-style: 0..255 the single bytes, then one per merge in
// order (id == rank), then the special tokens.
#pragma once

#include "text/tokenizer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::text {

// Orchard's chat special tokens (nanochat's names, plus system turns).
const std::vector<std::string>& orchard_special_tokens();

struct BpeTrainOptions {
  size_t vocab_size = 32768; // including the special tokens
  std::string pattern;       // "": GPT-4's
  std::vector<std::string> special_tokens = orchard_special_tokens();
};

struct BpeTrainStats {
  uint64_t bytes = 0, pieces = 0, unique_pieces = 0, merges = 0;
  double count_seconds = 0, merge_seconds = 0;
  // "Read 1.2 MB (... pieces, ... unique) in 0.3 s (4.0 MB/s); 2000
  // merges in 1.1 s."
  std::string summary() const;
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainOptions options);
  ~BpeTrainer();
  // Adds text to the counts (call once per document or chunk).
  void add_text(std::string_view text);
  // Learns the merges; `progress` gets (merges done, merges wanted).
  Tokenizer train(
      BpeTrainStats* stats = nullptr,
      const std::function<void(size_t, size_t)>& progress = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace orchard::text
