#include "data/text_prep.h"

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "data/shards.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
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

bool is_prose_file(const std::string& path) {
  auto ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) {
    return char(std::tolower(c));
  });
  return ext == ".txt" || ext == ".md" || ext == ".text" || ext == ".rst";
}

std::vector<std::string_view> prose_documents(std::string_view text) {
  auto blank = [](std::string_view line) {
    return line.find_first_not_of(" \t\r") == std::string_view::npos;
  };
  // Lines, each without its '\n'.
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos)
      end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  bool has_blank_line = std::any_of(lines.begin(), lines.end(), blank);
  std::vector<std::string_view> docs;
  if (!has_blank_line) {
    for (auto line : lines)
      if (!blank(line))
        docs.push_back(line);
    return docs;
  }
  // Paragraphs: runs of non-blank lines, kept as one view of the original
  // text (inner line breaks included).
  const char* begin = nullptr;
  const char* end = nullptr;
  for (auto line : lines) {
    if (blank(line)) {
      if (begin)
        docs.emplace_back(begin, size_t(end - begin));
      begin = nullptr;
      continue;
    }
    if (!begin)
      begin = line.data();
    end = line.data() + line.size();
  }
  if (begin)
    docs.emplace_back(begin, size_t(end - begin));
  return docs;
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

nlohmann::json input_fingerprint(const std::vector<std::string>& inputs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : list_input_files(inputs)) {
    std::error_code ec;
    const auto bytes = fs::file_size(f, ec);
    const auto when = fs::last_write_time(f, ec).time_since_epoch().count();
    out.push_back(
        {fs::absolute(f).string(), ec ? 0 : uint64_t(bytes), int64_t(when)});
  }
  return out;
}

TextPrepStats prepare_text(
    const text::Tokenizer& tok,
    const TextPrepOptions& opt) {
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1))
    throw UserError(
        opt.val_fraction_option + " must be at least 0 and below 1 (got " +
        std::to_string(opt.val_fraction) + ").");
  if (opt.split != "auto" && opt.split != "train" && opt.split != "val")
    throw UserError(
        "--split must be auto, train or val (got '" + opt.split + "').");
  TextPrepStats st;
  auto files = list_input_files(opt.inputs);
  const nlohmann::json fingerprint = input_fingerprint(opt.inputs);
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
      std::string text = ss.str();
      // Text never holds NUL bytes; a token shard, a model or an image
      // would otherwise be trained on as gibberish.
      if (text.find('\0') != std::string::npos)
        throw UserError(
            "'" + file +
                "' is not text (it holds NUL bytes: a token shard of "
                "`orchard data text`, a model file, an image?). Give text "
                "files (.txt, .md, source code), .jsonl files with one "
                "{\"text\": ...} per line, or folders of them; move binary "
                "files out of the folders given.",
            kExitFailure);
      if (is_prose_file(file))
        for (auto doc : prose_documents(text))
          add_document(doc);
      else
        add_document(text);
    }
  }
  train.finish();
  val.finish();
  if (st.train_documents == 0 && opt.split != "val")
    throw UserError(
        "all " + std::to_string(st.documents) +
            " document(s) went to validation: give more text or split it "
            "into documents (blank lines between the paragraphs of a .txt "
            "file, or one {\"text\": ...} per line of a .jsonl file)" +
            (opt.no_train_fix.empty() ? "" : ", " + opt.no_train_fix) + ".",
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
  if (!meta.contains("inputs") || !meta["inputs"].is_object())
    meta["inputs"] = nlohmann::json::object();
  meta["inputs"][opt.split] = fingerprint;
  // Each shard's size and checksum, for caches to verify before reuse.
  if (!meta.contains("files") || !meta["files"].is_object())
    meta["files"] = nlohmann::json::object();
  for (const auto* list : {&st.train_files, &st.val_files})
    for (const auto& f : *list)
      meta["files"][fs::path(f).filename().string()] = checksum_record(f);
  atomic_write(meta_path, meta.dump(2) + "\n");
  return st;
}

} // namespace orchard::data
