// Inputs the fuzz campaigns found (or that probe the same bug directly),
// kept as fixed cases: each crashed, hung, allocated without bound or let a
// non-UserError escape before its fix. Each must now end in the UserError
// shown (or in success).
#include "core/error.h"
#include "fuzz/fuzz_harness.h"
#include "fuzz/readers.h"
#include "infer/sampling.h"
#include "serve/request.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>

namespace orchard::fuzz {
namespace {

using test::TempDir;

// `read` ends in a UserError whose message holds `expected`.
void expect_user_error(
    const std::function<void()>& read,
    const std::string& expected) {
  try {
    read();
    ADD_FAILURE() << "read without an error; expected one saying '" << expected
                  << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "the error was: " << e.what();
  }
}

std::string safetensors_with_header(const std::string& header) {
  std::string s(8, '\0');
  put_le(s, 0, header.size(), 8);
  return s + header + std::string(4, '\0');
}

TEST(FuzzRegression, SafetensorsDeepDataOffsets) {
  // Crashed (stack overflow): data_offsets was copied, recursively, into a
  // temporary.
  TempDir tmp;
  const size_t depth = 100000;
  std::string header =
      R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": )" +
      std::string(depth, '[') + std::string(depth, ']') + "}}";
  expect_user_error(
      [&] {
        read_safetensors(safetensors_with_header(header), tmp.path().string());
      },
      "nests deeper than 256 levels");
}

TEST(FuzzRegression, SafetensorsIndexShardNameTooLong) {
  // std::filesystem_error (File name too long) escaped.
  TempDir tmp;
  const std::string index =
      R"({"weight_map": {"model.half": ")" + std::string(300, 'x') + "\"}}";
  expect_user_error(
      [&] {
        read_safetensors_index(index, std::string(), tmp.path().string());
      },
      "is missing");
}

TEST(FuzzRegression, TokenizerJsonWrongTypes) {
  // nlohmann::json type_error escaped from the byte-level reader.
  TempDir tmp;
  const std::string byte_level =
      R"({"model": {"type": "BPE", "vocab": {"a": [1]}, "merges": []},
          "pre_tokenizer": {"type": "ByteLevel"}})";
  expect_user_error(
      [&] { read_hf_tokenizer(byte_level, tmp.path().string()); },
      "unexpected structure");
  // std::invalid_argument escaped: a merge outside the byte alphabet.
  const std::string merge =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
          "merges": ["\u4e00 b"]}, "pre_tokenizer": {"type": "ByteLevel"}})";
  expect_user_error(
      [&] { read_hf_tokenizer(merge, tmp.path().string()); },
      "byte-level alphabet");
  // type_error from a Split pre-tokenizer whose Regex is not a string.
  const std::string split =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer":
          {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": {}}},
            {"type": "ByteLevel"}]}})";
  expect_user_error(
      [&] { read_hf_tokenizer(split, tmp.path().string()); },
      "unexpected structure");
}

TEST(FuzzRegression, TokenIdsFarPastAnyVocabulary) {
  // std::bad_alloc: the id table was sized by the largest id (4 billion
  // entries).
  TempDir tmp;
  const std::string sp =
      R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "a": 4294967295}},
          "pre_tokenizer": {"type": "Metaspace"}})";
  expect_user_error(
      [&] { read_hf_tokenizer(sp, tmp.path().string()); },
      "past the largest Orchard accepts");
  expect_user_error(
      [&] {
        read_tiktoken(
            seed_tiktoken_ranks() + "YWJj 4000000000\n",
            "",
            tmp.path().string());
      },
      "past the largest Orchard accepts");
}

TEST(FuzzRegression, ChatRecordUnlikeTheFirst) {
  // Crashed (undefined behaviour): the format is detected from the first
  // record, and a later record lacking "messages" was read with const
  // operator[].
  TempDir tmp;
  const std::string in = seed_chat_lines()[0] + "\n" + seed_chat_lines()[4] +
      "\n" + R"({"conversations": 3})" + "\n";
  expect_user_error(
      [&] { read_chat_jsonl(in, "auto", false, tmp.path().string()); },
      "\"messages\" is missing or not a list");
  EXPECT_EQ(
      outcome_of(
          [&] { read_chat_jsonl(in, "auto", true, tmp.path().string()); }),
      "");
  expect_user_error(
      [&] {
        read_chat_jsonl(
            seed_chat_lines()[0] + "\n",
            "sharegpt",
            false,
            tmp.path().string());
      },
      "\"conversations\" is missing or not a list");
}

TEST(FuzzRegression, ConfigKeysThatAreNotNames) {
  // YAML::TypedBadConversion escaped for a key that is a list or null.
  TempDir tmp;
  expect_user_error(
      [&] { read_config("[a, b]: 1\n", {}, tmp.path().string()); },
      "expected plain `key: value` entries");
  expect_user_error(
      [&] { read_config("? : auto\n", {}, tmp.path().string()); },
      "expected plain `key: value` entries");
}

TEST(FuzzRegression, ConfigStringsWithControlCharacters) {
  // The written config.yaml read back "name with spaces" for a run name
  // holding a newline (a raw newline in a quoted YAML string folds to a
  // space) and refused other control characters.
  TempDir tmp;
  for (const char* run : {"run=two\nlines", "run=tab\there\x16"})
    EXPECT_EQ(
        outcome_of([&] { read_config("", {run}, tmp.path().string()); }), "")
        << run;
}

TEST(FuzzRegression, JinjaBoundedWorkAndMemory) {
  // Hung (10^12 loop turns) or allocated without bound before the render
  // budget; each now stops with a UserError well inside a second or two.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% for i in range(1000000) %}{% for j in range(1000000) %}{{ j }}{% "
       "endfor %}{% endfor %}",
       "steps of work"},
      {"{% for a in range(1000) %}{% for b in range(1000) %}{% for c in "
       "range(1000) %}{% endfor %}{% endfor %}{% endfor %}",
       "steps of work"},
      {"{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = "
       "ns.s ~ ns.s %}{% endfor %}",
       "over 64 MB"},
      {"{{ ('a' * 1000000).replace('a', 'b' * 30000) }}", "over 64 MB"},
      {"{{ [1, [2, [3]]]|tojson(indent=1000000000) }}", "indent above 1000"},
  };
  for (const auto& [source, expected] : cases) {
    auto start = std::chrono::steady_clock::now();
    expect_user_error([&] { read_jinja(source); }, expected);
    double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_LT(s, 20) << source;
  }
}

TEST(FuzzRegression, JinjaIntegers) {
  // std::out_of_range escaped from the lexer; signed overflow (undefined
  // behaviour) and SIGFPE (INT64_MIN / -1) in arithmetic.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ 99999999999999999999 }}", "does not fit in a 64-bit integer"},
      {"{{ 9223372036854775807 + 1 }}", "does not fit in a 64-bit integer"},
      {"{{ -9223372036854775807 - 2 }}", "does not fit in a 64-bit integer"},
      {"{{ 4611686018427387904 * 4 }}", "does not fit in a 64-bit integer"},
      {"{{ (-9223372036854775807 - 1) // -1 }}",
       "does not fit in a 64-bit integer"},
      {"{{ 2 ** 64 }}", "does not fit in a 64-bit integer"},
      {"{{ (-9223372036854775807 - 1)|abs }}",
       "does not fit in a 64-bit integer"},
  };
  for (const auto& [source, expected] : cases)
    expect_user_error([&] { read_jinja(source); }, expected);
  EXPECT_EQ(
      outcome_of([] {
        read_jinja(
            "{{ (-9223372036854775807 - 1) % -1 }}{{ (-9223372036854775807 "
            "- 1) is divisibleby(-1) }}{{ 1" +
            std::string(400, '0') + ".5 }}");
      }),
      "");
  EXPECT_EQ(
      outcome_of([] {
        read_jinja(
            "{{ range(9223372036854775806, 9223372036854775807, 3)|list "
            "}}{{ [1, 2, 3][1::9223372036854775807] }}");
      }),
      "");
  expect_user_error(
      [] {
        read_jinja(
            "{{ range(-9223372036854775807 - 1, 9223372036854775807)|length "
            "}}");
      },
      "more than 1,000,000 numbers");
}

TEST(FuzzRegression, JinjaDepth) {
  // Stack overflows: deep expressions, deep blocks, a namespace holding
  // itself.
  const size_t deep = 50000;
  std::string ifs, ends;
  for (size_t i = 0; i < deep; ++i) {
    ifs += "{% if true %}";
    ends += "{% endif %}";
  }
  expect_user_error(
      [&] {
        read_jinja(
            "{{ " + std::string(deep, '(') + "1" + std::string(deep, ')') +
            " }}");
      },
      "tokens");
  expect_user_error(
      [&] { read_jinja("{{ 1" + std::string(deep, '+') + " }}"); }, "tokens");
  expect_user_error([&] { read_jinja(ifs + "x" + ends); }, "nest more than");
  expect_user_error(
      [] {
        read_jinja(
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|tojson }}");
      },
      "nests deeper than");
  expect_user_error(
      [] {
        read_jinja("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
      },
      "nests deeper than");
  // At the limits, still read.
  EXPECT_EQ(
      outcome_of([] {
        read_jinja(
            "{{ " + std::string(490, '(') + "1" + std::string(490, ')') +
            " }}");
      }),
      "");
}

TEST(FuzzRegression, TokenizerConfigTemplateList) {
  // type_error escaped: chat_template entries that are not objects.
  TempDir tmp;
  EXPECT_EQ(
      outcome_of([&] {
        read_tokenizer_config(
            R"({"chat_template": [1, "x", {"name": 5}, {"name": "default", "template": 7}]})",
            tmp.path().string());
      }),
      "");
}

TEST(FuzzRegression, AdapterConfigWrongTypes) {
  // type_error escaped; a deep target_modules was copied recursively.
  TempDir tmp;
  const std::string base = R"({"peft_type": "LORA", "r": 4, )";
  expect_user_error(
      [&] {
        read_adapter_config(
            base + R"("lora_alpha": "8", "target_modules": ["q_proj"]})",
            tmp.path().string());
      },
      "wrong type");
  expect_user_error(
      [&] {
        read_adapter_config(
            base + R"("target_modules": [1]})", tmp.path().string());
      },
      "wrong type");
  expect_user_error(
      [&] {
        read_adapter_config(
            base + R"("target_modules": )" + std::string(100000, '[') +
                std::string(100000, ']') + "}",
            tmp.path().string());
      },
      "is not valid JSON");
}

// serve-http, input 38 (seed 17): a content part whose "type" was a list
// escaped as nlohmann's type_error, a 500; it is the client's 400.
TEST(FuzzRegression, ServeContentPartTypeNotAString) {
  const auto body = nlohmann::json::parse(
      R"({"messages": [{"role": "user", "content": [{"text": "What does",
          "type": ["text", ["text", "text"]]}]}]})");
  try {
    serve::messages_of(body, serve::ServeOptions{});
    ADD_FAILURE() << "read without an error";
  } catch (const serve::BadRequest& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages[0].content");
  }
}

// serve-http, input 424 (seed 17): "temperature": 1e-300 divided the logits
// into infinities and NaN probabilities (a 500). A temperature that small
// is greedy, on the CPU sampler and the device one, with top-k and top-p.
TEST(FuzzRegression, ServeTinyTemperatureIsGreedy) {
  torch::manual_seed(0);
  const auto logits = torch::randn({3, 50}) * 30;
  const auto want = logits.argmax(-1);
  for (double t : {1e-300, 1e-40, 1e-7}) {
    infer::SamplingOptions o;
    o.temperature = t;
    o.top_k = 20;
    o.top_p = 0.9;
    EXPECT_EQ(infer::sampling_problem(o), "");
    auto gen = infer::make_generator(torch::kCPU, 1);
    EXPECT_EQ(infer::sample_token(logits[1], o, gen), want[1].item<int64_t>())
        << t;
    o.sampling_device = "device"; // the device sampler, on the CPU here
    infer::Sampler sampler(torch::kCPU);
    for (int r = 0; r < 3; ++r)
      sampler.add_row(o);
    EXPECT_TRUE(torch::equal(sampler.sample(logits), want)) << t;
  }
}

} // namespace
} // namespace orchard::fuzz
