// The chat stages and `orchard pipeline` from the command line, on a tiny
// corpus: base -> mid -> sft with reports, stage status and resume, -i,
// chat in the terminal (one-shot and the REPL) and the errors users meet.
#include "runs/checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

namespace orchard {
namespace {

namespace fs = std::filesystem;
using test::run_orchard;
using test::TempDir;

using test::contains;

struct TinyPipeline {
  TempDir dir;
  std::map<std::string, std::string> env;
  TinyPipeline() {
    std::string text, chats;
    const char* words[] = {
        "apple",
        "river",
        "stone",
        "cloud",
        "ember",
        "maple",
        "quartz",
        "harbor",
        "lantern",
        "meadow"};
    for (int i = 0; i < 2000; ++i) // 1 in 200 documents validates
      text += "{\"text\": \"The " + std::string(words[i % 10]) +
          " is a thing number " + std::to_string(i * 7 % 97) +
          " that people describe in plain words.\"}\n";
    for (int i = 0; i < 80; ++i)
      chats +=
          "{\"messages\": [{\"role\": \"user\", \"content\": \"What is "
          "the " +
          std::string(words[i % 10]) + " " + std::to_string(i) +
          "?\"}, {\"role\": \"assistant\", \"content\": \"A thing number " +
          std::to_string(i * 7 % 97) + ".\"}]}\n";
    dir.write("corpus/a.jsonl", text);
    dir.write("chats/c.jsonl", chats);
    fs::create_directories(dir.file("work"));
    env = {{"ORCHARD_HOME", dir.file("home")}, {"OMP_NUM_THREADS", "2"}};
  }
  std::vector<std::string> args(
      const std::string& cmd,
      std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {
        cmd,
        "--device",
        "cpu",
        "data_paths=[" + dir.file("corpus") + "]",
        "chat_data=[" + dir.file("chats") + "]",
        "depth=1",
        "max_seq_len=32",
        "total_batch_size=256",
        "eval_every=0",
        "eval_tokens=256",
        "sample_every=0",
        "save_every=2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string work() const {
    return dir.file("work");
  }
  std::string path(const std::string& rel) const {
    return dir.file("work/" + rel);
  }
  nlohmann::json final_state(const std::string& run) const {
    auto ckpts = runs::list_checkpoints(path(run));
    EXPECT_FALSE(ckpts.empty()) << run;
    std::ifstream in(ckpts.back().second + "/state.json");
    return nlohmann::json::parse(in);
  }
};

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Pipeline, RunsEveryStageReportsAndThenSaysItIsDone) {
  TinyPipeline t;
  auto r = run_orchard(
      t.args(
          "pipeline",
          {"num_iterations=6", "mid_iterations=4", "sft_iterations=4"}),
      t.env,
      t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "base  runs/base/d1")) << r.out;
  EXPECT_TRUE(contains(r.out, "not started")) << r.out;
  EXPECT_TRUE(contains(r.out, "The pipeline is complete")) << r.out;
  EXPECT_TRUE(contains(r.out, "orchard chat -i sft")) << r.out;
  // Each stage: its final checkpoint, from the stage before.
  auto base = t.final_state("runs/base/d1");
  auto mid = t.final_state("runs/mid/d1");
  auto sft = t.final_state("runs/sft/d1");
  EXPECT_TRUE(base["complete"].get<bool>());
  EXPECT_EQ(base["stage"], "base");
  EXPECT_EQ(mid["stage"], "mid");
  EXPECT_EQ(sft["stage"], "sft");
  EXPECT_TRUE(contains(
      mid["init"].get<std::string>(), "runs/base/d1/checkpoints/step_000006"));
  EXPECT_TRUE(contains(
      sft["init"].get<std::string>(), "runs/mid/d1/checkpoints/step_000004"));
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/sft/d1")).back().first, 4);
  // Reports: one per stage and the combined one, with SVG loss curves.
  for (const char* stage : {"base", "mid", "sft"}) {
    std::string run = t.path(std::string("runs/") + stage + "/d1");
    auto md = read_file(run + "/report.md");
    EXPECT_TRUE(contains(md, "## System")) << stage;
    EXPECT_TRUE(contains(md, "Peak memory")) << stage;
    EXPECT_TRUE(contains(md, "![loss curves](loss.svg)")) << stage;
    EXPECT_TRUE(contains(md, "## Config")) << stage;
    auto svg = read_file(run + "/loss.svg");
    EXPECT_TRUE(contains(svg, "<svg")) << stage;
    EXPECT_TRUE(contains(svg, "<polyline")) << stage;
  }
  auto combined = read_file(t.path("runs/report-d1.md"));
  EXPECT_TRUE(contains(combined, "| base | 6 |")) << combined;
  EXPECT_TRUE(contains(combined, "| sft | 4 |")) << combined;
  EXPECT_TRUE(contains(combined, "](base/d1/loss.svg)")) << combined;
  EXPECT_TRUE(contains(combined, "**Q:**")) << combined;

  // Again: everything is done; nothing trains.
  r = run_orchard(
      t.args(
          "pipeline",
          {"num_iterations=6", "mid_iterations=4", "sft_iterations=4"}),
      t.env,
      t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "done at step 6")) << r.out;
  EXPECT_TRUE(contains(r.out, "done at step 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "The pipeline was already complete")) << r.out;
  EXPECT_FALSE(contains(r.out, "step 1/")) << r.out;
  // The rerun kept every report whole: the same results as the first run
  // wrote (bits per byte, final losses, the checkpoint), and the same
  // answers in the combined report.
  for (const char* stage : {"base", "mid", "sft"}) {
    std::string md =
        read_file(t.path(std::string("runs/") + stage + "/d1/report.md"));
    EXPECT_TRUE(contains(md, "/checkpoints/step_")) << stage << md;
  }
  auto base_md = read_file(t.path("runs/base/d1/report.md"));
  EXPECT_TRUE(contains(base_md, "Final loss, train / val split")) << base_md;
  EXPECT_TRUE(contains(base_md, "Unigram baseline")) << base_md;
  auto combined_again = read_file(t.path("runs/report-d1.md"));
  EXPECT_TRUE(contains(combined_again, "**Q:**")) << combined_again;
  EXPECT_TRUE(contains(combined_again, "Unigram baseline")) << combined_again;

  // More sft steps asked for (the environment alias): only sft trains on.
  auto env = t.env;
  env["SFT_ITERATIONS"] = "6";
  r = run_orchard(
      t.args("pipeline", {"num_iterations=6", "mid_iterations=4"}),
      env,
      t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "6 asked for")) << r.out;
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/sft/d1")).back().first, 6);
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/mid/d1")).back().first, 4);

  // "Train further" reaches the chat model: mid trains on to 5, so the sft
  // trained from mid's step 4 is stale, set aside and trained again.
  r = run_orchard(
      t.args(
          "pipeline",
          {"num_iterations=6", "mid_iterations=5", "sft_iterations=6"}),
      t.env,
      t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "trains again after mid")) << r.out;
  EXPECT_TRUE(contains(r.out, "the old run is kept in runs/sft/d1.old-1"))
      << r.out;
  EXPECT_TRUE(contains(
      t.final_state("runs/sft/d1")["init"].get<std::string>(),
      "runs/mid/d1/checkpoints/step_000005"));
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/sft/d1")).back().first, 6);
  EXPECT_EQ(
      runs::list_checkpoints(t.path("runs/sft/d1.old-1")).back().first, 6);
  EXPECT_TRUE(contains(
      read_file(t.path("runs/sft/d1/report.md")),
      "runs/mid/d1/checkpoints/step_000005"));

  // -i names a stage's model everywhere a checkpoint is expected.
  r = run_orchard(
      {"generate",
       "-i",
       "base",
       "--prompt",
       "The apple",
       "--max-new-tokens",
       "4"},
      t.env,
      t.work());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "runs/base/d1/checkpoints/step_000006")) << r.out;
  EXPECT_TRUE(contains(r.out, "tokens at ")) << r.out; // prompt speed
  EXPECT_TRUE(contains(r.out, "generation ")) << r.out;
  r = run_orchard(
      {"chat",
       "-i",
       "sft",
       "-p",
       "What is the apple 3?",
       "--max-new-tokens",
       "6",
       "--verbose"},
      t.env,
      t.work());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // -p: the answer alone on stdout, what was loaded on stderr.
  EXPECT_TRUE(contains(r.err, "runs/sft/d1/checkpoints/step_000006")) << r.err;
  EXPECT_FALSE(contains(r.out, "Using device")) << r.out;
  EXPECT_FALSE(contains(r.out, "Model:")) << r.out;
  EXPECT_FALSE(r.out.empty());
  EXPECT_TRUE(contains(r.err, "[prompt ")) << r.err; // --verbose, on stderr
  EXPECT_FALSE(contains(r.out, "[prompt ")) << r.out;
  r = run_orchard({"chat", "-i", "sft", "-p", ""}, t.env, t.work());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "-p/--prompt is empty")) << r.err;
  // The REPL from a pipe: two turns, /clear, /system, an unknown command.
  r = run_orchard(
      {"chat", "--checkpoint", "runs/sft/d1", "--max-new-tokens", "4"},
      t.env,
      t.work(),
      std::string("What is the river 1?\n/clear\n/system Be brief.\n"
                  "/bogus\nWhat is the stone 2?\n/exit\n"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(new chat)")) << r.out;
  EXPECT_TRUE(contains(r.out, "(system message set; new chat)")) << r.out;
  EXPECT_TRUE(contains(r.out, "Unknown command /bogus")) << r.out;
  // Two replies were written.
  size_t replies = 0;
  for (size_t at = 0; (at = r.out.find("orchard> ", at)) != std::string::npos;
       ++at)
    ++replies;
  EXPECT_EQ(replies, 2u) << r.out;
}

// The rl stage, asked for with rl_iterations: GRPO from the sft run on
// WordNet's questions (here a hand-written corpus where the default one is
// built).
TEST(Pipeline, RlStageTrainsFromSftAndReportsBeforeAndAfter) {
  TinyPipeline t;
  const char* words[][3] = {
      {"apple", "noun", "A round fruit."},
      {"run", "verb", "Move fast on foot."},
      {"green", "adj", "Of the colour of grass."},
      {"stone", "noun", "A piece of rock."},
      {"sing", "verb", "Make musical sounds."},
      {"quickly", "adv", "With speed."}};
  std::string train, val;
  for (int i = 0; i < 30; ++i) {
    const auto& w = words[i % 6];
    (i % 5 == 4 ? val : train) +=
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What does '" +
        std::string(w[0]) +
        "' mean?\"}, {\"role\": \"assistant\", \"content\": \"'" + w[0] +
        "' (" + w[1] + "): " + w[2] + "\"}]}\n";
  }
  t.dir.write("home/wordnet/chat_train.jsonl", train);
  t.dir.write("home/wordnet/chat_val.jsonl", val);
  const std::vector<std::string> lengths = {
      "num_iterations=4", "mid_iterations=2", "sft_iterations=2",
      "rl_iterations=3"};
  auto r = run_orchard(t.args("pipeline", lengths), t.env, t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "rl    runs/rl/d1")) << r.out;
  EXPECT_TRUE(contains(r.out, "==> Stage rl (GRPO on WordNet's questions)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "Before training: held-out reward")) << r.out;
  EXPECT_TRUE(contains(r.out, "orchard chat -i rl")) << r.out;
  auto rl = t.final_state("runs/rl/d1");
  EXPECT_TRUE(rl["complete"].get<bool>());
  EXPECT_EQ(rl["stage"], "grpo");
  EXPECT_EQ(rl["env"], "wordnet");
  EXPECT_TRUE(contains(
      rl["init"].get<std::string>(), "runs/sft/d1/checkpoints/step_000002"));
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/rl/d1")).back().first, 3);
  // The reports: the held-out reward and the share answered right, before
  // and after, as numbers.
  auto combined = read_file(t.path("runs/report-d1.md"));
  EXPECT_TRUE(contains(combined, "- rl (GRPO on WordNet's questions)"))
      << combined;
  EXPECT_TRUE(contains(combined, "| grpo | 3 |")) << combined;
  EXPECT_TRUE(contains(combined, "| Held-out reward before / after | "))
      << combined;
  EXPECT_TRUE(contains(
      combined,
      "| Answers naming the word and its part of speech before / after | "))
      << combined;
  std::ifstream before_in(t.path("runs/rl/d1/eval_before.json"));
  auto before = nlohmann::json::parse(before_in);
  EXPECT_GE(before["reward"].get<double>(), 0.0);
  EXPECT_GT(before["completions"].get<int>(), 0);
  // Done: a second run trains nothing and keeps the rows.
  r = run_orchard(t.args("pipeline", lengths), t.env, t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "done at step 3")) << r.out;
  EXPECT_FALSE(contains(r.out, "Before training")) << r.out;
  EXPECT_TRUE(contains(
      read_file(t.path("runs/report-d1.md")), "Held-out reward before / after"));
  // sft trains further: rl is stale, kept aside and trained again from it.
  auto longer = lengths;
  longer[2] = "sft_iterations=3";
  r = run_orchard(t.args("pipeline", longer), t.env, t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "trains again after sft")) << r.out;
  EXPECT_TRUE(contains(
      t.final_state("runs/rl/d1")["init"].get<std::string>(),
      "runs/sft/d1/checkpoints/step_000003"));
  EXPECT_TRUE(fs::exists(t.path("runs/rl/d1.old-1")));
  // -i rl is the chat model.
  r = run_orchard(
      {"chat", "-i", "rl", "-p", "What does 'apple' mean?",
       "--max-new-tokens", "4", "--verbose"},
      t.env,
      t.work());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "runs/rl/d1/checkpoints/step_000003")) << r.err;
}

TEST(Pipeline, AStageKilledPartWayIsPartialAndResumes) {
  TinyPipeline t;
  // Base first, on its own.
  auto r = run_orchard(t.args("train", {"num_iterations=4"}), t.env, t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // mid, killed after its checkpoint at step 2 (of 40).
  pid_t pid = test::spawn_orchard(
      t.args("train", {"stage=mid", "num_iterations=40"}),
      t.env,
      t.dir.file("mid.log"),
      t.work());
  bool saw = false;
  for (int i = 0; i < 12000 && !saw; ++i) {
    for (const auto& [s, d] : runs::list_checkpoints(t.path("runs/mid/d1")))
      saw = saw || (s >= 2 && s < 40);
    if (!saw)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  ASSERT_TRUE(saw) << read_file(t.dir.file("mid.log"));
  const int64_t at = runs::list_checkpoints(t.path("runs/mid/d1")).back().first;
  ASSERT_LT(at, 40);
  r = run_orchard(
      t.args(
          "pipeline",
          {"num_iterations=4", "mid_iterations=40", "sft_iterations=2"}),
      t.env,
      t.work());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "done at step 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "partial at step " + std::to_string(at)))
      << r.out;
  EXPECT_TRUE(contains(r.out, "Resuming from")) << r.out;
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/mid/d1")).back().first, 40);
  EXPECT_EQ(runs::list_checkpoints(t.path("runs/sft/d1")).back().first, 2);
}

TEST(Pipeline, ClearErrorsForMissingModelsAndWrongKeys) {
  TinyPipeline t;
  auto r = run_orchard(
      t.args("train", {"stage=mid", "num_iterations=2"}), t.env, t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "train stage=base first")) << r.err;
  r = run_orchard({"chat", "-i", "sft", "-p", "hi"}, t.env, t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "no sft model under runs/sft/")) << r.err;
  r = run_orchard(
      {"generate", "-i", "final", "--prompt", "x"}, t.env, t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "the stages are base, mid, sft and rl")) << r.err;
  r = run_orchard({"chat", "-p", "hi"}, t.env, t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "which model?")) << r.err;
  r = run_orchard(t.args("pipeline", {"stage=sft"}), t.env, t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "runs every stage")) << r.err;
  r = run_orchard(t.args("train", {"stage=final"}), t.env, t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "stage")) << r.err;
  r = run_orchard(
      {"serve", "--checkpoint", t.path("nothing"), "--port", "0"},
      t.env,
      t.work());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "does not exist")) << r.err;
}

} // namespace
} // namespace orchard
