#include "train/data_cache.h"

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/machine.h"
#include "data/shards.h"
#include "data/text_prep.h"
#include "data/wordnet.h"
#include "text/bpe_train.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer_io.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace orchard::train {
namespace {
namespace fs = std::filesystem;

// Whether cached shards can be reused: every one opens, and when the meta
// file (written last) records checksums, each matches; a cache a crash cut
// short, or whose bytes changed, is prepared again.
// With `inputs` (data_paths' files as data::input_fingerprint gives them),
// the cache is also prepared again when the files changed since, or when
// it predates the record.
bool shards_intact(
    const std::vector<std::string>& paths,
    const std::string& meta_path,
    const std::function<void(const std::string&)>& say,
    const nlohmann::json& inputs = nullptr) {
  if (paths.empty() || !fs::exists(meta_path))
    return false;
  std::ifstream in(meta_path);
  auto meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!inputs.is_null()) {
    const bool recorded = meta.is_object() && meta.contains("inputs") &&
        meta["inputs"].is_object() && meta["inputs"].contains("auto");
    if (!recorded || meta["inputs"]["auto"] != inputs) {
      if (recorded)
        say("The data files changed since they were tokenized; tokenizing "
            "them again (the tokenizer stays).");
      return false;
    }
  }
  const nlohmann::json* files =
      meta.is_object() && meta.contains("files") ? &meta["files"] : nullptr;
  try {
    for (const auto& p : paths) {
      data::Shard::open(p);
      const std::string name = fs::path(p).filename().string();
      if (!files || !files->is_object() || !files->contains(name))
        continue; // a cache from before checksums were kept
      if (!matches_record((*files)[name], p)) {
        say("The cached shard " + p +
            " is damaged (its checksum changed); preparing the data again.");
        return false;
      }
    }
  } catch (const UserError&) {
    return false;
  }
  return true;
}

// Trains a tokenizer on `inputs` into `dir` unless one is there.
void ensure_tokenizer(
    const std::vector<std::string>& inputs,
    const std::string& dir,
    const std::function<void(const std::string&)>& say) {
  // A run killed while it saved the tokenizer left its temporary file.
  if (fs::is_directory(dir))
    remove_stale_temporaries(dir + "/tokenizer.json");
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    try {
      text::load_tokenizer(dir);
      return;
    } catch (const UserError&) {
      say("The cached tokenizer in " + dir + " is damaged; training it again.");
    }
  }
  say("Training a " + std::to_string(kDefaultVocabSize) +
      "-token tokenizer...");
  text::BpeTrainer trainer({.vocab_size = kDefaultVocabSize});
  for (const auto& f : data::list_input_files(inputs)) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    trainer.add_text(ss.str());
  }
  auto tok = trainer.train();
  fs::create_directories(dir);
  text::save_hf_tokenizer(tok, dir + "/tokenizer.json");
}

} // namespace

std::string cache_key(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

PreparedData prepare_pretraining_data(
    const PretrainConfig& cfg,
    const std::function<void(const std::string&)>& say) {
  std::string home = cfg.data_dir.empty() ? default_data_dir() : cfg.data_dir;
  PreparedData d;
  std::vector<std::string> train_inputs, val_inputs;
  std::string shard_dir, name;
  if (cfg.data_paths.empty()) {
    std::string corpus = home + "/wordnet";
    if (!fs::exists(corpus + "/text_train.jsonl") ||
        !fs::exists(corpus + "/text_val.jsonl")) {
      say("Building the default corpus from WordNet into " + corpus + "...");
      data::build_wordnet_corpus({.out = corpus});
    }
    train_inputs = {corpus + "/text_train.jsonl"};
    val_inputs = {corpus + "/text_val.jsonl"};
    d.tokenizer_dir =
        cfg.tokenizer.empty() ? home + "/tokenizer-wordnet" : cfg.tokenizer;
    shard_dir = home + "/shards-wordnet";
    name = "wordnet";
    d.description = "WordNet glosses (the default corpus)";
  } else {
    std::string key;
    for (const auto& p : cfg.data_paths)
      key += fs::absolute(p).string() + "\n";
    // The default split keeps the key of caches made before val_fraction
    // existed.
    if (cfg.val_fraction != kDefaultValFraction)
      key += "val_fraction=" + std::to_string(cfg.val_fraction) + "\n";
    std::string prepared = home + "/prepared/" + cache_key(key + cfg.tokenizer);
    train_inputs = cfg.data_paths;
    d.tokenizer_dir =
        cfg.tokenizer.empty() ? prepared + "/tokenizer" : cfg.tokenizer;
    shard_dir = prepared + "/shards";
    name = "data";
    d.description = std::to_string(cfg.data_paths.size()) + " data path(s)";
  }
  if (cfg.tokenizer.empty())
    ensure_tokenizer(train_inputs, d.tokenizer_dir, say);
  d.train_shards = data::find_shards(shard_dir, "train");
  d.val_shards = data::find_shards(shard_dir, "val");
  const std::string meta = shard_dir + "/" + name + "_meta.json";
  const nlohmann::json inputs = cfg.data_paths.empty()
      ? nlohmann::json(nullptr)
      : data::input_fingerprint(cfg.data_paths);
  if (!shards_intact(d.train_shards, meta, say, inputs) ||
      !shards_intact(d.val_shards, meta, say)) {
    say("Tokenizing " + d.description + " into " + shard_dir + "...");
    remove_tree(shard_dir);
    auto tok = text::load_tokenizer(d.tokenizer_dir);
    data::TextPrepOptions o;
    o.out = shard_dir;
    o.name = name;
    o.tokenizer_path = d.tokenizer_dir;
    o.val_fraction = cfg.val_fraction;
    o.val_fraction_option = "val_fraction";
    o.no_train_fix = ""; // val_fraction=0 is not a training option
    if (val_inputs.empty()) {
      o.inputs = train_inputs;
      data::prepare_text(tok, o);
    } else {
      o.inputs = train_inputs;
      o.split = "train";
      data::prepare_text(tok, o);
      o.inputs = val_inputs;
      o.split = "val";
      data::prepare_text(tok, o);
    }
    d.train_shards = data::find_shards(shard_dir, "train");
    d.val_shards = data::find_shards(shard_dir, "val");
  }
  if (d.val_shards.empty())
    throw UserError(
        "the data has no validation documents; give more text, split it into "
        "documents (blank lines between paragraphs of a .txt file, or one "
        "{\"text\": ...} per line of a .jsonl file).");
  return d;
}

} // namespace orchard::train
