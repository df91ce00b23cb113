#include "fuzz/readers.h"

#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "data/chat_file.h"
#include "data/chat_prep.h"
#include "data/puzzles.h"
#include "data/shards.h"
#include "data/text_prep.h"
#include "models/lora.h"
#include "test_paths.h"
#include "text/chat_template.h"
#include "text/conversation.h"
#include "text/hf_tokenizer.h"
#include "text/model_template.h"
#include "text/pretokenizer.h"
#include "text/tokenizer_io.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace orchard::fuzz {
namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out)
    throw std::runtime_error("[fuzz] cannot write " + path);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("[fuzz] cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch folder for building a seed (one per process: ctest may run the
// fuzz tests in parallel).
std::string seed_dir(const std::string& what) {
  return (fs::temp_directory_path() /
          ("orchard-fuzz-seed-" + what + "-" + std::to_string(::getpid())))
      .string();
}

// Removes what an earlier input left in `dir`.
void clear(const std::string& dir) {
  remove_tree(dir); // not fs::remove_all: see core/files.h (PyTorch 2.x)
  fs::create_directories(dir);
}

// The tokenizer the chat, text and template readers render with: the Llama
// 3 fixture (byte-level BPE, <|begin_of_text|>, Llama 3 chat tokens).
const text::Tokenizer& llama_tokenizer() {
  static const text::Tokenizer tok = text::load_hf_tokenizer(
      std::string(ORCHARD_FIXTURES) + "/hf/llama/tokenizer.json");
  return tok;
}

const text::ChatTemplate& llama_template() {
  static const text::ChatTemplate t = text::open_chat_template(
      std::string(ORCHARD_FIXTURES) + "/hf/llama", llama_tokenizer());
  return t;
}

// Uses a loaded tokenizer the way the commands do: encode (with and
// without special tokens), decode, and check the ids are in range.
void exercise(const text::Tokenizer& tok) {
  const std::string text =
      "Hello world! It's 2026: 12345 caf\xc3\xa9 \xe2\x96\x81 na\xc3\xafve\n\t "
      " <|begin_of_text|><s></s>\xf0\x9f\x8d\x8e end";
  for (const auto& allowed : {text::Allowed::none(), text::Allowed::every()}) {
    std::vector<text::TokenId> ids = tok.encode(text, allowed);
    for (auto id : ids)
      if (id >= tok.vocab_size())
        throw std::logic_error(
            "[fuzz] encode gave id " + std::to_string(id) +
            " past vocab_size " + std::to_string(tok.vocab_size()));
    (void)tok.decode(ids);
  }
}

} // namespace

std::string describe(const std::vector<File>& files) {
  std::string out;
  for (const auto& f : files)
    out += "==== " + f.name + " (" + std::to_string(f.bytes.size()) +
        " bytes) ====\n" + f.bytes + "\n";
  return out;
}

std::string read_fixture(const std::string& relative) {
  return slurp(std::string(ORCHARD_FIXTURES) + "/" + relative);
}

// --- safetensors
// --------------------------------------------------------------

void read_safetensors(const std::string& bytes, const std::string& dir) {
  const std::string path = dir + "/model.safetensors";
  write_file(path, bytes);
  auto f = safetensors::File::open(path);
  int64_t total = 0;
  for (const auto& t : f.tensors())
    total += f.get(t.name).clone().numel();
  (void)total;
  (void)f.metadata();
}

void read_safetensors_index(
    const std::string& index_json,
    const std::string& shard,
    const std::string& dir) {
  clear(dir);
  write_file(dir + "/model.safetensors.index.json", index_json);
  write_file(dir + "/model-00001-of-00001.safetensors", shard);
  auto r = safetensors::Reader::open(dir);
  for (const auto& name : r.names())
    (void)r.get(name).clone();
}

std::string seed_safetensors() {
  std::string dir = seed_dir("st");
  fs::create_directories(dir);
  std::string path = dir + "/seed.safetensors";
  safetensors::save(
      path,
      {{"model.embed_tokens.weight",
        torch::arange(12, torch::kFloat32).view({3, 4})},
       {"model.norm.weight", torch::ones({4}, torch::kBFloat16)},
       {"model.step", torch::tensor(int64_t(7))},
       {"model.mask", torch::tensor({true, false, true})},
       {"model.empty", torch::zeros({0, 3}, torch::kUInt8)},
       {"model.half", torch::full({2, 2}, 0.5, torch::kFloat16)}},
      {{"format", "pt"}});
  std::string bytes = slurp(path);
  remove_tree(dir); // not fs::remove_all: see core/files.h (PyTorch 2.x)
  return bytes;
}

std::string seed_safetensors_index() {
  return R"({"metadata": {"total_size": 92}, "weight_map": {)"
         R"("model.embed_tokens.weight": "model-00001-of-00001.safetensors",)"
         R"("model.norm.weight": "model-00001-of-00001.safetensors",)"
         R"("model.half": "model-00001-of-00001.safetensors"}})";
}

// --- tokenizers
// -------------------------------------------------------------------

void read_hf_tokenizer(const std::string& json, const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  write_file(path, json);
  exercise(text::load_tokenizer(dir));
}

void read_tiktoken(
    const std::string& ranks,
    const std::string& meta,
    const std::string& dir) {
  clear(dir);
  write_file(dir + "/fuzz.tiktoken", ranks);
  if (!meta.empty())
    write_file(dir + "/tiktoken.json", meta);
  exercise(text::load_tokenizer(dir + "/fuzz.tiktoken"));
}

std::string seed_tiktoken_ranks() {
  std::string out;
  uint32_t rank = 0;
  for (int b = 0; b < 256; ++b)
    out += text::base64_encode(std::string(1, char(b))) + " " +
        std::to_string(rank++) + "\n";
  for (const char* merged :
       {"he",
        "ll",
        "hel",
        "hell",
        "hello",
        " w",
        "or",
        " wor",
        " worl",
        " world",
        "12",
        "123"})
    out += text::base64_encode(merged) + " " + std::to_string(rank++) + "\n";
  return out;
}

std::string seed_tiktoken_meta() {
  nlohmann::json j = {
      {"pattern", text::kGpt4Pattern},
      {"special_tokens", {{"<|endoftext|>", 268}, {"<|fim|>", 269}}}};
  return j.dump(1);
}

// --- chat and text records
// -------------------------------------------------------

void read_chat_jsonl(
    const std::string& content,
    const std::string& format,
    bool skip_bad,
    const std::string& dir) {
  clear(dir);
  data::ChatPrepOptions opt;
  opt.inputs = {dir + "/chat.jsonl"};
  write_file(opt.inputs[0], content);
  opt.out = dir + "/out";
  opt.format = format;
  opt.skip_bad = skip_bad;
  opt.max_length = 64;
  auto st = data::prepare_chat(llama_tokenizer(), llama_template(), opt);
  auto f = data::ChatFile::open(st.path);
  size_t tokens = 0;
  for (size_t i = 0; i < f.size(); ++i)
    for (size_t k = 0; k < f.length(i); ++k)
      tokens +=
          f.ids(i)[k] < llama_tokenizer().vocab_size() && f.mask(i)[k] <= 1;
  if (tokens != f.total_tokens())
    throw std::logic_error("[fuzz] the written .chat file does not read back");
}

void read_text_jsonl(
    const std::string& content,
    bool jsonl,
    double val_fraction,
    const std::string& dir) {
  clear(dir);
  data::TextPrepOptions opt;
  opt.inputs = {dir + (jsonl ? "/docs.jsonl" : "/docs.txt")};
  write_file(opt.inputs[0], content);
  opt.out = dir + "/out";
  opt.val_fraction = val_fraction;
  opt.shard_tokens = 64; // several shards from a small input
  auto st = data::prepare_text(llama_tokenizer(), opt);
  uint64_t tokens = 0;
  for (const auto& list : {st.train_files, st.val_files})
    for (const auto& file : list) {
      auto s = data::Shard::open(file);
      std::vector<uint32_t> ids(s.size());
      s.read(0, s.size(), ids.data());
      tokens += ids.size();
    }
  if (tokens != st.train_tokens + st.val_tokens)
    throw std::logic_error("[fuzz] the written shards do not read back");
}

std::vector<std::string> seed_chat_lines() {
  return {
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})",
      R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]})",
      R"({"conversations": [{"from": "human", "value": "Name a fruit."}, {"from": "gpt", "value": "Apple."}]})",
      R"({"prompt": "Say a", "completion": "a"})",
      R"({"text": "A plain document \u00e9 with \ud83c\udf4e."})",
  };
}

std::vector<std::string> seed_text_lines() {
  return {
      R"({"text": "The quick brown fox jumps over the lazy dog."})",
      R"({"text": "Caf\u00e9 na\u00efve \ud83c\udf4e 12345\n\nSecond paragraph."})",
      R"({"text": ""})",
      R"({"text": "<|begin_of_text|> special tokens are plain text here"})",
  };
}

// --- config
// -------------------------------------------------------------------------

namespace {

struct FuzzConfig {
  int64_t steps = 100;
  double learning_rate = 3e-4;
  bool compile = false;
  std::string device = "auto";
  std::string run = "default";
  std::vector<std::string> data_paths;
  std::optional<int64_t> batch_size;
  std::optional<double> warmup;
  struct Arch {
    int64_t n_embd = 64;
    int64_t n_layer = 2;
    double dropout = 0.0;
  } arch;
};

const config::Schema& fuzz_schema() {
  using C = FuzzConfig;
  using config::field;
  static const config::Schema s = [] {
    config::Schema s("fuzz config");
    s.add(
        {.key = "steps",
         .access = field(&C::steps),
         .help = "optimizer steps (e.g. 100)",
         .env = "FUZZ_STEPS",
         .min = 1,
         .max = 1e12});
    s.add(
        {.key = "learning_rate",
         .access = field(&C::learning_rate),
         .help = "peak learning rate (e.g. 3e-4)",
         .aliases = {"lr"},
         .min = 0});
    s.add({.key = "compile", .access = field(&C::compile), .help = "bool"});
    s.add(
        {.key = "device",
         .access = field(&C::device),
         .help = "auto|cpu|cuda",
         .choices = {"auto", "cpu", "cuda", "mps"}});
    s.add({.key = "run", .access = field(&C::run), .help = "run name"});
    s.add(
        {.key = "data_paths",
         .access = field(&C::data_paths),
         .help = "files, as [a,b]"});
    s.add(
        {.key = "batch_size",
         .access = field(&C::batch_size),
         .help = "rows per step, or auto",
         .min = 1});
    s.add({.key = "warmup", .access = field(&C::warmup), .help = "or auto"});
    s.add(
        {.key = "arch.n_embd",
         .access = field(&C::arch, &C::Arch::n_embd),
         .help = "width (e.g. 64)",
         .aliases = {"arch.hidden_size"},
         .min = 1,
         .max = 1 << 20});
    s.add(
        {.key = "arch.n_layer",
         .access = field(&C::arch, &C::Arch::n_layer),
         .help = "depth",
         .min = 1});
    s.add(
        {.key = "arch.dropout",
         .access = field(&C::arch, &C::Arch::dropout),
         .help = "dropout",
         .min = 0,
         .max = 1});
    return s;
  }();
  return s;
}

} // namespace

void read_config(
    const std::string& yaml,
    const std::vector<std::string>& overrides,
    const std::string& dir) {
  const std::string path = dir + "/run.yaml";
  write_file(path, yaml);
  config::Sources src;
  src.config_file = path;
  src.overrides = overrides;
  src.env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "FUZZ_STEPS")
      return "12";
    return std::nullopt;
  };
  FuzzConfig cfg;
  auto origins = config::resolve(fuzz_schema(), &cfg, src);
  // What Orchard writes as a run's config.yaml must read back the same.
  const std::string written = config::to_yaml(fuzz_schema(), &cfg, origins);
  write_file(dir + "/config.yaml", written);
  FuzzConfig again;
  config::Sources back;
  back.config_file = dir + "/config.yaml";
  back.env = [](const std::string&) { return std::optional<std::string>(); };
  try {
    config::resolve(fuzz_schema(), &again, back);
  } catch (const UserError& e) {
    throw std::logic_error(
        std::string("[fuzz] the written config.yaml does not read back: ") +
        e.what() + "\n" + written);
  }
  if (config::to_yaml(fuzz_schema(), &again) !=
      config::to_yaml(fuzz_schema(), &cfg))
    throw std::logic_error(
        "[fuzz] the written config.yaml reads back different values:\n" +
        written);
}

std::string seed_config_yaml() {
  return "# a run\n"
         "steps: 200\n"
         "lr: 1e-3\n"
         "compile: true\n"
         "device: cpu\n"
         "run: \"my run\"\n"
         "data_paths: [a.txt, \"b c.jsonl\"]\n"
         "batch_size: auto\n"
         "arch:\n"
         "  hidden_size: 128\n"
         "  n_layer: 4\n"
         "arch.dropout: 0.1\n";
}

std::vector<std::string> seed_overrides() {
  return {
      "steps=300",
      "arch.n_embd=256",
      "data_paths=[x.txt,y.txt]",
      "learning_rate=2e-4",
      "compile=false",
      "batch_size=auto",
      "warmup=0.1",
      "run=name with spaces"};
}

// --- templates
// -------------------------------------------------------------------

void read_jinja(const std::string& source) {
  const auto& tok = llama_tokenizer();
  text::ModelTemplate t(
      source, "fuzz.jinja", "<|begin_of_text|>", "<|eot_id|>", tok);
  t.define("date_string", "23 Nov 2026");
  std::vector<text::Message> conv = {
      {"system", "Be brief."},
      {"user", "Hi there"},
      {"assistant", "Hello! \xf0\x9f\x8d\x8e"},
      {"user", "Bye"}};
  (void)t.render(conv, true);
  conv.push_back({"assistant", "Bye."});
  auto r = t.render(conv, false);
  if (r.ids.size() != r.mask.size())
    throw std::logic_error("[fuzz] rendered ids and mask differ in length");
}

void read_tokenizer_config(const std::string& json, const std::string& dir) {
  clear(dir);
  write_file(dir + "/tokenizer_config.json", json);
  (void)text::chat_template_fingerprint(dir);
  (void)text::describe_chat_template(dir, llama_tokenizer());
  auto t = text::open_chat_template(dir, llama_tokenizer());
  std::vector<text::Message> conv = {{"user", "Hi"}, {"assistant", "Hello!"}};
  (void)t.render(conv);
}

std::vector<std::string> seed_templates() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(
           std::string(ORCHARD_FIXTURES) + "/chat_templates"))
    if (e.path().extension() == ".jinja")
      out.push_back(slurp(e.path().string()));
  std::sort(out.begin(), out.end()); // directory order differs by machine
  return out;
}

std::vector<std::string> hostile_templates() {
  std::vector<std::string> out;
  const size_t deep = 50000;
  std::string ifs, ends, parens(deep, '(');
  for (size_t i = 0; i < deep; ++i) {
    ifs += "{% if true %}";
    ends += "{% endif %}";
  }
  std::string fors, endfors;
  for (int i = 0; i < 6; ++i) {
    fors += "{% for x" + std::to_string(i) + " in range(100) %}";
    endfors += "{% endfor %}";
  }
  out.insert(
      out.end(),
      {
          "{% for i in range(10**9) %}x{% endfor %}",
          "{% for i in range(1000000) %}{% for j in range(1000000) %}{{ j "
          "}}{% endfor %}{% endfor %}",
          fors + "." + endfors,
          "{{ " + parens + "1" + std::string(deep, ')') + " }}",
          "{{ " + std::string(deep, '[') + std::string(deep, ']') + " }}",
          "{{ " + std::string(deep, '-') + "1 }}",
          "{{ 1" + std::string(deep / 10, '+') + " }}",
          ifs + "x" + ends,
          "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set "
          "ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
          "{{ 'x' * 60000000 ~ 'y' * 60000000 }}",
          "{{ 9223372036854775807 + 1 }}{{ -9223372036854775807 - 2 }}",
          "{{ (-9223372036854775807 - 1) // -1 }}{{ (-9223372036854775807 - "
          "1) % -1 }}",
          "{{ 4611686018427387904 * 4 }}",
          "{{ 99999999999999999999 }}",
          "{{ 1" + std::string(400, '0') + ".5 }}",
          "{{ range(-9223372036854775807 - 1, 9223372036854775807)|length }}",
          "{{ range(9223372036854775806, 9223372036854775807, 3)|list }}",
          "{{ range(0, -9223372036854775807 - 1, -1)|length }}",
          "{{ [1, [2, [3]]]|tojson(indent=1000000000) }}",
          "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}{{ ns|tojson "
          "}}",
          "{{ ('a' * 1000000).replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' * "
          "1000) }}",
          "{{ raise_exception('refused') }}",
          "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
          "{% for m in messages %}{{ m['content'][::-1] }}{{ loop.index "
          "}}{% endfor %}",
          "{{ messages[9223372036854775807] }}{{ messages[-9223372036854775807 "
          "- 1] }}{{ 'abc'[-9223372036854775807 - 1:] }}",
          "{{ 2 ** 64 }}{{ 2 ** -1 }}{{ (-2) ** 0.5 }}{{ 10 ** 400 }}",
      });
  return out;
}

// --- adapters
// -------------------------------------------------------------------

void read_adapter_config(const std::string& json, const std::string& dir) {
  write_file(dir + "/adapter_config.json", json);
  (void)models::read_adapter_config(dir);
}

// --- binary shards
// -------------------------------------------------------------

void read_shard(const std::string& bytes, const std::string& dir) {
  const std::string path = dir + "/fuzz_train_000000.bin";
  write_file(path, bytes);
  auto s = data::Shard::open(path);
  std::vector<uint32_t> ids(s.size());
  s.read(0, s.size(), ids.data());
  uint64_t sum = 0;
  for (size_t i = 0; i < s.size(); ++i)
    sum += s[i];
  (void)sum;
}

std::string seed_shard(bool wide) {
  std::string dir = seed_dir("shard");
  fs::create_directories(dir);
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 40; ++i)
    tokens.push_back(wide ? 65536 + i * 7 : i * 13);
  data::write_shard(dir + "/s.bin", tokens, wide ? 70000 : 300);
  std::string bytes = slurp(dir + "/s.bin");
  remove_tree(dir); // not fs::remove_all: see core/files.h (PyTorch 2.x)
  return bytes;
}

void read_chat_file(const std::string& bytes, const std::string& dir) {
  const std::string path = dir + "/fuzz.chat";
  write_file(path, bytes);
  auto f = data::ChatFile::open(path);
  uint64_t tokens = 0, sum = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    for (size_t k = 0; k < f.length(i); ++k)
      sum += f.ids(i)[k] + f.mask(i)[k];
    tokens += f.length(i);
  }
  if (tokens != f.total_tokens())
    throw std::logic_error("[fuzz] conversation lengths do not add up");
  (void)sum;
}

void read_puzzle_file(
    const std::string& name,
    const std::string& bytes,
    const std::string& dir) {
  const std::string path = dir + "/" + name;
  write_file(path, bytes);
  const data::PuzzleSet p = data::read_puzzles(path);
  const int64_t cells = p.seq_len();
  if (p.size() < 1 || cells < 1 || p.inputs.size(1) != cells ||
      p.labels.size(1) != cells || p.puzzle_ids.size(0) != p.size())
    throw std::logic_error("[fuzz] a puzzle set of inconsistent shapes");
  const auto in_range = [&](const torch::Tensor& t) {
    return (t >= 0).logical_and(t < p.vocab).all().item<bool>();
  };
  const auto labelled = p.labels.masked_fill(p.labels == data::kIgnoreLabel, 0);
  if (!in_range(p.inputs) || !in_range(labelled))
    throw std::logic_error("[fuzz] a token outside the vocabulary");
  if (p.puzzle_ids.min().item<int64_t>() < 0 ||
      p.puzzle_ids.max().item<int64_t>() >= p.num_puzzle_ids)
    throw std::logic_error("[fuzz] a puzzle id outside the embedding");
}

std::vector<File> seed_puzzle_files() {
  data::maze::GenerateOptions o;
  o.side = 7;
  o.min_path = 4;
  std::mt19937_64 rng(5);
  std::string mazes = std::string(data::kPuzzleCsvHeader) + "\n";
  for (int i = 0; i < 3; ++i) {
    const auto m = data::maze::generate(o, rng);
    mazes += "m," + m.question + "," + m.answer + "," +
        std::to_string(m.path_steps) + "\n";
  }
  namespace sd = data::sudoku;
  sd::GenerateOptions so;
  so.shape = sd::shape_for_cells(16);
  so.minimal = true;
  std::string sudoku = std::string(data::kPuzzleCsvHeader) + "\n";
  for (int i = 0; i < 3; ++i) {
    const auto p = sd::generate(so, rng);
    sudoku += "s," + sd::to_text(p.question) + "," + sd::to_text(p.answer) +
        "," + std::to_string(p.nodes) + "\n";
  }
  return {
      {"sudoku.csv", sudoku},
      {"mazes.csv", mazes},
      {"grids.jsonl",
       "{\"input\": [[1, 2], [3, 4]], \"output\": [[4, 3], [2, 1]], "
       "\"puzzle\": \"flip\"}\n"
       "{\"input\": [[0]], \"output\": [[9]]}\n"},
      {"chats.chat", seed_chat_file()}};
}

std::string seed_chat_file() {
  std::string dir = seed_dir("chat");
  fs::create_directories(dir);
  std::vector<data::Conversation> convs = {
      {{1, 2, 3, 4}, {0, 0, 1, 1}},
      {{5, 6}, {0, 1}},
      {{7, 8, 9, 10, 11, 12}, {0, 0, 0, 1, 1, 1}}};
  data::write_chat_file(dir + "/c.chat", convs);
  std::string bytes = slurp(dir + "/c.chat");
  remove_tree(dir); // not fs::remove_all: see core/files.h (PyTorch 2.x)
  return bytes;
}

} // namespace orchard::fuzz
