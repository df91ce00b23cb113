#include "data/text_prep.h"

#include "core/error.h"
#include "core/files.h"
#include "data/shards.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orchard::data {
namespace fs = std::filesystem;

text::TokenId bos_id(const text::Tokenizer& tok) {
  if (auto id = tok.document_start())
    return *id;
  throw UserError(
      "the tokenizer has no <|bos|>, <|endoftext|>, <|begin_of_text|> or <s> "
      "token to separate documents with; train one with `orchard tokenizer "
      "train` (it adds <|bos|>).");
}

std::vector<std::string> list_input_files(
    const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    if (!fs::exists(in))
      throw UserError("--input '" + in + "' does not exist.");
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in))
        if (e.is_regular_file())
          found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  if (files.empty())
    throw UserError("--input names no files.");
  return files;
}

TextPrepStats prepare_text(
    const text::Tokenizer& tok,
    const TextPrepOptions& opt) {
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1))
    throw UserError(
        "--val-fraction must be at least 0 and below 1 (got " +
        std::to_string(opt.val_fraction) + ").");
  if (opt.split != "auto" && opt.split != "train" && opt.split != "val")
    throw UserError(
        "--split must be auto, train or val (got '" + opt.split + "').");
  TextPrepStats st;
  auto files = list_input_files(opt.inputs);
  st.files = files.size();
  std::string name = opt.name.empty()
      ? fs::path(opt.inputs.front()).stem().string()
      : opt.name;
  if (name.empty())
    name = "data";
  const size_t period = opt.val_fraction > 0
      ? std::max<size_t>(1, size_t(std::llround(1.0 / opt.val_fraction)))
      : 0;
  const text::TokenId bos = bos_id(tok);
  ShardWriter train(opt.out, name, "train", tok.vocab_size(), opt.shard_tokens);
  ShardWriter val(opt.out, name, "val", tok.vocab_size(), opt.shard_tokens);
  std::vector<uint32_t> ids;

  auto add_document = [&](std::string_view text) {
    ids.clear();
    ids.push_back(bos);
    tok.encode_ordinary(text, ids);
    bool is_val = opt.split == "val" ||
        (opt.split == "auto" && period > 0 && st.documents % period == 0);
    (is_val ? val : train).append(ids);
    (is_val ? st.val_tokens : st.train_tokens) += ids.size();
    ++(is_val ? st.val_documents : st.train_documents);
    ++st.documents;
    st.bytes += text.size();
  };

  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw UserError("cannot read '" + file + "'.", kExitFailure);
    if (fs::path(file).extension() == ".jsonl") {
      std::string line;
      for (size_t line_no = 1; std::getline(in, line); ++line_no) {
        if (line.find_first_not_of(" \t\r") == std::string::npos)
          continue;
        std::string where = file + ":" + std::to_string(line_no);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          throw UserError(
              where + ": not valid JSON (" + e.what() + ").", kExitFailure);
        }
        if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
          throw UserError(
              where +
                  ": expected {\"text\": \"...\"} (a .jsonl file holds one "
                  "document per line).",
              kExitFailure);
        add_document(j["text"].get_ref<const std::string&>());
      }
    } else {
      std::stringstream ss;
      ss << in.rdbuf();
      add_document(ss.str());
    }
  }
  train.finish();
  val.finish();
  if (st.train_documents == 0 && opt.split != "val")
    throw UserError(
        "all " + std::to_string(st.documents) +
            " document(s) went to validation; give more text or use "
            "--val-fraction 0.",
        kExitFailure);
  st.train_files = train.files();
  st.val_files = val.files();
  // One meta file per name; a --split train run and a --split val run each
  // fill in their own half.
  std::string meta_path = opt.out + "/" + name + "_meta.json";
  nlohmann::json meta = nlohmann::json::object();
  if (fs::exists(meta_path)) {
    std::ifstream old(meta_path);
    meta = nlohmann::json::parse(old, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object() ||
        meta.value("vocab_size", size_t(0)) != tok.vocab_size())
      meta = nlohmann::json::object();
  }
  meta["name"] = name;
  meta["tokenizer"] = opt.tokenizer_path;
  meta["vocab_size"] = tok.vocab_size();
  meta["bos_id"] = bos;
  if (opt.split != "val") {
    meta["train_documents"] = st.train_documents;
    meta["train_tokens"] = st.train_tokens;
  }
  if (opt.split != "train") {
    meta["val_documents"] = st.val_documents;
    meta["val_tokens"] = st.val_tokens;
  }
  atomic_write(meta_path, meta.dump(2) + "\n");
  return st;
}

} // namespace orchard::data
