// The byte-level BPE tokenizer against OpenAI's tiktoken (reference ids made
// by tests/fixtures/tokenizers/make_fixtures.mjs with the npm `tiktoken`
// package), plus round-trip properties and special-token safety.
#include "core/error.h"
#include "test_util.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace orchard::text {
namespace {

const std::string kDir = std::string(ORCHARD_FIXTURES) + "/tokenizers";

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[name];
  if (!t)
    t = std::make_unique<Tokenizer>(load_tokenizer(kDir + "/" + name));
  return *t;
}

class Reference : public testing::TestWithParam<std::string> {};

TEST_P(Reference, EncodesExactlyAsTiktoken) {
  const Tokenizer& tok = tokenizer(GetParam());
  auto ref = nlohmann::json::parse(
      test::read_text(kDir + "/" + GetParam() + "_reference.json"));
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
    testing::Values("gpt2", "cl100k_base"));

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
    uint32_t cp = lo + rng() % (hi - lo + 1);
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xc0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      s += char(0xe0 | (cp >> 12));
      s += char(0x80 | ((cp >> 6) & 0x3f));
      s += char(0x80 | (cp & 0x3f));
    } else {
      s += char(0xf0 | (cp >> 18));
      s += char(0x80 | ((cp >> 12) & 0x3f));
      s += char(0x80 | ((cp >> 6) & 0x3f));
      s += char(0x80 | (cp & 0x3f));
    }
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
