// The orchard binary, run as a user would: exit codes and what it prints.
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <regex>

namespace orchard {
namespace {

using test::run_orchard;

using test::contains;

TEST(Cli, VersionAndHelp) {
  auto r = run_orchard({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.out, "0.1.0")) << r.out;
  // The commit the binary was built from, read at every build (not only
  // when CMake configured the build folder): the source tree's HEAD.
  std::string head;
  const std::string git = "git -C " + test::shell_quote(ORCHARD_SOURCE_DIR) +
      " rev-parse --short HEAD 2>/dev/null";
  if (FILE* p = ::popen(git.c_str(), "r")) {
    char line[64] = {};
    if (std::fgets(line, sizeof line, p) != nullptr)
      head = std::string(line, std::strcspn(line, "\n"));
    ::pclose(p);
  }
  if (!head.empty())
    EXPECT_TRUE(
        contains(r.out, "(git " + head + ")") ||
        contains(r.out, "(git " + head + "+changes)"))
        << r.out << " was not built from " << head
        << ": rebuild (cmake --build build) and run the tests again";
  r = run_orchard({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.out, "doctor")) << r.out;
  EXPECT_TRUE(contains(r.out, "config")) << r.out;
}

TEST(Cli, NoOrUnknownSubcommandIsAUsageError) {
  auto r = run_orchard({});
  EXPECT_EQ(r.exit_code, 2);
  r = run_orchard({"trian"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(r.err.empty());
}

TEST(Cli, ConfigHelpListsEveryOptionWithItsDefault) {
  auto r = run_orchard({"config", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* opt :
       {"depth=4",
        "arch.n_embd=auto",
        "device_batch_size=auto",
        "total_batch_size=4096",
        "optimizer=muon",
        "lr=auto",
        "epochs=auto",
        "split_tokens=auto",
        "dtype=auto",
        "seed=42",
        "save_every=25",
        "--preset",
        "--config",
        "--device",
        "--assume-device",
        "--memory-gb"})
    EXPECT_TRUE(contains(r.out, opt)) << opt << "\n" << r.out;
}

TEST(Cli, ConfigPrintsResolvedYaml) {
  test::TempDir dir;
  std::string file = dir.write("run.yaml", "max_seq_len: 128\n");
  auto r = run_orchard(
      {"config", "--preset", "quick", "--config", file, "depth=3", "ema=True"},
      {{"TOTAL_BATCH_SIZE", "4096"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "depth: 3  # command line")) << r.out;
  EXPECT_TRUE(contains(r.out, "max_seq_len: 128  # " + file + ":1")) << r.out;
  EXPECT_TRUE(
      contains(r.out, "total_batch_size: 4096  # environment TOTAL_BATCH_SIZE"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "num_iterations: 100  # preset quick")) << r.out;
  EXPECT_TRUE(contains(r.out, "ema: true")) << r.out;
  EXPECT_TRUE(contains(r.out, "# Using device: ")) << r.out;
  // The output is itself a valid config file that resolves to the same.
  std::string again = dir.write("again.yaml", r.out);
  auto r2 = run_orchard({"config", "--config", again});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  auto strip = [](std::string s) {
    std::string out, line;
    std::istringstream in(s);
    while (std::getline(in, line))
      if (line.rfind("#", 0) != 0)
        out += line.substr(0, line.find("  #")) + "\n";
    return out;
  };
  EXPECT_EQ(strip(r2.out), strip(r.out));
}

TEST(Cli, ConfigErrorsExitTwoWithTheReason) {
  auto r = run_orchard({"config", "arch.hiden_size=512"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(
      r.err,
      "unknown key 'arch.hiden_size' (command line 'arch.hiden_size=512'); did "
      "you mean 'arch.hidden_size'?"))
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;

  r = run_orchard({"config", "--config", "/no/such/file.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "not found")) << r.err;

  r = run_orchard({"config"}, {{"DEPTH", "deep"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "environment DEPTH")) << r.err;

  r = run_orchard({"config", "--preset", "nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(
      r.err,
      "the presets are: grpo-wordle-qwen-3b, lora-llama-3.2-3b, overnight, quick"))
      << r.err;
}

TEST(Cli, AssumedMachinesAndMemoryOverrides) {
  auto r =
      run_orchard({"config", "--assume-device", "mps", "--memory-gb", "64"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(
      contains(r.out, "# Using device: Apple Silicon (simulated) (MPS)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "# memory: 64.0 GiB unified (simulated)"))
      << r.out;

  r = run_orchard({"config", "--assume-device", "mps"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "needs --memory-gb")) << r.err;

  r = run_orchard({"config", "--assume-device", "tpu", "--memory-gb", "8"});
  EXPECT_EQ(r.exit_code, 2);

  r = run_orchard({"config", "--device", "cpu"}, {{"MEMORY_SIZE", "16"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "# memory: 16.0 GiB (MEMORY_SIZE=16)")) << r.out;

  r = run_orchard({"config"}, {{"MEMORY_SIZE", "lots"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "MEMORY_SIZE='lots'")) << r.err;
}

TEST(Cli, UnavailableDeviceExitsTwoAndListsDevices) {
  for (const char* dev : {"mps", "cuda:7", "tpu"}) {
    auto r = run_orchard({"doctor", "--device", dev});
    EXPECT_EQ(r.exit_code, 2) << dev;
    EXPECT_TRUE(contains(r.err, "cpu")) << r.err;
  }
}

TEST(Cli, DoctorIsReadyOnThisMachine) {
  auto r = run_orchard({"doctor", "--device", "cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Using device: CPU")) << r.out;
  EXPECT_TRUE(contains(r.out, "libtorch ")) << r.out;
  EXPECT_TRUE(contains(r.out, "matmul 1024x1024 fp32: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "forward/backward/AdamW step: ok")) << r.out;
  EXPECT_TRUE(contains(r.out, "Ready to train on CPU")) << r.out;
}

// On an x86 CPU with AVX2 and FMA, orchard never runs OpenBLAS's generic
// Prescott kernels, even where OpenBLAS itself picks them (a CPU model
// newer than it: Emerald Rapids with Debian 12's 0.3.21, 4-5x slower);
// OPENBLAS_CORETYPE set by the user is kept. (The test binary's own main
// may have set the variable for itself: orchard runs without it here.)
TEST(Cli, DoctorNeverRunsOpenBlasGenericKernelsOnAModernCpu) {
#if defined(__x86_64__) && defined(__linux__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "SKIPPED: the CPU has no AVX2 + FMA";
  const char* ours = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = ours ? ours : "";
  ::unsetenv("OPENBLAS_CORETYPE");
  auto r = run_orchard({"doctor", "--device", "cpu"});
  if (ours)
    ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  if (!contains(r.out, "OpenBLAS ("))
    GTEST_SKIP() << "SKIPPED: the BLAS is not OpenBLAS";
  EXPECT_TRUE(contains(r.out, " kernels)")) << r.out;
  EXPECT_FALSE(contains(r.out, "Prescott kernels")) << r.out;
  r = run_orchard(
      {"doctor", "--device", "cpu"},
      {{"OPENBLAS_CORETYPE", "Haswell"}, {"ORCHARD_BLAS_CORE_FROM", ""}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Haswell kernels)")) << r.out;
  EXPECT_FALSE(contains(r.out, "Orchard asked for")) << r.out;
#else
  GTEST_SKIP() << "SKIPPED: x86-64 Linux only";
#endif
}

// `generate` and `chat` of the sft model with `flags` both exit 2 saying
// `message`.
void refused_by_generate_and_chat(
    const std::vector<std::string>& flags,
    const std::string& message) {
  for (const char* command : {"generate", "chat"}) {
    std::vector<std::string> args = {
        command,
        "-i",
        "sft",
        std::string(command) == "chat" ? "-p" : "--prompt",
        "hi"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_orchard(args);
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_TRUE(contains(r.err, message)) << command << ": " << r.err;
  }
}

// generate and chat accept the same sampling ranges (one check, before a
// model is loaded) and say every range in the refusal.
TEST(Cli, SamplingRangesAreTheSameForGenerateAndChat) {
  for (const auto& flags : std::vector<std::vector<std::string>>{
           {"--temperature", "2.5"}, {"--top-p", "0"}, {"--top-k", "-1"}})
    refused_by_generate_and_chat(
        flags,
        "--temperature must be in [0, 2], --top-p in (0, 1], --top-k in "
        "[0, 1048576] and --max-new-tokens >= 1.");
  // min-p and the repetition penalty: their own messages.
  refused_by_generate_and_chat({"--min-p", "1.5"}, "--min-p must be in [0, 1]");
  refused_by_generate_and_chat(
      {"--repetition-penalty", "0"}, "--repetition-penalty must be in (0, 10]");
  refused_by_generate_and_chat(
      {"--sampling-device", "gpu"}, "--sampling-device is auto, cpu or device");
}

// --dtype: a Hugging Face folder decodes in the dtype asked (the status
// line names it; float32 on the CPU says what bfloat16 would do), a wrong
// name or a dtype for an Orchard checkpoint exits 2 before anything loads.
TEST(Cli, GenerateLoadsAHuggingFaceFolderInTheDtypeAsked) {
  const std::string llama = std::string(ORCHARD_FIXTURES) + "/hf/llama";
  auto greedy = [&](std::vector<std::string> more) {
    std::vector<std::string> args = {
        "generate",
        "--model",
        llama,
        "--device",
        "cpu",
        "--prompt",
        "what is a river",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6"};
    args.insert(args.end(), more.begin(), more.end());
    return run_orchard(args);
  };
  auto r = greedy({});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string plain = r.out + r.err;
  EXPECT_TRUE(contains(plain, "layers, float32)")) << plain;
  EXPECT_TRUE(contains(plain, "--dtype bfloat16 is about twice as fast"))
      << plain;
  r = greedy({"--dtype", "bfloat16"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string half = r.out + r.err;
  EXPECT_TRUE(contains(half, "layers, bfloat16)")) << half;
  EXPECT_FALSE(contains(half, "is about twice as fast")) << half;
  EXPECT_TRUE(contains(half, "what is a river")) << half;
  // float16: GPUs only.
  r = greedy({"--dtype", "float16"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--dtype float16 on the CPU")) << r.err;
  r = greedy({"--dtype", "int8"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(
      r.err, "--dtype int8: expected auto, float32, bfloat16 or float16."))
      << r.err;
  // serve and eval load through the same path: the same refusals, before
  // serve listens or eval reads a question.
  for (const char* command : {"serve", "eval"}) {
    r = run_orchard(
        {command, "--model", llama, "--device", "cpu", "--dtype", "int8"});
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "--dtype int8: expected auto")) << r.err;
    r = run_orchard(
        {command, "--model", llama, "--device", "cpu", "--dtype", "float16"});
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "--dtype float16 on the CPU")) << r.err;
  }
  refused_by_generate_and_chat(
      {"--dtype", "bfloat16"}, "only a Hugging Face folder (--model DIR)");
}

// WORLD_SIZE is checked everywhere, but only training reads the rest of
// torchrun's variables: a half-set launch is refused before anything runs.
TEST(Cli, AHalfSetLaunchIsRefusedForTrainingOnly) {
  auto r = run_orchard({"doctor", "--device", "cpu"}, {{"WORLD_SIZE", "2"}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_orchard({"doctor", "--device", "cpu"}, {{"WORLD_SIZE", "two"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "WORLD_SIZE='two'")) << r.err;
  test::TempDir cwd; // nothing may be written, but not into the build
  for (const char* command : {"train", "pipeline"}) {
    r = run_orchard(
        {command, "--device", "cpu"}, {{"WORLD_SIZE", "2"}}, cwd.path());
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "RANK is not set")) << command << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "orchard launch --nproc-per-node"))
        << command << ": " << r.err;
  }
}

} // namespace
} // namespace orchard

namespace orchard {
namespace {

const std::string kCl100k =
    std::string(ORCHARD_FIXTURES) + "/tokenizers/cl100k_base";

TEST(CliTokenizer, EncodeDecodeRoundTripsExactBytes) {
  test::TempDir dir;
  std::string text = "Héllo 🎉 world\r\n\ttabs  <|endoftext|>\n";
  text += std::string("\xff\xfe raw bytes", 12);
  std::string in = dir.write("in.txt", text);
  auto enc = test::run_orchard(
      {"tokenizer", "encode", "--tokenizer", kCl100k, "--input", in});
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  EXPECT_EQ(enc.out.find("100257"), std::string::npos)
      << "special token from text";
  std::string ids = dir.write("ids.txt", enc.out);
  auto dec = test::run_orchard(
      {"tokenizer", "decode", "--tokenizer", kCl100k, "--input", ids});
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_TRUE(dec.out == text);

  auto special = test::run_orchard(
      {"tokenizer",
       "encode",
       "--tokenizer",
       kCl100k,
       "--input",
       dir.write("s.txt", "<|endoftext|>"),
       "--allow-special"});
  EXPECT_EQ(special.out, "100257\n");
}

TEST(CliTokenizer, InfoAndErrors) {
  auto info = test::run_orchard({"tokenizer", "info", "--tokenizer", kCl100k});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("vocab_size: 100277"), std::string::npos) << info.out;
  // Its only special token ends a text: the plain family.
  EXPECT_NE(info.out.find("chat_template: plain (built-in)"), std::string::npos)
      << info.out;
  auto hf = test::run_orchard(
      {"tokenizer",
       "info",
       "--tokenizer",
       std::string(ORCHARD_FIXTURES) + "/hf/qwen2"});
  EXPECT_NE(
      hf.out.find("qwen2/chat_template.jinja (the model's Jinja template)"),
      std::string::npos)
      << hf.out;
  EXPECT_NE(info.out.find("100257 <|endoftext|>"), std::string::npos)
      << info.out;

  test::TempDir dir;
  auto bad = test::run_orchard(
      {"tokenizer",
       "decode",
       "--tokenizer",
       kCl100k,
       "--input",
       dir.write("b.txt", "1 2 x")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("token 3: 'x'"), std::string::npos) << bad.err;
  bad = test::run_orchard(
      {"tokenizer",
       "decode",
       "--tokenizer",
       kCl100k,
       "--input",
       dir.write("c.txt", "999999")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("not in the vocabulary"), std::string::npos)
      << bad.err;
  bad =
      test::run_orchard({"tokenizer", "info", "--tokenizer", dir.file("none")});
  EXPECT_EQ(bad.exit_code, 2);
  bad = test::run_orchard(
      {"tokenizer",
       "encode",
       "--tokenizer",
       kCl100k,
       "--input",
       dir.file("none")});
  EXPECT_EQ(bad.exit_code, 2);
}

} // namespace
} // namespace orchard

namespace orchard {
namespace {

TEST(CliTokenizer, TrainThenEncode) {
  test::TempDir dir;
  std::string corpus;
  for (int i = 0; i < 300; ++i)
    corpus += "hello world, tokenizers learn merges from text number " +
        std::to_string(i) + "\n";
  dir.write("data/a.txt", corpus);
  dir.write("data/sub/b.txt", "more words in a nested folder\n");
  auto r = test::run_orchard(
      {"tokenizer",
       "train",
       "--input",
       dir.file("data"),
       "--vocab-size",
       "400",
       "--out",
       dir.file("tok")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Wrote "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 file(s)"), std::string::npos) << r.out;
  auto info =
      test::run_orchard({"tokenizer", "info", "--tokenizer", dir.file("tok")});
  EXPECT_NE(info.out.find("vocab_size: 400"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("<|assistant_start|>"), std::string::npos)
      << info.out;

  auto bad = test::run_orchard(
      {"tokenizer",
       "train",
       "--input",
       dir.file("nothing"),
       "--out",
       dir.file("t2")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("does not exist"), std::string::npos) << bad.err;
  bad = test::run_orchard(
      {"tokenizer",
       "train",
       "--input",
       dir.file("data"),
       "--vocab-size",
       "10",
       "--out",
       dir.file("t3")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("too small"), std::string::npos) << bad.err;
}

} // namespace
} // namespace orchard

namespace orchard {
namespace {

// The whole data path from the command line: WordNet corpus, a tokenizer
// trained on it, text shards and chat data.
TEST(CliData, WordnetToShardsAndChat) {
  test::TempDir dir;
  // A two-synset WordNet in the wndb(5) format.
  dir.write(
      "wn/data.noun",
      "00217499 04 n 01 disaster 0 001 @ 00217014 n 0000 | an act that has "
      "disastrous consequences  \n"
      "00217593 04 n 01 kill 1 001 @ 00217014 n 0000 | the destruction of an "
      "enemy plane; \"the pilot reported two kills\"  \n");
  for (const char* f : {"data.verb", "data.adj", "data.adv"})
    dir.write(std::string("wn/") + f, "");
  auto wn = test::run_orchard(
      {"data",
       "wordnet",
       "--wordnet-dir",
       dir.file("wn"),
       "--out",
       dir.file("corpus"),
       "--val-fraction",
       "0"});
  ASSERT_EQ(wn.exit_code, 0) << wn.err;
  EXPECT_NE(wn.out.find("2 synsets"), std::string::npos) << wn.out;

  auto tok = test::run_orchard(
      {"tokenizer",
       "train",
       "--input",
       dir.file("corpus/text_train.jsonl"),
       "--vocab-size",
       "300",
       "--out",
       dir.file("tok")});
  ASSERT_EQ(tok.exit_code, 0) << tok.err;

  auto text = test::run_orchard(
      {"data",
       "text",
       "--input",
       dir.file("corpus/text_train.jsonl"),
       "--tokenizer",
       dir.file("tok"),
       "--out",
       dir.file("shards"),
       "--name",
       "wn",
       "--split",
       "train"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("train 2 docs"), std::string::npos) << text.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("shards/wn_train_000000.bin")));

  auto chat = test::run_orchard(
      {"data",
       "chat",
       "--input",
       dir.file("corpus/chat_train.jsonl"),
       "--tokenizer",
       dir.file("tok"),
       "--out",
       dir.file("chat")});
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.out.find("wrote 3 conversations"), std::string::npos)
      << chat.out;
  EXPECT_NE(chat.out.find("template: orchard"), std::string::npos) << chat.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("chat/chat_train.chat")));

  // Bad input: exit 1 with file:line; --skip-bad counts instead.
  std::string bad = dir.write(
      "bad.jsonl",
      R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})"
      "\n"
      R"({"messages":[{"role":"robot","content":"x"}]})"
      "\n");
  auto stop = test::run_orchard(
      {"data",
       "chat",
       "--input",
       bad,
       "--tokenizer",
       dir.file("tok"),
       "--out",
       dir.file("c2")});
  EXPECT_EQ(stop.exit_code, 1);
  EXPECT_NE(
      stop.err.find("bad.jsonl:2: unknown role 'robot'"), std::string::npos)
      << stop.err;
  auto skip = test::run_orchard(
      {"data",
       "chat",
       "--input",
       bad,
       "--tokenizer",
       dir.file("tok"),
       "--out",
       dir.file("c2"),
       "--skip-bad"});
  EXPECT_EQ(skip.exit_code, 0) << skip.err;
  EXPECT_NE(skip.out.find("1 bad record(s) skipped"), std::string::npos)
      << skip.out;

  auto missing =
      test::run_orchard({"data", "wordnet", "--wordnet-dir", dir.file("none")});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("no WordNet data"), std::string::npos)
      << missing.err;
  auto unknown = test::run_orchard(
      {"data",
       "chat",
       "--input",
       bad,
       "--tokenizer",
       dir.file("tok"),
       "--out",
       dir.file("c3"),
       "--chat-template",
       "alpaca"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(
      unknown.err.find("llama3|chatml|mistral|orchard"), std::string::npos);
}

} // namespace
} // namespace orchard

namespace orchard {
namespace {

TEST(CliPlan, TableJsonAssumedMacAndErrors) {
  auto r = test::run_orchard({"plan", "--device", "cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Budget:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<- chosen"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Choice: device_batch_size="), std::string::npos);
  auto j = test::run_orchard(
      {"plan",
       "--json",
       "--preset",
       "overnight",
       "--assume-device",
       "mps",
       "--memory-gb",
       "16"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out.substr(j.out.find('{')));
  EXPECT_NE(
      doc["budget"]["why"].get<std::string>().find("65 %"), std::string::npos);
  ASSERT_FALSE(doc["choice"].is_null());
  EXPECT_EQ(
      doc["choice"]["device_batch_size"].get<int64_t>() *
          doc["choice"]["grad_accum_steps"].get<int64_t>() * 512,
      16384);
  // The largest model at 1 GB has nothing that fits: exit 1 and the fix.
  auto none = test::run_orchard(
      {"plan",
       "--assume-device",
       "cuda",
       "--memory-gb",
       "1",
       "depth=24",
       "max_seq_len=2048",
       "total_batch_size=65536",
       "gradient_checkpointing=false"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.out.find("Shorten max_seq_len"), std::string::npos)
      << none.out;
  // A set device_batch_size is what the plan shows, with its verdict.
  auto set =
      test::run_orchard({"plan", "--device", "cpu", "device_batch_size=4"});
  EXPECT_EQ(set.exit_code, 0) << set.err;
  EXPECT_NE(set.out.find("device_batch_size=4 is set"), std::string::npos)
      << set.out;
  EXPECT_NE(set.out.find(") fits the budget"), std::string::npos) << set.out;
  auto over = test::run_orchard(
      {"plan",
       "--assume-device",
       "cuda",
       "--memory-gb",
       "1",
       "depth=12",
       "max_seq_len=1024",
       "total_batch_size=16384",
       "device_batch_size=16"});
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_NE(over.out.find("does NOT fit"), std::string::npos) << over.out;
  auto bad = test::run_orchard({"plan", "device_batch_size=3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(
      bad.err.find("total_batch_size must be divisible"), std::string::npos)
      << bad.err;
}

// --probe trains two real steps at the chosen size and the next one up;
// the prediction is within a quarter of the measured resident set (the
// calibrated error on this CPU is within 15 %; a test process is noisier).
TEST(CliPlan, ProbeMeasuresNearThePrediction) {
  auto r = test::run_orchard(
      {"plan",
       "--device",
       "cpu",
       "--probe",
       "depth=4",
       "total_batch_size=2048",
       "memory_fraction=0.05",
       "--memory-gb",
       "8"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto at = r.out.find("Probe");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::regex pct(
      R"(measured [0-9,]+ MB, predicted [0-9,]+ MB \(([-+][0-9.]+) %\))");
  int found = 0;
  std::string probe = r.out.substr(at);
  for (std::sregex_iterator m(probe.begin(), probe.end(), pct), end; m != end;
       ++m, ++found)
    EXPECT_LT(std::abs(std::stod((*m)[1].str())), 25.0) << r.out;
  EXPECT_GE(found, 1) << r.out;
}

} // namespace
} // namespace orchard
