// One fuzzing campaign per reader (see fuzz_harness.h). Each runs its seeds
// unchanged first, then mutated copies until ORCHARD_FUZZ_SECONDS is spent,
// and prints how many inputs it tried and how they ended.
#include "fuzz/fuzz_harness.h"
#include "fuzz/readers.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace orchard::fuzz {
namespace {

using test::TempDir;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  put_le(s, 0, v, 8);
  return s;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines)
    out += l + "\n";
  return out;
}

TEST(Fuzz, Safetensors) {
  TempDir tmp;
  const std::string seed = seed_safetensors();
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | uint8_t(seed[size_t(i)]);
  const std::string header = seed.substr(8, header_len);
  const std::string data = seed.substr(8 + header_len);
  Campaign c("safetensors");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string in = seed;
    if (c.tried() > 0) {
      switch (rng.below(5)) {
        case 0:
        case 1: { // the header's JSON, its length kept right (mostly)
          std::string h = mutate_json(header, rng);
          uint64_t len =
              rng.chance(0.85) ? h.size() : h.size() + rng.below(16) - 8;
          std::string d = rng.chance(0.8) ? data : mutate_bytes(data, rng);
          in = le64(len) + h + d;
          break;
        }
        case 2: // the header length
          put_le(
              in,
              0,
              rng.chance(0.5) ? rng.pick(interesting_integers())
                              : header_len + rng.below(64) - 32,
              8);
          break;
        case 3: // truncated or extended
          in = rng.chance(0.7) ? seed.substr(0, rng.below(seed.size()))
                               : seed + std::string(rng.below(64), '\0');
          break;
        default:
          in = mutate_bytes(seed, rng);
          break;
      }
    }
    c.run(in, [&] { read_safetensors(in, tmp.path().string()); });
  }
  EXPECT_GT(c.tried(), 0u);
}

TEST(Fuzz, SafetensorsIndex) {
  TempDir tmp;
  const std::string shard = seed_safetensors();
  const std::string index = seed_safetensors_index();
  Campaign c("safetensors-idx");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string idx = index, sh = shard;
    if (c.tried() > 0) {
      if (rng.chance(0.8))
        idx = mutate_json(index, rng);
      else
        sh = mutate_bytes(shard, rng);
    }
    c.run(describe({{"model.safetensors.index.json", idx}}), [&] {
      read_safetensors_index(idx, sh, tmp.path().string());
    });
  }
}

void fuzz_tokenizer_json(
    const std::string& reader,
    const std::string& fixture) {
  TempDir tmp;
  const std::string seed = read_fixture(fixture);
  Campaign c(reader);
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string in = seed;
    if (c.tried() > 0)
      in = rng.chance(0.9) ? mutate_json(seed, rng) : mutate_bytes(seed, rng);
    c.run(in, [&] { read_hf_tokenizer(in, tmp.path().string()); });
  }
}

TEST(Fuzz, TokenizerJsonByteLevel) {
  fuzz_tokenizer_json("tokenizer-bpe", "hf/llama/tokenizer.json");
}

TEST(Fuzz, TokenizerJsonSentencePiece) {
  fuzz_tokenizer_json("tokenizer-sp", "hf/mistral_sp/tokenizer.json");
}

TEST(Fuzz, TiktokenRanks) {
  TempDir tmp;
  const std::string ranks = seed_tiktoken_ranks(), meta = seed_tiktoken_meta();
  const std::vector<std::string> dict = {
      " ",
      "\n",
      "\r\n",
      "=",
      "==",
      "AA== ",
      "-1",
      "4294967295",
      "4294967294",
      "99999999999999999999",
      "0",
      "/w== 7\n",
      "YWJj 5\n",
      "+",
      "/",
      "\t",
      "YQ== 1000000\n",
      "YQ== 2\n"};
  Campaign c("tiktoken");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string r = ranks, m = meta;
    if (c.tried() > 0) {
      switch (rng.below(4)) {
        case 0:
        case 1:
          r = mutate_with(ranks, dict, rng);
          break;
        case 2:
          r = mutate_bytes(ranks, rng);
          break;
        default:
          m = mutate_json(meta, rng);
          break;
      }
      if (rng.chance(0.2))
        m = "";
    }
    c.run(describe({{"fuzz.tiktoken", r}, {"tiktoken.json", m}}), [&] {
      read_tiktoken(r, m, tmp.path().string());
    });
  }
}

TEST(Fuzz, ChatJsonl) {
  TempDir tmp;
  const auto seeds = seed_chat_lines();
  const std::vector<std::string> formats = {
      "messages", "sharegpt", "completion", "text", "parquet"};
  Campaign c("chat-jsonl");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::vector<std::string> lines;
    for (size_t k = 1 + rng.below(4); k > 0; --k)
      lines.push_back(rng.pick(seeds));
    std::string format = "auto";
    bool skip_bad = false;
    std::string in;
    if (c.tried() == 0) {
      in = join_lines({seeds[0], seeds[1]});
    } else {
      for (size_t k = 1 + rng.below(2); k > 0; --k) {
        auto& l = lines[rng.below(lines.size())];
        l = mutate_json(l, rng);
      }
      in = join_lines(lines);
      if (rng.chance(0.15)) { // one JSON array instead of lines
        in = "[";
        for (size_t k = 0; k < lines.size(); ++k)
          in += (k ? "," : "") + lines[k];
        in += "]";
      }
      if (rng.chance(0.1))
        in = mutate_bytes(in, rng);
      if (rng.chance(0.3))
        format = rng.pick(formats);
      skip_bad = rng.chance(0.3);
    }
    c.run(
        describe(
            {{"chat.jsonl (format " + format + (skip_bad ? ", skip_bad" : "") +
                  ")",
              in}}),
        [&] { read_chat_jsonl(in, format, skip_bad, tmp.path().string()); });
  }
}

TEST(Fuzz, TextJsonl) {
  TempDir tmp;
  const auto seeds = seed_text_lines();
  Campaign c("text-jsonl");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::vector<std::string> lines;
    for (size_t k = 1 + rng.below(6); k > 0; --k)
      lines.push_back(rng.pick(seeds));
    bool jsonl = true;
    if (c.tried() > 0) {
      for (size_t k = 1 + rng.below(2); k > 0; --k) {
        auto& l = lines[rng.below(lines.size())];
        l = mutate_json(l, rng);
      }
      jsonl = rng.chance(0.85);
    }
    std::string in = join_lines(lines);
    if (c.tried() > 0 && rng.chance(0.15))
      in = mutate_bytes(in, rng);
    // Mostly no validation split: one document would go to validation and
    // stop the command before the records are read.
    const double val_fraction = rng.chance(0.7) ? 0 : 0.5;
    c.run(
        describe({{jsonl ? "docs.jsonl" : "docs.txt", in}}) + "val_fraction " +
            std::to_string(val_fraction) + "\n",
        [&] { read_text_jsonl(in, jsonl, val_fraction, tmp.path().string()); });
  }
}

TEST(Fuzz, ConfigYamlAndOverrides) {
  TempDir tmp;
  const std::string yaml = seed_config_yaml();
  const auto overrides = seed_overrides();
  std::string deep;
  for (int i = 0; i < 3000; ++i)
    deep += "[";
  const std::vector<std::string> yaml_dict = {
      ":",
      " ",
      "\n",
      "  ",
      "- ",
      "[",
      "]",
      "{",
      "}",
      "&a ",
      "*a",
      "!!str ",
      "!!binary ",
      "? ",
      "|\n",
      ">\n",
      "\"",
      "'",
      "#",
      "~",
      "null",
      "1e999",
      "-1",
      "nan",
      "9223372036854775808",
      "arch:\n  ",
      "steps: ",
      "lr: ",
      "<<: *a\n",
      "---\n",
      "...\n",
      "\t",
      "%YAML 1.2\n",
      deep,
      "{a: 1}",
      "[a, [b]]",
      "\\",
      "\xef\xbb\xbf",
      "\x00"};
  const std::vector<std::string> override_dict = {
      "=",
      "[",
      "]",
      ",",
      "arch.",
      "steps",
      "lr",
      ".",
      "auto",
      "1e999",
      "-1",
      "nan",
      "inf",
      "0x10",
      " ",
      "\"",
      "'",
      "true",
      "9223372036854775808",
      "hidden_size",
      "data_paths",
      "2.5",
      "1e3",
      "\n",
      "#",
      ":"};
  Campaign c("config");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string y = yaml;
    std::vector<std::string> ov;
    if (c.tried() == 0) {
      ov = overrides;
    } else {
      switch (rng.below(4)) {
        case 0:
        case 1:
          y = mutate_with(yaml, yaml_dict, rng);
          break;
        case 2:
          y = mutate_bytes(yaml, rng);
          break;
        default:
          break;
      }
      for (size_t k = rng.below(4); k > 0; --k) {
        std::string o = rng.pick(overrides);
        if (rng.chance(0.6))
          o = mutate_with(o, override_dict, rng);
        ov.push_back(o);
      }
    }
    std::string shown = describe({{"run.yaml", y}});
    for (const auto& o : ov)
      shown += "override: " + o + "\n";
    c.run(shown, [&] { read_config(y, ov, tmp.path().string()); });
  }
}

TEST(Fuzz, JinjaTemplates) {
  // Every seed once as it is, then mostly mutated fixtures: the hostile
  // seeds take a second each to be refused.
  const auto fixtures = seed_templates(), hostile = hostile_templates();
  std::vector<std::string> seeds = fixtures;
  seeds.insert(seeds.end(), hostile.begin(), hostile.end());
  const std::vector<std::string> dict = {
      "{%",
      "%}",
      "{{",
      "}}",
      "{#",
      "#}",
      "{%- ",
      " -%}",
      " for x in ",
      " endfor ",
      " if ",
      " else ",
      " endif ",
      " set ",
      "range(",
      "10**9",
      "(",
      ")",
      "[",
      "]",
      "|tojson",
      "|length",
      "loop.index",
      "namespace(",
      " ~ ",
      " * ",
      " + ",
      " // ",
      " % ",
      " - ",
      "messages",
      "message['content']",
      "'",
      "\"",
      "\\",
      " is defined",
      "not ",
      "9223372036854775807",
      "-1",
      "0",
      ".",
      ",",
      ":",
      "raise_exception(",
      "|join(",
      ".split(",
      ".replace(",
      "|trim",
      "[::-1]",
      "[1:-1]",
      " in ",
      " and ",
      " or ",
      "==",
      "loop.cycle(",
      "{% break %}",
      "{% continue %}",
      "{% generation %}",
      "{% endgeneration %}",
      "bos_token",
      "add_generation_prompt",
      "x",
      "{% endset %}",
      "range(1000000)",
      "|list",
      "|items",
      "|dictsort"};
  Campaign c("jinja");
  while (c.more(seeds.size())) {
    Rng rng = c.next_rng();
    std::string in;
    if (c.tried() < seeds.size())
      in = seeds[c.tried()];
    else if (rng.chance(0.85))
      in = mutate_with(rng.pick(rng.chance(0.9) ? fixtures : seeds), dict, rng);
    else
      in = mutate_bytes(rng.pick(fixtures), rng);
    c.run(in, [&] { read_jinja(in); });
  }
}

TEST(Fuzz, TokenizerConfig) {
  TempDir tmp;
  nlohmann::json base =
      nlohmann::json::parse(read_fixture("hf/llama/tokenizer_config.json"));
  base["chat_template"] = read_fixture("hf/llama/chat_template.jinja");
  nlohmann::json listed = base;
  listed["chat_template"] = nlohmann::json::array(
      {{{"name", "default"}, {"template", base["chat_template"]}},
       {{"name", "tool_use"}, {"template", "{{ 1 }}"}}});
  const std::vector<std::string> seeds = {base.dump(2), listed.dump(2)};
  Campaign c("tokenizer-cfg");
  while (c.more(seeds.size())) {
    Rng rng = c.next_rng();
    std::string in = c.tried() < seeds.size()
        ? seeds[c.tried()]
        : mutate_json(rng.pick(seeds), rng);
    c.run(in, [&] { read_tokenizer_config(in, tmp.path().string()); });
  }
}

TEST(Fuzz, AdapterConfig) {
  TempDir tmp;
  const std::string seed = read_fixture("hf/llama_lora/adapter_config.json");
  Campaign c("adapter-config");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string in = seed;
    if (c.tried() > 0)
      in = rng.chance(0.9) ? mutate_json(seed, rng) : mutate_bytes(seed, rng);
    c.run(in, [&] { read_adapter_config(in, tmp.path().string()); });
  }
}

TEST(Fuzz, TokenShards) {
  TempDir tmp;
  const std::vector<std::string> seeds = {seed_shard(false), seed_shard(true)};
  Campaign c("bin-shard");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string in = seeds[c.tried() % 2];
    if (c.tried() > 1) {
      switch (rng.below(4)) {
        case 0: // magic, version, token count
          put_le(
              in,
              4 * rng.below(3),
              rng.chance(0.6) ? rng.pick(interesting_integers()) : rng.below(4),
              4);
          break;
        case 1:
          in = rng.chance(0.6) ? in.substr(0, rng.below(in.size()))
                               : in + std::string(1 + rng.below(9), 'x');
          break;
        default:
          in = mutate_bytes(in, rng);
          break;
      }
    }
    c.run(in, [&] { read_shard(in, tmp.path().string()); });
  }
}

TEST(Fuzz, ChatFile) {
  TempDir tmp;
  const std::string seed = seed_chat_file();
  const size_t conversations = 3;
  Campaign c("chat-file");
  while (c.more()) {
    Rng rng = c.next_rng();
    std::string in = seed;
    if (c.tried() > 0) {
      switch (rng.below(5)) {
        case 0: // version, count, total
          put_le(
              in,
              rng.pick(std::vector<size_t>{8, 16, 24}),
              rng.chance(0.6) ? rng.pick(interesting_integers())
                              : rng.below(16),
              8);
          break;
        case 1: // an offset
          put_le(
              in,
              32 + 8 * rng.below(conversations + 1),
              rng.chance(0.5) ? rng.pick(interesting_integers())
                              : rng.below(16),
              8);
          break;
        case 2:
          in = rng.chance(0.6) ? in.substr(0, rng.below(in.size()))
                               : in + std::string(1 + rng.below(13), '\0');
          break;
        default:
          in = mutate_bytes(in, rng);
          break;
      }
    }
    c.run(in, [&] { read_chat_file(in, tmp.path().string()); });
  }
}

// The puzzle readers of stage=trm: Sudoku and maze CSVs, grid JSONL and
// .chat conversations. Every record either loads with tokens inside the
// vocabulary or stops with a message naming file and line.
TEST(Fuzz, PuzzleFiles) {
  TempDir tmp;
  const std::vector<File> seeds = seed_puzzle_files();
  const std::vector<std::string> dictionary = {
      ",",
      "\n",
      ".",
      "#",
      "S",
      "G",
      "o",
      "0",
      "9",
      "\"",
      "[[",
      "]]",
      "source,question,answer,rating",
      "\r\n",
      "-1",
      "[]",
      "{}"};
  Campaign c("puzzle-files");
  while (c.more(seeds.size())) {
    Rng rng = c.next_rng();
    const File& seed = seeds[c.tried() % seeds.size()];
    std::string in = seed.bytes;
    if (c.tried() >= seeds.size()) {
      const bool binary = seed.name.ends_with(".chat");
      in = binary ? mutate_bytes(in, rng)
          : seed.name.ends_with(".jsonl") && rng.chance(0.5)
          ? mutate_json(in, rng)
          : mutate_with(in, dictionary, rng);
    }
    c.run(describe({{seed.name, in}}), [&] {
      read_puzzle_file(seed.name, in, tmp.path().string());
    });
  }
}

} // namespace
} // namespace orchard::fuzz
