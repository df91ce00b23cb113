// Each reader as the fuzz tests drive it: the input's files are written into
// `dir`, then read through the reader's public entry point the way Orchard's
// commands do, and whatever was read is used (tensors copied, text encoded,
// conversations walked) so a bad offset cannot hide behind a lazy reader.
// The same functions run the fixed regression inputs.
#pragma once

#include <string>
#include <vector>

namespace orchard::fuzz {

// A file name and its bytes.
struct File {
  std::string name;
  std::string bytes;
};
// What a failure report prints and saves: each file under a header line.
std::string describe(const std::vector<File>& files);

// core/safetensors: File::open, then every tensor read.
void read_safetensors(const std::string& bytes, const std::string& dir);
// core/safetensors: Reader::open of a folder whose index maps tensors to
// shards.
void read_safetensors_index(
    const std::string& index_json,
    const std::string& shard,
    const std::string& dir);
// text/hf_tokenizer: tokenizer.json (byte-level or SentencePiece), then an
// encode/decode round.
void read_hf_tokenizer(const std::string& json, const std::string& dir);
// text/tokenizer_io: a tiktoken rank file and its optional tiktoken.json
// ("" for none).
void read_tiktoken(
    const std::string& ranks,
    const std::string& meta,
    const std::string& dir);
// data/chat_prep: a chat file (JSONL or a JSON array) through `orchard data
// chat`, then the .chat file it wrote opened and walked.
void read_chat_jsonl(
    const std::string& content,
    const std::string& format,
    bool skip_bad,
    const std::string& dir);
// data/text_prep: a .jsonl of {"text"} records (or a plain .txt) through
// `orchard data text`, then every shard it wrote opened and read.
void read_text_jsonl(
    const std::string& content,
    bool jsonl,
    double val_fraction,
    const std::string& dir);
// core/config: a --config YAML file and key=value overrides resolved
// against a schema of every field kind; the resolved config written as YAML
// must read back to the same values.
void read_config(
    const std::string& yaml,
    const std::vector<std::string>& overrides,
    const std::string& dir);
// text/jinja through text/model_template: a chat template parsed and
// rendered for a conversation, with and without the generation prompt.
void read_jinja(const std::string& source);
// text/chat_template: a tokenizer folder's tokenizer_config.json (with its
// chat_template), opened as `orchard chat` / `data chat` do.
void read_tokenizer_config(const std::string& json, const std::string& dir);
// models/lora: a PEFT adapter folder's adapter_config.json.
void read_adapter_config(const std::string& json, const std::string& dir);
// data/shards: a .bin token shard, opened and read whole.
void read_shard(const std::string& bytes, const std::string& dir);
// data/chat_file: a .chat file, opened and every conversation walked.
void read_chat_file(const std::string& bytes, const std::string& dir);

// data/puzzles: a puzzle file as stage=trm reads it (`name` says the kind
// by its extension: .csv Sudoku or mazes, .jsonl grids, .chat
// conversations), every row's tokens checked against the vocabulary.
void read_puzzle_file(
    const std::string& name,
    const std::string& bytes,
    const std::string& dir);

// Valid seeds, built by Orchard's own writers or taken from the fixtures.
std::string seed_safetensors();
std::string seed_safetensors_index();
std::string seed_shard(bool wide);
std::string seed_chat_file();
// A Sudoku CSV, a maze CSV and a grid JSONL, each of a few records.
std::vector<File> seed_puzzle_files();
std::string seed_tiktoken_ranks();
std::string seed_tiktoken_meta();
std::vector<std::string> seed_chat_lines();
std::vector<std::string> seed_text_lines();
std::string seed_config_yaml();
std::vector<std::string> seed_overrides();
std::vector<std::string> seed_templates(); // the fixtures' chat templates
// Templates written to hang, exhaust memory or overflow: deep nesting, huge
// loops, huge numbers, a namespace that holds itself.
std::vector<std::string> hostile_templates();
std::string read_fixture(const std::string& relative);

} // namespace orchard::fuzz
