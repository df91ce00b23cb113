// Token shards (.bin), text -> shards, and the WordNet corpus.
#include "core/error.h"
#include "data/shards.h"
#include "data/text_prep.h"
#include "data/wordnet.h"
#include "test_util.h"
#include "text/bpe_train.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

namespace orchard::data {
namespace {

using test::TempDir;

// A shard built by hand the way modded-nanogpt's fineweb.py writes one:
// np.zeros(256, int32) header with magic, version 1 and the count, then
// uint16 tokens.
std::string foreign_shard(const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = int32_t(tokens.size());
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

TEST(Shards, ReadsAForeignModdedNanogptShard) {
  TempDir dir;
  std::string path = dir.write(
      "fineweb_train_000001.bin", foreign_shard({50256, 15496, 995, 0, 65535}));
  Shard s = Shard::open(path);
  EXPECT_EQ(s.version(), 1);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0], 50256u);
  EXPECT_EQ(s[4], 65535u);
  uint32_t buf[3];
  s.read(1, 3, buf);
  EXPECT_EQ(buf[0], 15496u);
  EXPECT_EQ(buf[2], 0u);
}

TEST(Shards, WriterPicksVersionAndRoundTrips) {
  TempDir dir;
  write_shard(dir.file("a.bin"), {1, 2, 65535}, 50257);
  EXPECT_EQ(test::read_text(dir.file("a.bin")), foreign_shard({1, 2, 65535}));
  write_shard(dir.file("b.bin"), {1, 70000, 128255}, 128256);
  Shard b = Shard::open(dir.file("b.bin"));
  EXPECT_EQ(b.version(), 2);
  EXPECT_EQ(b[1], 70000u);
  EXPECT_EQ(b[2], 128255u);
}

TEST(Shards, WriterSplitsIntoNumberedShards) {
  TempDir dir;
  {
    ShardWriter w(dir.file("out"), "web", "train", 1000, 4);
    w.append({1, 2, 3});
    w.append({4, 5, 6, 7, 8, 9});
    w.finish();
    EXPECT_EQ(w.tokens_written(), 9u);
    EXPECT_EQ(w.files().size(), 3u);
  }
  auto files = find_shards(dir.file("out"), "train");
  ASSERT_EQ(files.size(), 3u);
  EXPECT_NE(files[0].find("web_train_000000.bin"), std::string::npos);
  EXPECT_EQ(Shard::open(files[1])[0], 5u);
  EXPECT_EQ(Shard::open(files[2]).size(), 1u);
  EXPECT_TRUE(find_shards(dir.file("out"), "val").empty());
}

TEST(Shards, DamagedShardsAreClearErrors) {
  TempDir dir;
  auto error = [&](const std::string& bytes) {
    std::string path = dir.write("s.bin", bytes);
    try {
      Shard::open(path);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string good = foreign_shard({1, 2, 3});
  EXPECT_NE(
      error(good.substr(0, 100)).find("shorter than the 1024-byte header"),
      std::string::npos);
  EXPECT_NE(
      error(good.substr(0, good.size() - 1)).find("truncated"),
      std::string::npos);
  std::string bad_magic = good;
  bad_magic[0] = 1;
  EXPECT_NE(error(bad_magic).find("not a token shard"), std::string::npos);
  std::string bad_version = good;
  bad_version[4] = 9;
  EXPECT_NE(error(bad_version).find("version 9"), std::string::npos);
  EXPECT_NE(error(good + "xx").find("truncated or damaged"), std::string::npos);
  EXPECT_THROW(Shard::open(dir.file("missing.bin")), UserError);
}

text::Tokenizer small_tokenizer() {
  text::BpeTrainer t({.vocab_size = 300});
  t.add_text("hello world, the quick brown fox. hello again world.");
  return t.train();
}

TEST(TextPrep, DocumentsStartWithBosAndSplitDeterministically) {
  TempDir dir;
  auto tok = small_tokenizer();
  std::string jsonl;
  for (int i = 0; i < 10; ++i)
    jsonl += nlohmann::json{{"text", "doc " + std::to_string(i)}}.dump() + "\n";
  dir.write("in/a.jsonl", jsonl);
  dir.write("in/b.txt", "a whole file is one document");
  TextPrepOptions opt;
  opt.inputs = {dir.file("in")};
  opt.out = dir.file("out");
  opt.val_fraction = 0.25; // every 4th document: 0, 4, 8
  auto st = prepare_text(tok, opt);
  EXPECT_EQ(st.documents, 11u);
  EXPECT_EQ(st.val_documents, 3u);
  EXPECT_EQ(st.train_documents, 8u);
  auto bos = *tok.special_id("<|bos|>");
  auto read_all = [](const std::string& path) {
    Shard s = Shard::open(path);
    std::vector<uint32_t> v(s.size());
    s.read(0, v.size(), v.data());
    return v;
  };
  auto val = read_all(find_shards(opt.out, "val").at(0));
  EXPECT_EQ(val.front(), bos);
  EXPECT_EQ(std::count(val.begin(), val.end(), bos), 3);
  // Documents 0, 4 and 8, each after its BOS, in order.
  std::vector<uint32_t> doc0 = {bos}, want;
  for (int d : {0, 4, 8}) {
    want.push_back(bos);
    tok.encode_ordinary("doc " + std::to_string(d), want);
  }
  EXPECT_EQ(val, want);
  auto train = read_all(find_shards(opt.out, "train").at(0));
  EXPECT_EQ(std::count(train.begin(), train.end(), bos), 8);
  EXPECT_EQ(st.train_tokens, train.size());
  auto meta = nlohmann::json::parse(test::read_text(opt.out + "/in_meta.json"));
  EXPECT_EQ(meta["bos_id"], bos);
  EXPECT_EQ(meta["train_tokens"], train.size());
}

TEST(TextPrep, BadInputNamesFileAndLine) {
  TempDir dir;
  auto tok = small_tokenizer();
  TextPrepOptions opt;
  opt.out = dir.file("out");
  auto error = [&](const std::string& name, const std::string& content) {
    opt.inputs = {dir.write(name, content)};
    try {
      prepare_text(tok, opt);
    } catch (const UserError& e) {
      EXPECT_EQ(e.exit_code(), kExitFailure);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error("a.jsonl", "{\"text\":\"ok\"}\n{broken\n")
          .find("a.jsonl:2: not valid JSON"),
      std::string::npos);
  EXPECT_NE(
      error("b.jsonl", "{\"body\":\"x\"}\n")
          .find("b.jsonl:1: expected {\"text\""),
      std::string::npos);
  EXPECT_NE(
      error("c.txt", "only one").find("went to validation"), std::string::npos);
  // A token shard (orchard data text's own output) given back as text: it
  // was trained on as gibberish before.
  std::string shard(1024, '\0');
  shard[0] = '\x30';
  EXPECT_NE(
      error("e_train_000000.bin", shard).find("e_train_000000.bin' is not text"),
      std::string::npos);
  opt.inputs = {dir.file("nope")};
  EXPECT_THROW(prepare_text(tok, opt), UserError);
  opt.inputs = {dir.write("d.txt", "x")};
  opt.val_fraction = 1.5;
  EXPECT_THROW(prepare_text(tok, opt), UserError);
}

TEST(TextPrep, ProseFilesSplitIntoParagraphsOrLines) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(
      prose_documents("First para\nstill first.\n\n  \nSecond.\r\n\nThird"),
      (V{"First para\nstill first.", "Second.\r", "Third"}));
  // No blank line: one document per line.
  EXPECT_EQ(prose_documents("one\ntwo\nthree\n"), (V{"one", "two", "three"}));
  EXPECT_TRUE(prose_documents("\n \n\t\n").empty());
  EXPECT_TRUE(is_prose_file("a/Book.TXT"));
  EXPECT_TRUE(is_prose_file("notes.md"));
  EXPECT_FALSE(is_prose_file("main.cpp"));

  // A single book trains: its paragraphs are the documents.
  TempDir dir;
  auto tok = small_tokenizer();
  std::string book;
  for (int i = 0; i < 400; ++i)
    book += "Paragraph " + std::to_string(i) + "\nwraps here.\n\n";
  TextPrepOptions opt;
  opt.inputs = {dir.write("book.txt", book)};
  opt.out = dir.file("out");
  auto st = prepare_text(tok, opt);
  EXPECT_EQ(st.documents, 400u);
  EXPECT_EQ(st.val_documents, 2u); // documents 0 and 200
  // Source code stays one document a file.
  opt.inputs = {dir.write("a.cpp", "int a;\n\nint b;\n")};
  opt.out = dir.file("out2");
  opt.val_fraction = 0;
  EXPECT_EQ(prepare_text(tok, opt).documents, 1u);
}

TEST(TextPrep, TokenizerWithoutBosIsAnError) {
  text::Tokenizer tok({{"a", 0, 0}}, {}, text::kGpt4Pattern, "test");
  EXPECT_THROW(bos_id(tok), UserError);
}

// Two synsets in the wndb(5) format, one with an example.
const char* kDataNoun =
    "  1 This software and database is being provided to you, the LICENSEE\n"
    "00217499 04 n 01 disaster 0 001 @ 00217014 n 0000 | an act that has "
    "disastrous consequences  \n"
    "00217593 04 n 02 kill 1 laying_waste 0 002 @ 00217014 n 0000 + 00355365 v "
    "0101 | the destruction of an enemy plane; \"the pilot reported two kills "
    "during the mission\"; \"another\"  \n";

TEST(Wordnet, ParsesGlossesExamplesAndSplitsByHeadword) {
  TempDir dir;
  dir.write("wn/data.noun", kDataNoun);
  for (const char* f : {"data.verb", "data.adj", "data.adv"})
    dir.write(std::string("wn/") + f, "");
  WordnetOptions opt;
  opt.wordnet_dir = dir.file("wn");
  opt.out = dir.file("out");
  opt.val_fraction = 0; // everything in train
  auto st = build_wordnet_corpus(opt);
  EXPECT_EQ(st.synsets, 2u);
  EXPECT_EQ(st.headwords, 2u);
  EXPECT_EQ(st.train_chats, 3u); // two "mean", one "use"
  EXPECT_EQ(
      test::read_text(opt.out + "/text_train.jsonl"),
      "{\"text\":\"disaster (noun): An act that has disastrous consequences.\"}\n"
      "{\"text\":\"kill, laying waste (noun): The destruction of an enemy plane. "
      "Example: The pilot reported two kills during the mission. Example: "
      "Another.\"}\n");
  std::string chats = test::read_text(opt.out + "/chat_train.jsonl");
  EXPECT_NE(chats.find("What does 'kill' mean?"), std::string::npos);
  EXPECT_NE(chats.find("Use 'kill' in a sentence."), std::string::npos);
  EXPECT_NE(
      chats.find("The pilot reported two kills during the mission."),
      std::string::npos);

  opt.val_fraction = 1; // everything held out
  st = build_wordnet_corpus(opt);
  EXPECT_EQ(st.val_headwords, 2u);
  EXPECT_EQ(test::read_text(opt.out + "/text_train.jsonl"), "");
}

TEST(Wordnet, SplitIsStableAndNearTheFraction) {
  EXPECT_EQ(wordnet_is_val("apple", 0.05), wordnet_is_val("apple", 0.05));
  int val = 0;
  for (int i = 0; i < 20000; ++i)
    val += wordnet_is_val("word" + std::to_string(i), 0.05);
  EXPECT_NEAR(val / 20000.0, 0.05, 0.01);
}

TEST(Wordnet, MissingWordnetNamesThePackage) {
  TempDir dir;
  try {
    find_wordnet_dir(dir.file("nothing"), test::env_of({}));
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no WordNet data"), std::string::npos);
  }
  try {
    find_wordnet_dir("", test::env_of({}), {dir.file("a"), dir.file("b")});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("apt-get install wordnet-base"),
        std::string::npos);
    EXPECT_NE(
        std::string(e.what()).find("brew install wordnet"), std::string::npos);
  }
  dir.write("wn/data.noun", "");
  EXPECT_EQ(
      find_wordnet_dir("", test::env_of({{"WNSEARCHDIR", dir.file("wn")}}), {}),
      dir.file("wn"));
}

} // namespace
} // namespace orchard::data
