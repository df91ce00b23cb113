// orchard train resumes exactly: killed with SIGKILL at several points and
// started again, it ends with the same weights, bit for bit on the CPU, as
// a run never interrupted. SIGTERM saves and exits 143 (128 + SIGTERM),
// SIGHUP 129; a closed output pipe does not stop a run. A
// damaged newest checkpoint is skipped for the previous good one.
#include "core/safetensors.h"
#include "core/torch_compat.h"
#include "runs/checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

namespace orchard {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

struct TinyRun {
  TempDir dir;
  std::map<std::string, std::string> env;
  TinyRun() {
    dir.write("corpus/a.jsonl", test::numbered_documents(400));
    env = {{"ORCHARD_HOME", dir.file("home")}, {"OMP_NUM_THREADS", "2"}};
  }
  std::vector<std::string> args(const std::string& run) const {
    return {
        "train",
        "--device",
        "cpu",
        "data_paths=[" + dir.file("corpus") + "]",
        "depth=1",
        "max_seq_len=32",
        "total_batch_size=256",
        "num_iterations=40",
        "save_every=4",
        "eval_every=0",
        "eval_tokens=256",
        "save_total_limit=0",
        "run_dir=" + dir.file(run)};
  }
  std::map<std::string, torch::Tensor> final_weights(
      const std::string& run) const {
    return safetensors::load(
        dir.file(run + "/checkpoints/step_000040/model.safetensors"));
  }
};

void expect_identical(
    const std::map<std::string, torch::Tensor>& a,
    const std::map<std::string, torch::Tensor>& b,
    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a)
    EXPECT_TRUE(torch::equal(t, b.at(name)))
        << what << ": " << name << " differs";
}

// Waits until the run folder has a checkpoint of at least `step`.
bool wait_for_checkpoint(const std::string& run_dir, int64_t step, pid_t pid) {
  for (int i = 0; i < 6000; ++i) {
    for (const auto& [s, d] : runs::list_checkpoints(run_dir))
      if (s >= step)
        return true;
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return false; // finished or died first
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(TrainResume, SigkillAtSeveralPointsThenResumeIsBitExact) {
  TinyRun t;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_NE(ref.out.find("Optimizer: Muon"), std::string::npos) << ref.out;
  auto want = t.final_weights("reference");
  // The steps metrics.jsonl records, in order.
  auto logged_steps = [&](const std::string& run) {
    std::vector<int64_t> steps;
    std::istringstream in(test::read_text(t.dir.file(run + "/metrics.jsonl")));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step"))
        steps.push_back(j["step"].get<int64_t>());
    }
    return steps;
  };
  for (int64_t kill_after : {4, 16, 28}) {
    std::string run = "killed_" + std::to_string(kill_after);
    pid_t pid =
        test::spawn_orchard(t.args(run), t.env, t.dir.file(run + ".log"));
    bool mid_run = wait_for_checkpoint(t.dir.file(run), kill_after, pid);
    ::kill(pid, SIGKILL);
    test::wait_child(pid);
    EXPECT_TRUE(mid_run) << "the run ended before it could be killed at "
                         << kill_after;
    auto again = test::run_orchard(t.args(run), t.env);
    ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
    EXPECT_NE(again.out.find("Resuming from"), std::string::npos) << again.out;
    expect_identical(
        t.final_weights(run),
        want,
        "killed after step " + std::to_string(kill_after));
    // Steps redone after the resume are logged once, as in one run.
    EXPECT_EQ(logged_steps(run), logged_steps("reference")) << run;
  }
}

// A process restarted by its launcher (TORCHELASTIC_RESTART_COUNT above 0:
// `orchard launch --max-restarts`, torchrun's restarts) goes on from the
// run's newest checkpoint even when its command says resume=DIR of an
// earlier one, and ends where a run never stopped ends.
TEST(TrainResume, ARestartedProcessGoesOnFromTheNewestCheckpoint) {
  TinyRun t;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  pid_t pid = test::spawn_orchard(
      t.args("restarted"), t.env, t.dir.file("restarted.log"));
  const bool mid_run = wait_for_checkpoint(t.dir.file("restarted"), 16, pid);
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  ASSERT_TRUE(mid_run);
  int64_t newest = 0;
  for (const auto& [step, dir] :
       runs::list_checkpoints(t.dir.file("restarted")))
    newest = std::max(newest, step);
  auto args = t.args("restarted");
  const std::string earlier = t.dir.file("restarted/checkpoints/step_000004");
  args.push_back("resume=" + earlier);
  auto env = t.env;
  env["TORCHELASTIC_RESTART_COUNT"] = "1";
  auto again = test::run_orchard(args, env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(
      again.out.find(
          "Restart 1 of this run (TORCHELASTIC_RESTART_COUNT): "
          "resuming from its newest checkpoint, not from resume=" +
          earlier + "."),
      std::string::npos)
      << again.out;
  char from[64];
  std::snprintf(
      from,
      sizeof from,
      "checkpoints/step_%06lld (step %lld of 40)",
      static_cast<long long>(newest),
      static_cast<long long>(newest));
  EXPECT_NE(again.out.find(from), std::string::npos) << from << again.out;
  expect_identical(
      t.final_weights("restarted"), t.final_weights("reference"), "restarted");
}

// The same with AdamW and EMA (the default is Muon without EMA): one kill.
TEST(TrainResume, AdamwWithEmaResumesBitExact) {
  TinyRun t;
  auto args = [&](const std::string& run) {
    auto a = t.args(run);
    a.push_back("optimizer=adamw");
    a.push_back("ema=true");
    return a;
  };
  auto ref = test::run_orchard(args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_NE(ref.out.find("Optimizer: AdamW"), std::string::npos) << ref.out;
  pid_t pid = test::spawn_orchard(args("killed"), t.env, t.dir.file("k.log"));
  bool mid_run = wait_for_checkpoint(t.dir.file("killed"), 12, pid);
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  EXPECT_TRUE(mid_run);
  auto again = test::run_orchard(args("killed"), t.env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  auto got = t.final_weights("killed");
  EXPECT_TRUE(got.count("ema.wte.weight"));
  expect_identical(got, t.final_weights("reference"), "AdamW + EMA");
}

// Resumed with another device_batch_size, a run continues with the
// checkpoint's (its data position is in those units) and stays bit-exact.
TEST(TrainResume, AnotherDeviceBatchSizeOnResumeStaysExact) {
  TinyRun t;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_NE(ref.out.find("Batch: 8 x 32"), std::string::npos) << ref.out;
  pid_t pid = test::spawn_orchard(t.args("b8"), t.env, t.dir.file("b8.log"));
  bool mid_run = wait_for_checkpoint(t.dir.file("b8"), 8, pid);
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  EXPECT_TRUE(mid_run);
  auto args = t.args("b8");
  args.push_back("device_batch_size=4");
  auto again = test::run_orchard(args, t.env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(
      again.out.find("Continuing with device_batch_size=8"), std::string::npos)
      << again.out;
  EXPECT_NE(again.out.find("Batch: 8 x 32"), std::string::npos) << again.out;
  expect_identical(
      t.final_weights("b8"), t.final_weights("reference"), "B 4 -> 8");
}

TEST(TrainResume, SigtermSavesExits143AndResumes) {
  TinyRun t;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  pid_t pid =
      test::spawn_orchard(t.args("term"), t.env, t.dir.file("term.log"));
  ASSERT_TRUE(wait_for_checkpoint(t.dir.file("term"), 8, pid));
  ::kill(pid, SIGTERM);
  EXPECT_EQ(test::wait_child(pid), 128 + SIGTERM) << "stopped, not finished";
  std::string log = test::read_text(t.dir.file("term.log"));
  EXPECT_NE(log.find("Stopped by SIGTERM"), std::string::npos) << log;
  EXPECT_NE(log.find("Run the same command again to resume"), std::string::npos)
      << log;
  auto again = test::run_orchard(t.args("term"), t.env);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  expect_identical(
      t.final_weights("term"), t.final_weights("reference"), "after SIGTERM");
  // Starting a finished run again says so and changes nothing.
  auto done = test::run_orchard(t.args("term"), t.env);
  EXPECT_EQ(done.exit_code, 0);
  EXPECT_NE(done.out.find("already complete at step 40"), std::string::npos)
      << done.out;
}

// SIGHUP (the terminal or ssh session closed, no nohup) stops the run as
// SIGTERM does: the step finished, a checkpoint saved, exit 129. And output
// piped to a reader that has gone (`| head`, or `| tee` closed with the
// terminal) does not kill the run: it trains on to the end.
TEST(TrainResume, SighupSavesAndAClosedPipeDoesNotStopTheRun) {
  TinyRun t;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  pid_t pid = test::spawn_orchard(t.args("hup"), t.env, t.dir.file("hup.log"));
  ASSERT_TRUE(wait_for_checkpoint(t.dir.file("hup"), 8, pid));
  ::kill(pid, SIGHUP);
  EXPECT_EQ(test::wait_child(pid), 128 + SIGHUP) << "stopped, not finished";
  std::string log = test::read_text(t.dir.file("hup.log"));
  EXPECT_NE(
      log.find("Stopped by SIGHUP (the terminal closed) after step"),
      std::string::npos)
      << log;
  auto again = test::run_orchard(t.args("hup"), t.env);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  expect_identical(
      t.final_weights("hup"), t.final_weights("reference"), "after SIGHUP");

  // `head -n 1` reads the first line and exits; pipefail gives orchard's
  // own exit code (141, SIGPIPE's, if a write killed it).
  std::string cmd =
      "set -o pipefail; cd " + test::shell_quote(t.dir.path()) + " &&";
  for (const auto& [k, v] : t.env)
    cmd += " " + k + "=" + test::shell_quote(v);
  cmd += " " + test::shell_quote(ORCHARD_BIN);
  for (const auto& a : t.args("piped"))
    cmd += " " + test::shell_quote(a);
  cmd += " 2>&1 | head -n 1 >/dev/null";
  const int rc = std::system(("bash -c " + test::shell_quote(cmd)).c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  expect_identical(
      t.final_weights("piped"),
      t.final_weights("reference"),
      "output piped to head");
}

TEST(TrainResume, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  TinyRun t;
  auto args = t.args("damaged");
  args[7] = "num_iterations=12"; // checkpoints 4, 8, 12
  auto first = test::run_orchard(args, t.env);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::string newest =
      t.dir.file("damaged/checkpoints/step_000012/model.safetensors");
  std::string bytes = test::read_text(newest);
  t.dir.write(
      "damaged/checkpoints/step_000012/model.safetensors",
      bytes.substr(0, 100));
  args[7] = "num_iterations=16";
  auto again = test::run_orchard(args, t.env);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("skipping damaged checkpoint"), std::string::npos)
      << again.out;
  EXPECT_NE(again.out.find("Resuming from"), std::string::npos);
  EXPECT_NE(again.out.find("step_000008"), std::string::npos) << again.out;
}

// Bytes changed in place (the same size, so only a checksum finds them):
// the damaged checkpoint is named, moved aside (kept, never overwritten)
// and training resumes from the one before, ending bit-exact. A damaged
// checkpoint in the middle of the list is refused when named.
TEST(TrainResume, ChangedBytesAreFoundByTheChecksum) {
  TinyRun t;
  auto args = t.args("flipped");
  args[7] = "num_iterations=12"; // checkpoints 4, 8, 12
  ASSERT_EQ(test::run_orchard(args, t.env).exit_code, 0);
  auto flip = [&](const std::string& ckpt) {
    std::string path =
        t.dir.file("flipped/checkpoints/" + ckpt) + "/model.safetensors";
    std::string bytes = test::read_text(path);
    for (size_t i = bytes.size() - 64; i < bytes.size() - 32; ++i)
      bytes[i] = char(0xff); // inside the last tensor's data
    std::ofstream(path, std::ios::binary) << bytes;
  };
  flip("step_000012");
  flip("step_000004");
  auto gen = test::run_orchard(
      {"generate",
       "--checkpoint",
       t.dir.file("flipped/checkpoints/step_000004"),
       "--prompt",
       "Document",
       "--max-new-tokens",
       "2"},
      t.env);
  EXPECT_EQ(gen.exit_code, 2) << gen.out << gen.err;
  EXPECT_NE(gen.err.find("model.safetensors is damaged"), std::string::npos)
      << gen.err;
  EXPECT_EQ(gen.err.find("re-download"), std::string::npos) << gen.err;

  args[7] = "num_iterations=40";
  auto again = test::run_orchard(args, t.env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("model.safetensors is damaged"), std::string::npos)
      << again.out;
  EXPECT_NE(again.out.find("damaged-step_000012"), std::string::npos)
      << again.out;
  EXPECT_TRUE(
      fs::exists(t.dir.file("flipped/checkpoints/damaged-step_000012")));
  EXPECT_NE(again.out.find("step_000008"), std::string::npos) << again.out;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  expect_identical(
      t.final_weights("flipped"),
      t.final_weights("reference"),
      "resumed past a damaged checkpoint");
}

// A full disk while a checkpoint is written: a clear message and exit 1,
// nothing half-written left, the checkpoint before intact and used by the
// next run, which ends bit-exact.
TEST(TrainResume, DiskFullWhileSavingLosesNothing) {
  TinyRun t;
  auto env = t.env;
  env["ORCHARD_TEST_FAIL_WRITE"] = "optimizer.safetensors@3"; // step 12's
  auto r = test::run_orchard(t.args("full"), env);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(
      r.err.find("could not save the checkpoint of step 12"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("The checkpoint of step 8 is intact"), std::string::npos)
      << r.err;
  for (const auto& e : fs::directory_iterator(t.dir.file("full/checkpoints")))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos)
        << "left behind: " << e.path();
  auto kept = runs::list_checkpoints(t.dir.file("full"));
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(kept.back().first, 8);

  auto again = test::run_orchard(t.args("full"), t.env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("step_000008"), std::string::npos) << again.out;
  auto ref = test::run_orchard(t.args("reference"), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  expect_identical(
      t.final_weights("full"), t.final_weights("reference"), "after disk full");
}

// sample_every prints samples while training; epochs sets the length;
// bfloat16 autocast trains on the CPU; the split losses are printed.
TEST(TrainOptions, SamplesEpochsAndBfloat16) {
  TinyRun t;
  auto args = t.args("opts");
  args[7] = "epochs=0.5"; // replaces num_iterations=40
  args.push_back("sample_every=4");
  args.push_back("dtype=bfloat16");
  args.push_back("save_every=0");
  auto r = test::run_orchard(args, t.env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Samples at step 4:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Precision: bfloat16 autocast"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(0.50 epochs)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens of each split: train"), std::string::npos)
      << r.out;
  // The loss went down: the last logged step's loss is below the first's.
  std::string m = test::read_text(t.dir.file("opts/metrics.jsonl"));
  auto first = m.find("\"loss\":"), last = m.rfind("\"loss\":");
  ASSERT_NE(first, last);
  EXPECT_LT(std::stod(m.substr(last + 7)), std::stod(m.substr(first + 7)) - 0.5)
      << m;
}

TEST(TrainOptions, BadLengthAndPrecisionSettingsExitTwo) {
  TinyRun t;
  auto both = t.args("both");
  both.push_back("epochs=2"); // num_iterations=40 is on the command line too
  auto r = test::run_orchard(both, t.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("keep one of them"), std::string::npos) << r.err;
  auto f16 = t.args("f16");
  f16.push_back("dtype=float16");
  auto h = test::run_orchard(f16, t.env);
  if (h.exit_code != 0) { // libtorch 1.13 cannot autocast float16 on the CPU
    EXPECT_EQ(h.exit_code, 2);
    EXPECT_NE(
        h.err.find("dtype=float16 is not available on cpu"), std::string::npos)
        << h.err;
  }
}

// ORCHARD_TRACE_STEP is checked before the first step: a bad number or a
// file that cannot be written exits 2 with the fix; a good one writes the
// step's trace on libtorch 2.x and is refused with a message on 1.13 (no
// Kineto there).
TEST(TrainOptions, TraceVariablesAreCheckedBeforeTraining) {
  TinyRun t;
  auto args = t.args("traced");
  std::replace(
      args.begin(),
      args.end(),
      std::string("num_iterations=40"),
      std::string("num_iterations=3"));
  auto env = t.env;
  env["ORCHARD_TRACE"] = t.dir.file("step.json");
  for (const char* bad : {"abc", "0", "2x", "3-2", "2-", "2-x"}) {
    env["ORCHARD_TRACE_STEP"] = bad;
    auto r = test::run_orchard(args, env);
    EXPECT_EQ(r.exit_code, 2) << bad << r.out << r.err;
    EXPECT_NE(r.err.find("is not a step number"), std::string::npos)
        << bad << r.err;
    EXPECT_TRUE(runs::list_checkpoints(t.dir.file("traced")).empty()) << bad;
  }
  env["ORCHARD_TRACE_STEP"] = "2";
  env["ORCHARD_TRACE"] = t.dir.file("no-such-folder/step.json");
  auto r = test::run_orchard(args, env);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("cannot be written"), std::string::npos) << r.err;
  env["ORCHARD_TRACE"] = t.dir.file("step.json");
  env["ORCHARD_TRACE_STEP"] = "2-3"; // a range: steps 2 and 3
  r = test::run_orchard(args, env);
  if (compat::kTorch2) {
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    std::ifstream f(t.dir.file("step.json"));
    const std::string text(
        (std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("traceEvents"), std::string::npos);
  } else {
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("ORCHARD_TRACE needs libtorch 2.x"), std::string::npos)
        << r.err;
  }
}

TEST(TrainResume, IndivisibleBatchIsTheKnownMessage) {
  TinyRun t;
  auto args = t.args("bad");
  args.push_back("device_batch_size=3");
  auto r = test::run_orchard(args, t.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find(
          "total_batch_size must be divisible by device_batch_size × max_seq_len"),
      std::string::npos)
      << r.err;
}

// `key=value` in place of the argument that sets `key`, or added.
std::vector<std::string> with(
    std::vector<std::string> args,
    const std::string& kv) {
  const std::string key = kv.substr(0, kv.find('=') + 1);
  for (auto& a : args)
    if (a.rfind(key, 0) == 0) {
      a = kv;
      return args;
    }
  args.push_back(kv);
  return args;
}

std::vector<double> logged(const std::string& metrics, const std::string& key) {
  std::vector<double> out;
  std::istringstream in(test::read_text(metrics));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains(key))
      out.push_back(j[key].get<double>());
  }
  return out;
}

// batch_schedule (modded-nanogpt's train_bs_schedule): steps of 256, 512
// and 768 tokens over thirds of the run, each logged; with a constant
// learning rate the run is, bit for bit, the one that raises
// total_batch_size by hand at each stage's first step; killed in the
// second stage it resumes bit-exact.
TEST(TrainBatchSchedule, StepsGrowByThirdsAsByHandAndResumeExactly) {
  TinyRun t;
  auto args = [&](const std::string& run, const std::string& batch, int steps) {
    auto a = t.args(run);
    a.erase(std::find(a.begin(), a.end(), "total_batch_size=256"));
    a.push_back(batch);
    a = with(a, "num_iterations=" + std::to_string(steps));
    a = with(a, "save_every=2");
    a.push_back("warmdown_ratio=0");
    a.push_back("device_batch_size=8");
    return a;
  };
  const std::string schedule = "batch_schedule=[256,2*256,3*256]";
  auto ref = test::run_orchard(args("sched", schedule, 12), t.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_NE(
      ref.out.find("batch schedule 256 tokens a step for steps 1-4, 512 for "
                   "steps 5-8, 768 for steps 9-12"),
      std::string::npos)
      << ref.out;
  EXPECT_NE(ref.out.find("step 5 on: 512 tokens a step"), std::string::npos)
      << ref.out;
  std::vector<double> want_tokens;
  for (int step = 0; step < 12; ++step) // modded-nanogpt: thirds of 12
    want_tokens.push_back(256.0 * (1 + std::min(2, 3 * step / 12)));
  EXPECT_EQ(
      logged(t.dir.file("sched/metrics.jsonl"), "batch_tokens"), want_tokens);
  const auto final_weights = [&](const std::string& run) {
    return safetensors::load(
        t.dir.file(run + "/checkpoints/step_000012/model.safetensors"));
  };

  // By hand: 4 steps of 256 tokens, then on to step 8 with 512, then to 12
  // with 768.
  for (const auto& [tokens, until] : {std::pair{256, 4}, {512, 8}, {768, 12}}) {
    auto r = test::run_orchard(
        args("hand", "total_batch_size=" + std::to_string(tokens), until),
        t.env);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  expect_identical(
      final_weights("hand"),
      final_weights("sched"),
      "batch_schedule against total_batch_size raised by hand");

  pid_t pid = test::spawn_orchard(
      args("killed", schedule, 12), t.env, t.dir.file("killed.log"));
  const bool mid_run = wait_for_checkpoint(t.dir.file("killed"), 6, pid);
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  EXPECT_TRUE(mid_run);
  auto again = test::run_orchard(args("killed", schedule, 12), t.env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("Resuming from"), std::string::npos) << again.out;
  expect_identical(
      final_weights("killed"),
      final_weights("sched"),
      "killed in the second stage");
  EXPECT_EQ(
      logged(t.dir.file("killed/metrics.jsonl"), "batch_tokens"), want_tokens);
}

TEST(TrainBatchSchedule, BadSchedulesExitTwoWithTheFix) {
  TinyRun t;
  auto run = [&](std::vector<std::string> extra) {
    auto a = t.args("bad");
    a.erase(std::find(a.begin(), a.end(), "total_batch_size=256"));
    for (const auto& e : extra)
      a.push_back(e);
    return test::run_orchard(a, t.env);
  };
  auto r = run({"batch_schedule=[256,300]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("batch_schedule[1] = 300 tokens is not a whole number "
                 "of micro-steps of 32 tokens"),
      std::string::npos)
      << r.err;
  r = run({"batch_schedule=[256,lots]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("batch_schedule[1] = 'lots'"), std::string::npos)
      << r.err;
  r = run({"batch_schedule_steps=[10]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("without batch_schedule"), std::string::npos) << r.err;
  r = run({"batch_schedule=[512,1024]", "total_batch_size=256"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("keep one of them"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t.dir.file("bad/checkpoints")));
}

} // namespace
} // namespace orchard
