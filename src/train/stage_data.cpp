#include "train/stage_data.h"

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/machine.h"
#include "data/chat_file.h"
#include "data/chat_prep.h"
#include "data/loader.h"
#include "data/shards.h"
#include "data/text_prep.h"
#include "data/wordnet.h"
#include "text/chat_template.h"
#include "text/tokenizer_io.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>

namespace orchard::train {
namespace {
namespace fs = std::filesystem;

constexpr size_t kValEvery = 20; // every 20th conversation validates
// Bump when a change in chat rendering or tokenizing changes the ids of
// prepared conversations (2: models' own Jinja templates).
constexpr const char* kChatRendering = "render-2";

// Paths with their sizes and modification times: a changed file gets a
// new cache folder.
std::string files_key(const std::vector<std::string>& files) {
  std::string key;
  std::error_code ec;
  for (const auto& f : files) {
    key += fs::absolute(f).string() + "|" +
        std::to_string(fs::file_size(f, ec)) + "|" +
        std::to_string(fs::last_write_time(f, ec).time_since_epoch().count()) +
        "\n";
  }
  return key;
}

// Each cache folder's record of its files' sizes and CRC-32Cs, written
// last into the folder before it is renamed into place.
constexpr const char* kChecksums = "checksums.json";

// Whether the cached files `paths` (of one folder) can be reused: each
// opens with `open`, and matches the size and checksum the folder recorded
// (a cache from before checksums were kept is trusted on opening alone).
// A damaged file is named, and the cache prepared again.
bool cache_intact(
    const std::vector<std::string>& paths,
    const std::function<void(const std::string&)>& open,
    const std::function<void(const std::string&)>& say) {
  if (paths.empty())
    return false;
  const fs::path record = fs::path(paths[0]).parent_path() / kChecksums;
  nlohmann::json files;
  if (fs::exists(record)) {
    std::ifstream in(record);
    files = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!files.is_object()) {
      say("The record " + record.string() +
          " is damaged; preparing the data again.");
      return false;
    }
  }
  try {
    for (const auto& p : paths) {
      open(p);
      const std::string name = fs::path(p).filename().string();
      if (files.is_null())
        continue;
      if (!files.contains(name) || !matches_record(files[name], p)) {
        say("The cached file " + p +
            " is damaged (its checksum changed); preparing the data again.");
        return false;
      }
    }
  } catch (const UserError&) {
    return false;
  }
  return true;
}

void open_chat_file(const std::string& path) {
  data::ChatFile::open(path);
}
void open_shard(const std::string& path) {
  data::Shard::open(path);
}

// Builds into a hidden folder, records its files' checksums and renames it
// into place, so a crash never leaves a half-prepared cache that a later
// run would trust, and changed bytes are found (cache_intact).
void build_atomically(
    const std::string& dir,
    const std::function<void(const std::string& tmp)>& build) {
  std::string tmp = dir + ".partial";
  remove_tree(tmp);
  fs::create_directories(tmp);
  build(tmp);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& e : fs::directory_iterator(tmp))
    if (e.is_regular_file())
      files[e.path().filename().string()] = checksum_record(e.path().string());
  atomic_write((fs::path(tmp) / kChecksums).string(), files.dump(1));
  remove_tree(dir);
  fs::rename(tmp, dir);
}

} // namespace

ChatData prepare_chat_data(
    const ChatDataSpec& spec,
    const std::function<void(const std::string&)>& say) {
  const std::string& tokenizer_dir = spec.tokenizer_dir;
  const std::string home =
      spec.data_dir.empty() ? default_data_dir() : spec.data_dir;
  std::vector<std::string> inputs;
  bool wordnet = spec.files.empty();
  ChatData d;
  if (wordnet) {
    std::string corpus = home + "/wordnet";
    if (!fs::exists(corpus + "/chat_train.jsonl") ||
        !fs::exists(corpus + "/chat_val.jsonl")) {
      say("Building the default corpus from WordNet into " + corpus + "...");
      data::build_wordnet_corpus({.out = corpus});
    }
    inputs = {corpus + "/chat_train.jsonl", corpus + "/chat_val.jsonl"};
    d.description = "WordNet's questions about words (held-out words validate)";
  } else {
    inputs = data::list_input_files(spec.files);
    if (inputs.empty())
      throw UserError(
          "chat_data names no files; give chat JSONL files or folders "
          "holding them.");
    d.description = std::to_string(inputs.size()) +
        " chat file(s) (every 20th conversation validates)";
  }
  const size_t max_length = size_t(spec.max_seq_len) + 1;
  const std::string family =
      spec.chat_template == "auto" ? "" : spec.chat_template;
  // The template's text and the rendering code's version are in the key:
  // a changed template, or a fix in how Orchard renders, re-tokenizes. (The
  // tokenizer is loaded only when there is tokenizing to do: it is most of
  // a small run's memory.)
  const std::string dir = home + "/chats/" +
      cache_key(files_key(inputs) + fs::absolute(tokenizer_dir).string() + "|" +
                std::to_string(max_length) + "|" + kChatRendering + "|" +
                text::chat_template_fingerprint(tokenizer_dir, family));
  d.train = dir + "/train.chat";
  d.val = dir + "/val.chat";
  if (cache_intact({d.train, d.val}, open_chat_file, say))
    return d;
  text::Tokenizer tok = text::load_tokenizer(tokenizer_dir);
  text::ChatTemplate tmpl =
      text::open_chat_template(tokenizer_dir, tok, family);
  say("Tokenizing " + d.description + " into " + dir +
      " (template: " + tmpl.describe() + ")...");
  build_atomically(dir, [&](const std::string& tmp) {
    data::ChatPrepOptions o;
    o.out = tmp;
    o.max_length = max_length;
    o.bad_record_hint =
        "Fix or remove the record: training reads every record and skips "
        "none.";
    if (wordnet) {
      o.inputs = {inputs[0]};
      o.name = "train";
      data::prepare_chat(tok, tmpl, o);
      o.inputs = {inputs[1]};
      o.name = "val";
      data::prepare_chat(tok, tmpl, o);
      return;
    }
    o.inputs = inputs;
    o.name = "all";
    auto st = data::prepare_chat(tok, tmpl, o);
    auto all = data::ChatFile::open(st.path);
    if (all.size() < 2)
      throw UserError(
          "chat_data holds " + std::to_string(all.size()) +
          " conversation(s); give at least 2 (every 20th validates).");
    std::vector<data::Conversation> train, val;
    for (size_t i = 0; i < all.size(); ++i) {
      data::Conversation c;
      c.ids.assign(all.ids(i), all.ids(i) + all.length(i));
      c.mask.assign(all.mask(i), all.mask(i) + all.length(i));
      // The first of every 20 (so even 2 conversations give 1 of each).
      (i % kValEvery == 0 ? val : train).push_back(std::move(c));
    }
    data::write_chat_file(tmp + "/train.chat", train);
    data::write_chat_file(tmp + "/val.chat", val);
    fs::remove(st.path);
  });
  return d;
}

MidData prepare_mid_data(
    const PretrainConfig& cfg,
    const ChatData& chats,
    const PreparedData& text,
    const std::function<void(const std::string&)>& say) {
  const std::string home =
      cfg.data_dir.empty() ? default_data_dir() : cfg.data_dir;
  std::vector<std::string> all = {chats.train, chats.val};
  all.insert(all.end(), text.train_shards.begin(), text.train_shards.end());
  all.insert(all.end(), text.val_shards.begin(), text.val_shards.end());
  const std::string dir = home + "/mid/" +
      cache_key(files_key(all) + "|" + std::to_string(cfg.mid_text_ratio) +
                "|" + std::to_string(cfg.seed));
  MidData d;
  d.train_shards = data::find_shards(dir, "train");
  d.val_shards = data::find_shards(dir, "val");
  std::vector<std::string> shards = d.train_shards;
  shards.insert(shards.end(), d.val_shards.begin(), d.val_shards.end());
  if (!d.train_shards.empty() && !d.val_shards.empty() &&
      cache_intact(shards, open_shard, say))
    return d;
  say("Mixing conversations with " +
      std::to_string(int(cfg.mid_text_ratio * 100 + 0.5)) +
      " % plain text into " + dir + "...");
  const text::Tokenizer tok = text::load_tokenizer(text.tokenizer_dir);
  const size_t vocab = tok.vocab_size();
  const uint32_t bos = data::bos_id(tok);
  build_atomically(dir, [&](const std::string& tmp) {
    auto mix = [&](const std::string& chat_path,
                   const std::vector<std::string>& shards,
                   const std::string& split) {
      auto cf = data::ChatFile::open(chat_path);
      auto order = data::permutation(cf.size(), uint64_t(cfg.seed));
      data::ShardWriter out(tmp, "mid", split, vocab, 100'000'000);
      const double want = cfg.mid_text_ratio / (1.0 - cfg.mid_text_ratio);
      uint64_t chat_tokens = 0, text_tokens = 0;
      size_t shard = 0, pos = 0;
      std::optional<data::Shard> current;
      // The next plain-text document (from one BOS to the next); empty
      // when the text is used up.
      auto next_document = [&]() -> std::vector<uint32_t> {
        std::vector<uint32_t> doc;
        while (shard < shards.size()) {
          if (!current)
            current = data::Shard::open(shards[shard]);
          while (pos < current->size()) {
            uint32_t t = (*current)[pos];
            if (!doc.empty() && t == bos)
              return doc; // the next document's BOS
            doc.push_back(t);
            ++pos;
          }
          current.reset();
          ++shard;
          pos = 0;
          if (!doc.empty())
            return doc;
        }
        return doc;
      };
      std::vector<uint32_t> ids;
      for (uint64_t i : order) {
        ids.assign(cf.ids(i), cf.ids(i) + cf.length(i));
        out.append(ids);
        chat_tokens += ids.size();
        while (double(text_tokens) < want * double(chat_tokens)) {
          auto doc = next_document();
          if (doc.empty())
            break;
          out.append(doc);
          text_tokens += doc.size();
        }
      }
      out.finish();
      if (split == "train") {
        d.chat_tokens = chat_tokens;
        d.text_tokens = text_tokens;
      }
    };
    mix(chats.train, text.train_shards, "train");
    mix(chats.val, text.val_shards, "val");
  });
  d.train_shards = data::find_shards(dir, "train");
  d.val_shards = data::find_shards(dir, "val");
  return d;
}

} // namespace orchard::train
