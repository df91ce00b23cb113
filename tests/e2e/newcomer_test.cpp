// What a new user hit on a fresh checkout (issue 17), each as a test that
// failed before its fix: training on one's own text file, "train further"
// reaching the chat model, reruns keeping their reports, JSON alone on
// stdout.
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace orchard {
namespace {

namespace fs = std::filesystem;
using test::run_orchard;
using test::TempDir;

std::vector<std::string> tiny_train(
    const std::string& data,
    const std::string& run_dir,
    std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "train",
      "--device",
      "cpu",
      "data_paths=[" + data + "]",
      "depth=1",
      "max_seq_len=32",
      "total_batch_size=256",
      "num_iterations=4",
      "eval_every=0",
      "eval_tokens=256",
      "sample_every=0",
      "run_dir=" + run_dir};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// One book (paragraphs between blank lines) trains: its paragraphs are the
// documents, and the split option exists in `orchard train` itself.
TEST(Newcomer, OneTextFileTrains) {
  TempDir dir;
  std::string book;
  for (int i = 0; i < 600; ++i)
    book += "Chapter " + std::to_string(i % 30) + " goes on, and the fox " +
        "runs\nover the hill number " + std::to_string(i * 7919 % 1000) +
        ".\n\n";
  dir.write("book.txt", book);
  std::map<std::string, std::string> env = {
      {"ORCHARD_HOME", dir.file("home")}, {"OMP_NUM_THREADS", "2"}};
  auto r = run_orchard(
      tiny_train(dir.file("book.txt"), dir.file("run"), {"val_fraction=0.01"}),
      env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Done: step 4"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir.file("run/report.md")));
  // The hints name the binary as it was run (it is not on PATH).
  EXPECT_NE(
      r.out.find("Generate more: " + std::string(ORCHARD_BIN) + " generate"),
      std::string::npos)
      << r.out;

  // A cached shard whose bytes changed is found by its checksum and the
  // data prepared again (not trained on).
  std::string shard;
  for (const auto& e : fs::recursive_directory_iterator(dir.file("home")))
    if (e.path().extension() == ".bin" &&
        e.path().string().find("_train_") != std::string::npos)
      shard = e.path().string();
  ASSERT_FALSE(shard.empty());
  std::string bytes = test::read_text(shard);
  bytes[bytes.size() - 3] ^= 0x5a;
  std::ofstream(shard, std::ios::binary) << bytes;
  r = run_orchard(
      tiny_train(
          dir.file("book.txt"), dir.file("run_again"), {"val_fraction=0.01"}),
      env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("is damaged (its checksum changed)"), std::string::npos)
      << r.out;

  // A single paragraph cannot be split: the error names a fix that
  // `orchard train` has (not `orchard data text`'s --val-fraction).
  dir.write("one.txt", "Only one paragraph here.\n");
  r = run_orchard(tiny_train(dir.file("one.txt"), dir.file("run1")), env);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("split it into documents"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--val-fraction"), std::string::npos) << r.err;

  r = run_orchard(
      tiny_train(dir.file("book.txt"), dir.file("run2"), {"val_fraction=0"}),
      env);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("val_fraction"), std::string::npos) << r.err;

  // A micro-batch far beyond the CPU's memory is refused before training
  // (the kernel would kill the process with no message), naming the
  // largest size that fits.
  auto small_machine = env;
  small_machine["MEMORY_SIZE"] = "1";
  r = run_orchard(
      tiny_train(
          dir.file("book.txt"),
          dir.file("run3"),
          {"depth=4",
           "max_seq_len=256",
           "total_batch_size=131072",
           "device_batch_size=512"}),
      small_machine);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("kills a process"), std::string::npos) << r.err;
  EXPECT_NE(
      r.err.find("The largest size that fits is device_batch_size="),
      std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir.file("run3/checkpoints")));
}

// stage=lora on a model with fewer positions than the default
// max_seq_length (1024) uses the model's; a value set by hand is kept.
TEST(Newcomer, FineTuningFitsTheModelsPositions) {
  const std::string llama = std::string(ORCHARD_FIXTURES) + "/hf/llama";
  auto r = run_orchard({"config", "stage=lora", "model=" + llama});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("max_seq_length: 256"), std::string::npos) << r.out;
  r = run_orchard(
      {"config", "stage=lora", "model=" + llama, "max_seq_length=128"});
  EXPECT_NE(r.out.find("max_seq_length: 128"), std::string::npos) << r.out;
}

// A merge killed part way leaves <out>.partial, never a folder that looks
// finished; the next merge replaces the leftover and completes.
TEST(Newcomer, AMergeCutShortIsRedone) {
  TempDir dir;
  const std::string fixtures = ORCHARD_FIXTURES;
  dir.write("merged.partial/model.safetensors", "cut short by SIGKILL");
  auto r = run_orchard(
      {"lora",
       "merge",
       "--model",
       fixtures + "/hf/llama",
       "--adapter",
       fixtures + "/hf/llama_lora",
       "--out",
       dir.file("merged")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(dir.file("merged/config.json")));
  EXPECT_TRUE(fs::exists(dir.file("merged/tokenizer.json")));
  EXPECT_FALSE(fs::exists(dir.file("merged.partial")));
  // The merged weights load as a model.
  r = run_orchard(
      {"generate",
       "--model",
       dir.file("merged"),
       "--prompt",
       "hi",
       "--max-new-tokens",
       "2"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// Machine-readable output is alone on stdout: `plan --json` parses.
TEST(Newcomer, JsonAloneOnStdout) {
  auto r = run_orchard({"plan", "--device", "cpu", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  EXPECT_NE(r.err.find("Using device"), std::string::npos) << r.err;
  r = run_orchard(
      {"plan",
       "--json",
       "--assume-device",
       "mps",
       "--memory-gb",
       "16",
       "stage=lora",
       "model=" + std::string(ORCHARD_FIXTURES) + "/hf/llama"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
}

} // namespace
} // namespace orchard
