// orchard data chat: formats, truncation, subsampling, every bad input; and
// the .chat file format.
#include "core/error.h"
#include "data/chat_prep.h"
#include "test_util.h"
#include "text/bpe_train.h"
#include "train/stage_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace orchard::data {
namespace {

using test::TempDir;

const text::Tokenizer& tok() {
  static const text::Tokenizer t = [] {
    text::BpeTrainer trainer({.vocab_size = 400});
    trainer.add_text(
        "hello there, how are you? fine thanks. what does it mean");
    return trainer.train();
  }();
  return t;
}

const text::ChatTemplate& tmpl() {
  static const text::ChatTemplate t(text::ChatFamily::Orchard, tok());
  return t;
}

ChatPrepStats run(
    const TempDir& dir,
    const std::string& name,
    const std::string& content,
    ChatPrepOptions opt = {}) {
  opt.inputs = {dir.write(name, content)};
  opt.out = dir.file("out");
  return prepare_chat(tok(), tmpl(), opt);
}

std::string error_of(
    const TempDir& dir,
    const std::string& name,
    const std::string& content,
    ChatPrepOptions opt = {}) {
  try {
    run(dir, name, content, opt);
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code(), kExitFailure) << e.what();
    return e.what();
  }
  return "";
}

TEST(ChatPrep, EveryFormatGivesTheSameConversation) {
  TempDir dir;
  std::vector<std::string> files = {
      R"({"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"fine thanks"}]})",
      R"({"conversations":[{"from":"human","value":"hello"},{"from":"gpt","value":"fine thanks"}]})",
      R"({"prompt":"hello","completion":"fine thanks"})",
      R"([{"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"fine thanks"}]}])"};
  std::vector<uint32_t> first;
  for (size_t i = 0; i < files.size(); ++i) {
    auto st = run(dir, "f" + std::to_string(i) + ".jsonl", files[i] + "\n");
    ChatFile f = ChatFile::open(st.path);
    ASSERT_EQ(f.size(), 1u);
    std::vector<uint32_t> ids(f.ids(0), f.ids(0) + f.length(0));
    if (i == 0)
      first = ids;
    EXPECT_EQ(ids, first) << files[i];
    auto want =
        tmpl().render({{"user", "hello"}, {"assistant", "fine thanks"}});
    EXPECT_EQ(ids, want.ids);
    EXPECT_EQ(
        std::vector<uint8_t>(f.mask(0), f.mask(0) + f.length(0)), want.mask);
  }
}

TEST(ChatPrep, TextRecordsTrainOnEveryTokenButBos) {
  TempDir dir;
  auto st =
      run(dir,
          "t.jsonl",
          R"({"text":"hello there"})"
          "\n");
  ChatFile f = ChatFile::open(st.path);
  EXPECT_EQ(f.ids(0)[0], *tok().special_id("<|bos|>"));
  EXPECT_EQ(f.mask(0)[0], 0);
  EXPECT_EQ(st.trained_tokens, f.length(0) - 1);
}

TEST(ChatPrep, LongConversationsAreTruncatedAndCounted) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 5; ++i)
    jsonl += R"({"prompt":"hello","completion":")" +
        std::string(i % 2 ? 200 : 5, 'x') + "\"}\n";
  ChatPrepOptions opt;
  opt.max_length = 20;
  auto st = run(dir, "long.jsonl", jsonl, opt);
  EXPECT_EQ(st.written, 5u);
  EXPECT_EQ(st.truncated, 2u);
  ChatFile f = ChatFile::open(st.path);
  EXPECT_EQ(f.length(1), 20u);
}

TEST(ChatPrep, SubsampleIsReproducible) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 50; ++i)
    jsonl += R"({"prompt":"hello )" + std::to_string(i) +
        R"(","completion":"fine"})"
        "\n";
  ChatPrepOptions opt;
  opt.subsample = 10;
  opt.seed = 3;
  auto a = run(dir, "s.jsonl", jsonl, opt);
  std::string bytes_a = test::read_text(a.path);
  auto b = run(dir, "s.jsonl", jsonl, opt);
  EXPECT_EQ(test::read_text(b.path), bytes_a);
  EXPECT_EQ(a.written, 10u);
  opt.seed = 4;
  EXPECT_NE(test::read_text(run(dir, "s.jsonl", jsonl, opt).path), bytes_a);
}

TEST(ChatPrep, BadInputStopsWithFileAndLine) {
  TempDir dir;
  std::string good = R"({"prompt":"a","completion":"b"})";
  struct Case {
    std::string content, expect;
  };
  std::vector<Case> cases = {
      {good + "\n{broken\n", "bad.jsonl:2: not valid JSON"},
      {R"({"messages":[{"role":"robot","content":"x"},{"role":"assistant","content":"y"}]})",
       "bad.jsonl:1: unknown role 'robot'"},
      {R"({"messages":[]})", "bad.jsonl:1: the conversation is empty"},
      {R"({"messages":[{"role":"user","content":"only a question"}]})",
       "no assistant message"},
      {"{\"prompt\":\"a\",\"completion\":\"\xff\xfe\"}", "not valid UTF-8"},
      {R"({"conversations":[{"from":"alien","value":"x"}]})",
       "unknown role 'alien'"},
      {R"({"question":"x"})", "cannot tell the format"},
      {R"({"messages":[{"role":"user","content":5}]})",
       "\"content\" is missing or not a string"},
      {"[{\"text\": 1}, ", "not a valid JSON array"},
  };
  for (const auto& c : cases) {
    std::string e = error_of(dir, "bad.jsonl", c.content + "\n");
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.content << "\n" << e;
  }
  ChatPrepOptions opt;
  opt.inputs = {dir.file("missing.jsonl")};
  opt.out = dir.file("out");
  EXPECT_THROW(prepare_chat(tok(), tmpl(), opt), UserError);
}

TEST(ChatPrep, SkipBadCountsEveryBadRecord) {
  TempDir dir;
  ChatPrepOptions opt;
  opt.skip_bad = true;
  std::string content = R"({"prompt":"a","completion":"b"})"
                        "\n{oops\n"
                        R"({"messages":[]})"
                        "\n"
                        R"({"prompt":"c","completion":"d"})"
                        "\n";
  auto st = run(dir, "mixed.jsonl", content, opt);
  EXPECT_EQ(st.records, 4u);
  EXPECT_EQ(st.written, 2u);
  EXPECT_EQ(st.bad, 2u);
  ASSERT_EQ(st.bad_examples.size(), 2u);
  EXPECT_NE(st.bad_examples[0].find("mixed.jsonl:2"), std::string::npos);
  // Nothing usable at all is still an error.
  EXPECT_NE(
      error_of(dir, "none.jsonl", "{oops\n", opt)
          .find("no usable conversations"),
      std::string::npos);
}

TEST(ChatPrep, Utf8Validation) {
  EXPECT_TRUE(valid_utf8("plain ascii"));
  EXPECT_TRUE(valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xC3"));             // truncated
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));         // overlong
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));     // surrogate
  EXPECT_FALSE(valid_utf8("\xF4\x90\x80\x80")); // above U+10FFFF
  EXPECT_FALSE(valid_utf8("\x80"));
}

TEST(ChatFile, DamageIsAClearError) {
  TempDir dir;
  write_chat_file(dir.file("ok.chat"), {{{1, 2, 3}, {0, 1, 1}}, {{4}, {1}}});
  ChatFile f = ChatFile::open(dir.file("ok.chat"));
  EXPECT_EQ(f.size(), 2u);
  EXPECT_EQ(f.total_tokens(), 4u);
  EXPECT_EQ(f.ids(1)[0], 4u);
  std::string good = test::read_text(dir.file("ok.chat"));
  for (size_t cut : {size_t(0), size_t(10), good.size() - 1}) {
    std::string path = dir.write("cut.chat", good.substr(0, cut));
    EXPECT_THROW(ChatFile::open(path), UserError) << cut;
  }
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_THROW(ChatFile::open(dir.write("magic.chat", bad)), UserError);
}

// A prepared chat cache (the tokenized conversations training reads) whose
// bytes changed in place, same size, still opens as a .chat file: the
// checksums its folder recorded find it, say so, and it is prepared again
// rather than trained on.
TEST(ChatPrep, ACachedChatFileWithChangedBytesIsPreparedAgain) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 30; ++i)
    jsonl += R"({"messages": [{"role": "user", "content": "what is )" +
        std::to_string(i) +
        R"(?"}, {"role": "assistant", "content": "a number."}]})" + "\n";
  const train::ChatDataSpec spec{
      .files = {dir.write("chats.jsonl", jsonl)},
      .data_dir = dir.file("home"),
      .max_seq_len = 64,
      .tokenizer_dir = std::string(ORCHARD_FIXTURES) + "/hf/llama"};
  std::string said;
  auto say = [&](const std::string& s) { said += s + "\n"; };
  const train::ChatData first = train::prepare_chat_data(spec, say);
  const std::string good = test::read_text(first.train);
  ASSERT_TRUE(std::filesystem::exists(
      std::filesystem::path(first.train).parent_path() / "checksums.json"));
  // Untouched: reused, nothing prepared again.
  said.clear();
  train::prepare_chat_data(spec, say);
  EXPECT_EQ(said, "");
  // One token id changed: the file still opens.
  std::string bad = good;
  bad[bad.size() - 5] ^= 0x01;
  std::ofstream(first.train, std::ios::binary) << bad;
  ASSERT_NO_THROW(ChatFile::open(first.train));
  const train::ChatData again = train::prepare_chat_data(spec, say);
  EXPECT_NE(said.find("is damaged (its checksum changed)"), std::string::npos)
      << said;
  EXPECT_NE(said.find("train.chat"), std::string::npos) << said;
  EXPECT_EQ(test::read_text(again.train), good);
}

} // namespace
} // namespace orchard::data
