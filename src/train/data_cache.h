// Prepared pretraining data, cached under data_dir and reused: the
// tokenizer and the token shards are built once and checked (every shard's
// header and size) on each later run; a damaged cache is rebuilt.
//
// With no data_paths the data is the default corpus: WordNet's glosses
// (`orchard data wordnet`), a tokenizer trained on them, and its shards.
// With data_paths the text there is tokenized (with `tokenizer`, or one
// trained on the text) into a folder keyed by the paths.
#pragma once

#include "train/pretrain_config.h"

#include <functional>
#include <string>
#include <vector>

namespace orchard::train {

struct PreparedData {
  std::string tokenizer_dir;
  std::vector<std::string> train_shards, val_shards;
  std::string description; // "WordNet (default corpus)", "3 files"
};

// Vocabulary of tokenizers Orchard trains for pretraining data.
constexpr size_t kDefaultVocabSize = 8192;

// 16 hex digits naming a cache folder for `s` (FNV-1a).
std::string cache_key(const std::string& s);

PreparedData prepare_pretraining_data(
    const PretrainConfig& cfg,
    const std::function<void(const std::string&)>& say);

} // namespace orchard::train
