// The byte-level BPE tokenizer against OpenAI's tiktoken (reference ids made
// by tests/fixtures/tokenizers/make_fixtures.mjs with the npm `tiktoken`
// package), plus round-trip properties and special-token safety.
#include "core/error.h"
#include "test_util.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>

namespace orchard::text {
namespace {

const std::string kTokenizerDir = std::string(ORCHARD_FIXTURES) + "/tokenizers";

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[name];
  if (!t)
    t = std::make_unique<Tokenizer>(load_tokenizer(kTokenizerDir + "/" + name));
  return *t;
}

class Reference : public testing::TestWithParam<std::string> {};

TEST_P(Reference, EncodesExactlyAsTiktoken) {
  const Tokenizer& tok = tokenizer(GetParam());
  auto ref = nlohmann::json::parse(
      test::read_text(kTokenizerDir + "/" + GetParam() + "_reference.json"));
  ASSERT_GE(ref["cases"].size(), 10u);
  for (const auto& c : ref["cases"]) {
    std::string text = c["text"];
    auto want = c["ids"].get<std::vector<TokenId>>();
    Allowed allowed =
        c.contains("allowed_special") ? Allowed::every() : Allowed::none();
    EXPECT_EQ(tok.encode(text, allowed), want) << text;
    EXPECT_EQ(tok.decode(want), text);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiktoken,
    Reference,
    testing::Values("gpt2", "cl100k_base", "llama3"));

// `--tokenizer gpt2` with no such file or folder: the built-in copy, which
// encodes the tiktoken reference exactly as the fixture does; a path that
// exists wins over the name; an unknown name says what works.
TEST(Tokenizer, BuiltInGpt2IsTiktokens) {
  test::TempDir cwd;
  const auto here = std::filesystem::current_path();
  std::filesystem::current_path(cwd.path());
  const Tokenizer builtin = load_tokenizer("gpt2");
  EXPECT_EQ(tokenizer_reference("gpt2"), "gpt2");
  cwd.write("gpt2/tokenizer.json", "{}"); // a folder named gpt2 is read
  EXPECT_THROW(load_tokenizer("gpt2"), UserError);
  EXPECT_EQ(tokenizer_reference("gpt2"), (cwd.path() / "gpt2").string());
  std::filesystem::current_path(here);
  EXPECT_EQ(builtin.vocab_size(), 50257u);
  EXPECT_EQ(builtin.special_id("<|endoftext|>"), 50256u);
  auto ref = nlohmann::json::parse(
      test::read_text(kTokenizerDir + "/gpt2_reference.json"));
  for (const auto& c : ref["cases"]) {
    Allowed allowed =
        c.contains("allowed_special") ? Allowed::every() : Allowed::none();
    EXPECT_EQ(
        builtin.encode(c["text"].get<std::string>(), allowed),
        c["ids"].get<std::vector<TokenId>>());
  }
  try {
    load_tokenizer("gpt3");
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2 (built in)"), std::string::npos)
        << e.what();
  }
}

TEST(Tokenizer, Llama3Specials) {
  const Tokenizer& tok = tokenizer("llama3");
  EXPECT_EQ(tok.vocab_size(), 128256u);
  EXPECT_EQ(tok.special_id("<|begin_of_text|>"), 128000u);
  EXPECT_EQ(tok.special_id("<|eot_id|>"), 128009u);
  EXPECT_EQ(
      tok.encode("<|start_header_id|>user<|end_header_id|>", Allowed::every()),
      (std::vector<TokenId>{128006, 882, 128007}));
}

TEST(Tokenizer, VocabularyAndSpecials) {
  const Tokenizer& gpt2 = tokenizer("gpt2");
  EXPECT_EQ(gpt2.vocab_size(), 50257u);
  EXPECT_EQ(gpt2.special_id("<|endoftext|>"), 50256u);
  EXPECT_EQ(gpt2.format(), "tiktoken");
  const Tokenizer& cl = tokenizer("cl100k_base");
  EXPECT_EQ(cl.vocab_size(), 100277u);
  EXPECT_EQ(cl.special_tokens().size(), 5u);
}

TEST(Tokenizer, SpecialTokensOnlyWhenAllowed) {
  const Tokenizer& tok = tokenizer("cl100k_base");
  std::string text = "user says <|endoftext|> and <|fim_prefix|>";
  auto plain = tok.encode(text);
  for (TokenId id : plain)
    EXPECT_LT(id, 100257u) << "a control token came from user text";
  EXPECT_EQ(tok.decode(plain), text);
  auto all = tok.encode(text, Allowed::every());
  EXPECT_EQ(std::count(all.begin(), all.end(), 100257u), 1);
  EXPECT_EQ(std::count(all.begin(), all.end(), 100258u), 1);
  auto one = tok.encode(text, Allowed{false, {"<|fim_prefix|>"}});
  EXPECT_EQ(std::count(one.begin(), one.end(), 100257u), 0);
  EXPECT_EQ(std::count(one.begin(), one.end(), 100258u), 1);
  EXPECT_EQ(tok.decode(all), text);
  EXPECT_THROW(tok.encode(text, Allowed{false, {"<|nope|>"}}), UserError);
}

std::string random_utf8(std::mt19937& rng, size_t chars) {
  // Code points from every UTF-8 length, skipping surrogates.
  static const std::pair<uint32_t, uint32_t> ranges[] = {
      {0x20, 0x7e},
      {0x09, 0x0d},
      {0xa0, 0x7ff},
      {0x800, 0xd7ff},
      {0xe000, 0xfffd},
      {0x10000, 0x10ffff},
      {0x1f600, 0x1f64f}};
  std::string s;
  for (size_t i = 0; i < chars; ++i) {
    auto [lo, hi] = ranges[rng() % std::size(ranges)];
    s += test::utf8(lo + rng() % (hi - lo + 1));
  }
  return s;
}

TEST(Tokenizer, RoundTripsRandomUtf8) {
  std::mt19937 rng(1);
  for (const char* name : {"gpt2", "cl100k_base"}) {
    const Tokenizer& tok = tokenizer(name);
    for (int trial = 0; trial < 300; ++trial) {
      std::string s = random_utf8(rng, rng() % 200);
      ASSERT_EQ(tok.decode(tok.encode(s)), s) << name;
    }
  }
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
  std::mt19937 rng(2);
  for (const char* name : {"gpt2", "cl100k_base"}) {
    const Tokenizer& tok = tokenizer(name);
    for (int trial = 0; trial < 300; ++trial) {
      std::string s(rng() % 200, '\0');
      for (auto& c : s)
        c = char(rng() % 256);
      // Mix in valid text so invalid bytes sit between real pieces.
      if (trial % 2)
        s = "word " + s + " more text 123";
      ASSERT_EQ(tok.decode(tok.encode(s)), s) << name;
    }
  }
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  const Tokenizer& tok = tokenizer("gpt2");
  try {
    tok.decode({1, 2, 50257});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("50257"), std::string::npos);
  }
}

TEST(TokenizerFiles, Base64) {
  EXPECT_EQ(base64_decode("aGVsbG8="), "hello");
  EXPECT_EQ(base64_decode("aGk="), "hi");
  EXPECT_EQ(base64_decode(""), "");
  for (std::string s : {"", "a", "ab", "abc", "\xff\x00\x10"})
    EXPECT_EQ(base64_decode(base64_encode(s)), s);
  EXPECT_THROW(base64_decode("abc"), std::invalid_argument);
  EXPECT_THROW(base64_decode("ab!="), std::invalid_argument);
  EXPECT_THROW(base64_decode("a=bc"), std::invalid_argument);
}

TEST(TokenizerFiles, BadRankFilesNameFileAndLine) {
  test::TempDir dir;
  auto error = [&](const std::string& content) {
    std::string path = dir.write("bad.tiktoken", content);
    try {
      load_tiktoken(path);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error("IQ== 0\nnospace\n").find("bad.tiktoken:2"), std::string::npos);
  EXPECT_NE(
      error("IQ== 0\n!!!! 1\n").find("not valid base64"), std::string::npos);
  EXPECT_NE(error("IQ== zero\n").find("not a number"), std::string::npos);
  EXPECT_NE(error("").find("holds no tokens"), std::string::npos);
  EXPECT_NE(error("IQ== 0\nIg== 0\n").find("two tokens"), std::string::npos);
  try {
    load_tokenizer(dir.file("missing"));
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
}

} // namespace
} // namespace orchard::text

#include "text/hf_tokenizer.h"

namespace orchard::text {
namespace {

TEST(HfTokenizer, ByteToUnicodeTable) {
  EXPECT_EQ(bytes_to_unicode(" "), "\xC4\xA0");  // GPT-2's Ġ
  EXPECT_EQ(bytes_to_unicode("\n"), "\xC4\x8A"); // Ċ
  EXPECT_EQ(bytes_to_unicode("abc!~"), "abc!~");
  std::string all;
  for (int b = 0; b < 256; ++b)
    all += char(b);
  EXPECT_EQ(unicode_to_bytes(bytes_to_unicode(all)), all);
  EXPECT_THROW(unicode_to_bytes("\xE2\x82\xAC"), std::invalid_argument);
}

// A rank file written as tokenizer.json and read back encodes identically:
// the merges recovered from ranks are the ones tiktoken applies.
class HfRoundTrip : public testing::TestWithParam<std::string> {};

TEST_P(HfRoundTrip, SameIdsAsTheRankFile) {
  const Tokenizer& original = tokenizer(GetParam());
  test::TempDir dir;
  save_hf_tokenizer(original, dir.file("tokenizer.json"));
  // For scripts/device_ci.sh: Hugging Face `tokenizers` checks this file.
  if (const char* out = std::getenv("ORCHARD_HF_OUT")) {
    std::filesystem::create_directories(std::string(out) + "/" + GetParam());
    save_hf_tokenizer(
        original, std::string(out) + "/" + GetParam() + "/tokenizer.json");
  }
  Tokenizer hf = load_tokenizer(dir.path().string());
  EXPECT_EQ(hf.format(), "huggingface");
  EXPECT_EQ(hf.vocab_size(), original.vocab_size());
  EXPECT_EQ(hf.special_tokens(), original.special_tokens());
  auto j = nlohmann::json::parse(test::read_text(dir.file("tokenizer.json")));
  // Every token but the 256 single bytes is a merge.
  EXPECT_EQ(j["model"]["merges"].size(), original.entries().size() - 256);
  auto ref = nlohmann::json::parse(
      test::read_text(kTokenizerDir + "/" + GetParam() + "_reference.json"));
  for (const auto& c : ref["cases"]) {
    std::string text = c["text"];
    Allowed allowed =
        c.contains("allowed_special") ? Allowed::every() : Allowed::none();
    EXPECT_EQ(hf.encode(text, allowed), c["ids"].get<std::vector<TokenId>>())
        << text;
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    std::string s = random_utf8(rng, 80);
    ASSERT_EQ(hf.encode(s), original.encode(s));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiktoken,
    HfRoundTrip,
    testing::Values("gpt2", "cl100k_base"));

TEST(HfTokenizer, BadFilesAreClearErrors) {
  test::TempDir dir;
  auto error = [&](const std::string& content) {
    std::string path = dir.write("t/tokenizer.json", content);
    try {
      load_tokenizer(dir.file("t"));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("{oops").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error("{}").find("no \"model\""), std::string::npos);
  EXPECT_NE(
      error(R"({"model":{"type":"Unigram","vocab":[]}})")
          .find("'Unigram' is not supported"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"model":{"type":"BPE","vocab":{"a":0}},"pre_tokenizer":{"type":"Whitespace"}})")
          .find("neither ByteLevel"),
      std::string::npos);
  EXPECT_NE(
      error(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]},)"
            R"("pre_tokenizer":{"type":"ByteLevel"}})")
          .find("the vocab lacks"),
      std::string::npos);
}

} // namespace
} // namespace orchard::text

#include "text/bpe_train.h"

namespace orchard::text {
namespace {

// Hand-worked: pieces "ab", " ab", " ab", " cd". Pair counts: (a,b) 3,
// (' ',a) 2, (' ',c) 1, (c,d) 1. Merge 1: "ab" (3). Then (' ',ab) 2:
// " ab". Then a tie at 1 between (' ',c) and (c,d): the smaller pair of
// ids wins, (32,99): " c". Then (" c", d): " cd".
TEST(BpeTrain, HandWorkedMerges) {
  BpeTrainer trainer(
      {.vocab_size = 256 + 4 + 1, .special_tokens = {"<|bos|>"}});
  trainer.add_text("ab ab ab cd");
  BpeTrainStats stats;
  Tokenizer tok = trainer.train(&stats);
  EXPECT_EQ(stats.unique_pieces, 3u);
  EXPECT_EQ(stats.merges, 4u);
  std::string s;
  ASSERT_TRUE(tok.token_bytes(256, s));
  EXPECT_EQ(s, "ab");
  ASSERT_TRUE(tok.token_bytes(257, s));
  EXPECT_EQ(s, " ab");
  ASSERT_TRUE(tok.token_bytes(258, s));
  EXPECT_EQ(s, " c");
  ASSERT_TRUE(tok.token_bytes(259, s));
  EXPECT_EQ(s, " cd");
  EXPECT_EQ(tok.special_id("<|bos|>"), 260u);
  EXPECT_EQ(tok.vocab_size(), 261u);
  EXPECT_EQ(tok.encode("ab ab cd"), (std::vector<TokenId>{256, 257, 259}));
}

TEST(BpeTrain, StopsWhenNothingIsLeftToMerge) {
  BpeTrainer trainer({.vocab_size = 1000});
  trainer.add_text("abc");
  BpeTrainStats stats;
  Tokenizer tok = trainer.train(&stats);
  EXPECT_EQ(stats.merges, 2u); // "ab" (or "bc"), then "abc"
  EXPECT_EQ(tok.encode("abc").size(), 1u);
  EXPECT_THROW(BpeTrainer({.vocab_size = 100}), UserError);
}

TEST(BpeTrain, TrainedTokenizerRoundTripsAndSavesAsHuggingFace) {
  BpeTrainer trainer({.vocab_size = 600});
  std::mt19937 rng(5);
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "The quick brown fox jumps over the lazy dog " +
        std::to_string(i) + ". " + random_utf8(rng, 20) + "\n";
  trainer.add_text(corpus);
  Tokenizer tok = trainer.train();
  EXPECT_EQ(tok.vocab_size(), 600u);
  EXPECT_EQ(tok.special_tokens().size(), orchard_special_tokens().size());
  EXPECT_EQ(tok.special_id("<|bos|>"), 600u - 7);
  auto ids = tok.encode(corpus);
  // It learned the repeated words: one token each, where bytes were 43.
  EXPECT_EQ(
      tok.encode("The quick brown fox jumps over the lazy dog").size(), 9u);
  EXPECT_EQ(tok.decode(ids), corpus);
  for (int i = 0; i < 100; ++i) {
    std::string s = random_utf8(rng, 50);
    ASSERT_EQ(tok.decode(tok.encode(s)), s);
  }
  test::TempDir dir;
  save_hf_tokenizer(tok, dir.file("tokenizer.json"));
  Tokenizer again = load_tokenizer(dir.path().string());
  EXPECT_EQ(again.encode(corpus), ids);
  EXPECT_EQ(
      again.encode("<|bos|>hi", Allowed::every()).front(),
      *tok.special_id("<|bos|>"));
}

} // namespace
} // namespace orchard::text
