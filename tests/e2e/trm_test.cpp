// orchard train stage=trm from the command line: the quick preset learns
// 4x4 Sudoku on the CPU (held-out exact accuracy through `orchard eval`,
// an answer through `orchard solve`), a run killed with SIGKILL resumes
// to the same weights, EMA and ACT carry as one never interrupted, and bad
// input ends in a message with exit 2.
#include "core/safetensors.h"
#include "runs/checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <chrono>
#include <csignal>
#include <thread>

namespace orchard {
namespace {

using test::TempDir;

const std::map<std::string, std::string> kEnv = {{"OMP_NUM_THREADS", "1"}};

// `orchard data sudoku` of `count` puzzles of side `size` in `dir`.
void make_data(
    const std::string& dir,
    int count,
    int size = 4,
    const std::string& difficulty = "auto") {
  auto r = test::run_orchard(
      {"data",
       "sudoku",
       "--size",
       std::to_string(size),
       "--count",
       std::to_string(count),
       "--difficulty",
       difficulty,
       "--out",
       dir},
      kEnv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// orchard train --preset trm-sudoku-quick on the CPU on `data` into `run`,
// with more settings after: the arguments, and a run of them.
std::vector<std::string> quick_args(
    const std::string& data,
    const std::string& run,
    const std::vector<std::string>& settings = {}) {
  std::vector<std::string> args = {
      "train",
      "--preset",
      "trm-sudoku-quick",
      "--device",
      "cpu",
      "data=" + data,
      "run_dir=" + run};
  args.insert(args.end(), settings.begin(), settings.end());
  return args;
}
test::CliResult train_quick(
    const std::string& data,
    const std::string& run,
    const std::vector<std::string>& settings = {}) {
  return test::run_orchard(quick_args(data, run, settings), kEnv);
}

// orchard solve --json on one puzzle (`how`: --puzzle or --input).
nlohmann::json solve_json(
    const std::string& run,
    const std::string& how,
    const std::string& what) {
  auto s = test::run_orchard(
      {"solve", "--checkpoint", run, "--device", "cpu", "--json", how, what},
      kEnv);
  EXPECT_EQ(s.exit_code, 0) << s.err;
  return nlohmann::json::parse(s.out.substr(s.out.find('{')));
}

// Each command exits 2 with its text in the message.
struct Refused {
  std::vector<std::string> args;
  std::string says;
};
void expect_refused(const std::vector<Refused>& refused) {
  for (const auto& c : refused) {
    auto r = test::run_orchard(c.args, kEnv);
    EXPECT_EQ(r.exit_code, 2) << c.args.back() << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos)
        << c.says << " not in: " << r.err;
  }
}

TEST(TrmCli, TheQuickPresetLearnsFourByFourSudoku) {
  TempDir t;
  make_data(t.file("s4"), 2500);
  auto r = train_quick(t.file("s4"), t.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto e = test::run_orchard(
      {"eval", "--checkpoint", t.file("run"), "--device", "cpu", "--json"},
      kEnv);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const auto j = nlohmann::json::parse(e.out.substr(e.out.find('{')));
  EXPECT_EQ(j["puzzles"], 250);
  EXPECT_EQ(j["weights"], "ema");
  // The issue's bar: 0.9 exact on held-out puzzles (measured 1.0).
  EXPECT_GE(j["exact_accuracy"].get<double>(), 0.9) << e.out;
  // The last supervision step is no worse than the first (the gain
  // itself is TheRecursionAddsAccuracy...'s: here the first step already
  // solves nearly all).
  const auto by_step = j["exact_accuracy_by_step"];
  EXPECT_GE(by_step.back().get<double>(), by_step.front().get<double>());
  // A held-out puzzle solved from the command line keeps every rule.
  std::ifstream test_csv(t.file("s4/test.csv"));
  std::string header, line;
  std::getline(test_csv, header);
  std::getline(test_csv, line);
  const std::string puzzle = line.substr(line.find(',') + 1, 16);
  const auto a = solve_json(t.file("run"), "--puzzle", puzzle);
  EXPECT_EQ(a["puzzle"], puzzle);
  EXPECT_EQ(a["answer"].get<std::string>().size(), 16u);
  EXPECT_EQ(a["valid"].get<bool>(), a["problem"].get<std::string>().empty());
}

// The recursion's signature: on 6x6 minimal Sudoku the quick preset's
// model (the paper's MLP across positions, width 32) answers far more
// held-out puzzles after 8 supervision steps than after the first while
// it learns (measured, EMA weights: 0 % -> 32 % at step 800, 2 % -> 45 %
// at 900; the issue's prototype: 0.2 % -> 38 %). A carry that did not
// pass from step to step would give the same answer after every step.
TEST(TrmCli, SixBySixAnswersImproveWithEverySupervisionStep) {
  TempDir t;
  make_data(t.file("s6"), 2500, 6, "minimal");
  auto r = train_quick(
      t.file("s6"),
      t.file("run"),
      {"num_iterations=900",
       "eval_every=100",
       "eval_size=250",
       "save_every=900"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Every evaluation, of the EMA and of the raw weights: exact accuracy
  // after the first and after the last supervision step.
  int gains = 0;
  double final_exact = 0;
  std::string seen;
  std::ifstream metrics(t.file("run/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    for (const std::string w : {"", "raw_"}) {
      if (!j.contains(w + "val_exact_accuracy"))
        continue;
      const double first = j[w + "val_exact_accuracy_step_1"];
      const double last = j[w + "val_exact_accuracy"];
      seen += std::to_string(j["step"].get<int>()) + " " + w + ": " +
          std::to_string(first) + " -> " + std::to_string(last) + "\n";
      if (last >= 0.2 && last >= 3 * first)
        ++gains;
      if (w.empty())
        final_exact = last;
    }
  }
  EXPECT_GE(gains, 2) << seen;
  // And it learns the task: the issue's prototype reached 38 % in 150 s.
  EXPECT_GE(final_exact, 0.3) << seen;
}

std::vector<std::string> small_run(
    const std::string& data,
    const std::string& run) {
  return quick_args(
      data,
      run,
      {"num_iterations=30",
       "save_every=2",
       "eval_every=0",
       "eval_size=20",
       "save_total_limit=0"});
}

TEST(TrmCli, SigkillThenResumeEndsWithTheSameWeightsAndCarry) {
  TempDir t;
  make_data(t.file("s4"), 300);
  auto ref = test::run_orchard(small_run(t.file("s4"), t.file("ref")), kEnv);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  pid_t pid = test::spawn_orchard(
      small_run(t.file("s4"), t.file("killed")), kEnv, t.file("k.log"));
  // Until it has saved step 12 (or ended, which fails below).
  bool mid_run = false;
  for (int status = 0; !mid_run && ::waitpid(pid, &status, WNOHANG) != pid;) {
    for (const auto& [step, dir] : runs::list_checkpoints(t.file("killed")))
      mid_run = mid_run || step >= 12;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  if (mid_run)
    test::wait_child(pid);
  ASSERT_TRUE(mid_run) << test::read_text(t.file("k.log"));
  // Killed before its end: the last checkpoint is still to come.
  ASSERT_LT(runs::list_checkpoints(t.file("killed")).back().first, 30)
      << "the run ended before it was killed";
  auto again =
      test::run_orchard(small_run(t.file("s4"), t.file("killed")), kEnv);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("Resuming from"), std::string::npos) << again.out;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto a = safetensors::load(
        t.file(std::string("ref/checkpoints/step_000030/") + file));
    const auto b = safetensors::load(
        t.file(std::string("killed/checkpoints/step_000030/") + file));
    ASSERT_EQ(a.size(), b.size()) << file;
    for (const auto& [name, v] : a)
      EXPECT_TRUE(torch::equal(v, b.at(name))) << file << ": " << name;
    if (std::string(file) == "model.safetensors") {
      EXPECT_TRUE(a.count("ema.lm_head.weight"));
      EXPECT_TRUE(a.count("H_init"));
    } else {
      EXPECT_TRUE(a.count("carry.z_H"));
    }
  }
}

TEST(TrmCli, BadInputGetsAMessageAndExit2) {
  TempDir t;
  make_data(t.file("s4"), 40);
  t.write("bad.csv", "source,question,answer,rating\nx,1.3.,1234,0\n");
  const std::vector<Refused> cases = {
      {{"data", "sudoku", "--size", "5", "--out", t.file("x")}, "--size 5"},
      {{"data", "sudoku", "--givens", "30-20", "--out", t.file("x")},
       "--givens 30-20"},
      // 4x4 Sudoku has 288 grids, so 288 puzzles with every cell given:
      // no silent shortfall.
      {{"data",
        "sudoku",
        "--size",
        "4",
        "--givens",
        "16-16",
        "--count",
        "1000",
        "--out",
        t.file("x")},
       "lower --count to 288"},
      {{"data", "sudoku", "--test-fraction", "1.5", "--out", t.file("x")},
       "--test-fraction"},
      {{"train", "stage=trm", "data=" + t.file("bad.csv")},
       t.file("bad.csv") + ":2:"},
      {{"train", "stage=trm", "data=" + t.file("missing")}, "does not exist"},
      {{"train",
        "--preset",
        "trm-sudoku-quick",
        "data=" + t.file("s4"),
        "device_batch_size=5"},
       "does not divide the 64 puzzles each process holds"},
      {{"train", "--preset", "trm-sudoku-quick", "arch.hidden_sise=8"},
       "arch.hidden_size"},
      {{"train",
        "--preset",
        "trm-sudoku-quick",
        "data=" + t.file("s4"),
        "arch.mlp_t=false",
        "arch.num_heads=3"},
       "not a multiple of arch.num_heads=3"},
  };
  expect_refused(cases);
  // A trained run, then bad puzzles and settings for solve and eval.
  auto run = train_quick(
      t.file("s4"), t.file("run"), {"num_iterations=2", "eval_size=4"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<Refused> after = {
      {{"solve", "--checkpoint", t.file("run"), "--puzzle", "1x"},
       "'x' is not a digit 1-4"},
      {{"solve", "--checkpoint", t.file("run"), "--puzzle", "11.............."},
       "breaks a rule: 1 twice in row 1"},
      {{"solve", "--checkpoint", t.file("run")}, "--puzzle"},
      {{"solve", "--checkpoint", t.file("nothing"), "--puzzle", "1..."},
       "does not exist"},
      {{"eval", "--checkpoint", t.file("run"), "games=3"},
       "is not a setting of a tiny recursive model"},
  };
  expect_refused(after);
}

// Mazes end to end on a tiny run: orchard data maze, training on them,
// orchard eval, orchard solve on a maze drawn row by row (its answer
// judged against the shortest path), and bad mazes refused. The trm-maze
// preset generates its 30x30 mazes and plans the paper's model.
TEST(TrmCli, MazesTrainSolveAndEvaluate) {
  TempDir t;
  auto d = test::run_orchard(
      {"data",
       "maze",
       "--size",
       "9",
       "--count",
       "60",
       "--augment",
       "3",
       "--out",
       t.file("m")},
      kEnv);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("54 train (216 rows"), std::string::npos) << d.out;
  auto r = train_quick(
      t.file("m"), t.file("run"), {"num_iterations=3", "eval_size=6"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("a held-out maze, shortest path"), std::string::npos)
      << r.out;
  auto e = test::run_orchard(
      {"eval", "--checkpoint", t.file("run"), "--device", "cpu", "--json"},
      kEnv);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const auto j = nlohmann::json::parse(e.out.substr(e.out.find('{')));
  EXPECT_EQ(j["puzzles"], 6);

  // The first held-out maze, drawn in 9 rows.
  std::ifstream test_csv(t.file("m/test.csv"));
  std::string header, line;
  std::getline(test_csv, header);
  std::getline(test_csv, line);
  const auto c1 = line.find(','), c2 = line.find(',', c1 + 1);
  const std::string maze = line.substr(c1 + 1, c2 - c1 - 1);
  const int steps = std::stoi(line.substr(line.rfind(',') + 1));
  std::string drawn;
  for (int row = 0; row < 9; ++row)
    drawn += maze.substr(size_t(row) * 9, 9) + "\n";
  t.write("drawn.txt", drawn);
  const auto a = solve_json(t.file("run"), "--input", t.file("drawn.txt"));
  EXPECT_EQ(a["puzzle"], maze);
  EXPECT_EQ(a["shortest_path"], steps);
  EXPECT_EQ(a["valid"].get<bool>(), a["problem"].get<std::string>().empty());

  // Bad mazes and settings.
  std::string two_starts = maze, walled = maze;
  two_starts[two_starts.find('.')] = 'S';
  const auto g = walled.find('G');
  for (int64_t n :
       {int64_t(g) - 9, int64_t(g) + 9, int64_t(g) - 1, int64_t(g) + 1})
    if (n >= 0 && n < 81 && std::abs(n % 9 - int64_t(g) % 9) <= 1 &&
        walled[size_t(n)] != 'S')
      walled[size_t(n)] = '#';
  expect_refused({
      {{"solve", "--checkpoint", t.file("run"), "--puzzle", two_starts},
       "2 S and 1 G"},
      {{"solve", "--checkpoint", t.file("run"), "--puzzle", walled},
       "no path leads from S to G"},
      {{"solve", "--checkpoint", t.file("run"), "--puzzle", maze + "#"},
       "82 cells where a maze of side 9 has 81"},
      {{"data", "maze", "--augment", "8", "--out", t.file("x")},
       "0 to 7 copies"},
      {{"data", "maze", "--size", "4", "--out", t.file("x")}, "--size 4"},
      {{"plan",
        "--preset",
        "trm-maze",
        "generate.size=4",
        "data_dir=" + t.file("home")},
       "generate.size=4: Orchard generates mazes of side 5 to 60"},
      {{"data",
        "maze",
        "--size",
        "9",
        "--min-path",
        "500",
        "--out",
        t.file("x")},
       "lower --min-path"},
  });
  auto plan = test::run_orchard(
      {"plan",
       "--preset",
       "trm-maze",
       "--assume-device",
       "cuda",
       "--memory-gb",
       "80",
       "data_dir=" + t.file("home")},
      kEnv);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("Generating 1000 30x30 mazes"), std::string::npos)
      << plan.out;
  EXPECT_NE(
      plan.out.find("attention, 2 layers x 512, H_cycles 3, L_cycles 4"),
      std::string::npos)
      << plan.out;
}

// The chat variant end to end: conversations tokenized by `orchard data
// chat` (a small BPE tokenizer trained on them), a causal TRM trained on
// them, and `orchard chat` answering from it, every token from a fresh
// carry and all supervision steps. 16 facts, each seen 8 times: the model
// must answer them back (measured: 16 of 16 after 700 steps, 80 s on one
// thread; after 500 steps 16 on the machine of 2026-11-24 but 13 on that of
// 2026-11-27, whose BLAS rounds differently). Then what it refuses.
TEST(TrmCli, TheChatVariantLearnsConversationsAndChats) {
  TempDir t;
  const std::vector<std::string> colours = {
      "red", "blue", "green", "yellow", "black", "white", "pink", "brown"};
  const std::vector<std::string> things = {
      "apple",
      "sky",
      "grass",
      "sun",
      "coal",
      "snow",
      "rose",
      "bread",
      "lemon",
      "cloud",
      "leaf",
      "milk",
      "ink",
      "sand",
      "lime",
      "plum"};
  std::string jsonl, text, questions;
  for (size_t i = 0; i < things.size(); ++i) {
    const std::string q = "What colour is the " + things[i] + "?";
    const std::string a =
        "The " + things[i] + " is " + colours[i % colours.size()] + ".";
    for (int k = 0; k < 8; ++k)
      jsonl += nlohmann::json{{"messages",
                               {{{"role", "user"}, {"content", q}},
                                {{"role", "assistant"}, {"content", a}}}}}
                   .dump() +
          "\n";
    text += q + " " + a + "\n";
    questions += (i ? "/clear\n" : "") + q + "\n";
  }
  t.write("c.jsonl", jsonl);
  t.write("text.txt", text);
  auto tok = test::run_orchard(
      {"tokenizer",
       "train",
       "--input",
       t.file("text.txt"),
       "--vocab-size",
       "300",
       "--out",
       t.file("tok")},
      kEnv);
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  auto d = test::run_orchard(
      {"data",
       "chat",
       "--input",
       t.file("c.jsonl"),
       "--tokenizer",
       t.file("tok"),
       "--out",
       t.file("d")},
      kEnv);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const std::vector<std::string> settings = {
      "train",
      "stage=trm",
      "--device",
      "cpu",
      "data=" + t.file("d/c.chat"),
      "tokenizer=" + t.file("tok"),
      "arch.hidden_size=64",
      "arch.num_heads=2",
      "arch.L_layers=2",
      "arch.H_cycles=2",
      "arch.L_cycles=2",
      "arch.halt_max_steps=2",
      "arch.puzzle_emb_ndim=0",
      "arch.expansion=2",
      "global_batch_size=32",
      "lr=2e-3",
      "lr_warmup_steps=20",
      "ema=true",
      "ema_rate=0.99",
      "eval_size=20"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = settings;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  auto r = test::run_orchard(
      with(
          {"num_iterations=700", "save_every=700", "run_dir=" + t.file("run")}),
      kEnv);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Chat: "), std::string::npos) << r.out;
  // The run's samples: greedy replies to held-out conversations.
  EXPECT_NE(r.out.find("  A: The "), std::string::npos) << r.out;

  auto c = test::run_orchard(
      {"chat",
       "--checkpoint",
       t.file("run"),
       "--device",
       "cpu",
       "--temperature",
       "0"},
      kEnv,
      "",
      questions);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  int right = 0;
  for (size_t i = 0; i < things.size(); ++i)
    right += c.out.find(
                 "The " + things[i] + " is " + colours[i % colours.size()] +
                 ".") != std::string::npos;
  std::printf("%d of %zu facts answered right\n", right, things.size());
  EXPECT_GE(right, 14) << c.out;
  auto g = test::run_orchard(
      {"generate",
       "--checkpoint",
       t.file("run"),
       "--device",
       "cpu",
       "--prompt",
       "What colour",
       "--max-new-tokens",
       "5"},
      kEnv);
  EXPECT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE((g.out + g.err).find("a tiny recursive model"), std::string::npos)
      << g.out << g.err;

  make_data(t.file("s4"), 40);
  ASSERT_EQ(
      train_quick(t.file("s4"), t.file("sudoku"), {"num_iterations=1"})
          .exit_code,
      0);
  expect_refused({
      {with({"arch.mlp_t=true", "run_dir=" + t.file("x")}), "causal"},
      {{"train", "stage=trm", "data=" + t.file("d/c.chat")},
       "give tokenizer=DIR"},
      {{"train",
        "--preset",
        "trm-sudoku-quick",
        "data=" + t.file("s4"),
        "tokenizer=" + t.file("tok")},
       "tokenizer= is for chat data"},
      {{"chat", "--checkpoint", t.file("sudoku"), "-p", "hi"},
       "trained on puzzles"},
      {{"serve", "--checkpoint", t.file("run"), "--port", "0"},
       "orchard serve batches requests"},
      {{"solve", "--checkpoint", t.file("run"), "--puzzle", "1..."},
       "trained on conversations"},
  });
}

// Seed 000's defaults: `orchard data chat` without --tokenizer uses GPT-2's
// (built in, as the fork's `--tokenizer gpt2`), and the trm-chat preset
// (the fork's cfg_chat, tokenizer=gpt2) trains and generates with nothing
// on disk but the data.
TEST(TrmCli, TheChatVariantTakesGpt2ByDefault) {
  test::TempDir t;
  std::string jsonl;
  for (int i = 0; i < 12; ++i)
    jsonl +=
        nlohmann::json{
            {"messages",
             {{{"role", "user"}, {"content", "Count to " + std::to_string(i)}},
              {{"role", "assistant"},
               {"content", std::to_string(i) + " done."}}}}}
            .dump() +
        "\n";
  t.write("c.jsonl", jsonl);
  auto d = test::run_orchard(
      {"data", "chat", "--input", t.file("c.jsonl"), "--out", t.file("d")},
      kEnv);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("template: plain"), std::string::npos) << d.out;
  auto r = test::run_orchard(
      {"train",
       "--preset",
       "trm-chat", // tokenizer: gpt2, the fork's cfg_chat (smaller here)
       "--device",
       "cpu",
       "data=" + t.file("d/c.chat"),
       "arch.hidden_size=16",
       "arch.num_heads=1",
       "arch.L_layers=1",
       "global_batch_size=4",
       "num_iterations=2",
       "eval_size=4",
       "run_dir=" + t.file("run")},
      kEnv);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // GPT-2's 50,257 tokens: the untrained loss is about ln 50257 = 10.8.
  const size_t at = r.out.find("| loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(at + 7)), std::log(50257.0), 0.5) << r.out;
  auto g = test::run_orchard(
      {"generate",
       "--checkpoint",
       t.file("run"),
       "--device",
       "cpu",
       "--prompt",
       "Count",
       "--max-new-tokens",
       "2"},
      kEnv);
  EXPECT_EQ(g.exit_code, 0) << g.out << g.err;
}

// The memory plan for the paper's model on simulated GPUs: the whole
// global batch where it fits, the largest divisor of it that fits where
// it does not, and a refusal with the fix where nothing does.
TEST(TrmCli, PlanPicksTheLargestMicroBatchThatFits) {
  TempDir t;
  make_data(t.file("d9"), 20, 9, "easy");
  auto plan = [&](const std::string& gb, bool json,
                  const std::string& device = "cuda") {
    std::vector<std::string> args = {
        "plan",
        "--preset",
        "trm-sudoku",
        "--assume-device",
        device,
        "--memory-gb",
        gb,
        "data=" + t.file("d9")};
    if (json)
      args.push_back("--json");
    return test::run_orchard(args, kEnv);
  };
  auto choice = [&](const std::string& gb,
                    const std::string& device = "cuda") {
    auto r = plan(gb, true, device);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out.substr(r.out.find('{')));
  };
  const auto big = choice("80");
  EXPECT_EQ(big["choice"]["batch"], 768);
  // bfloat16 autocast on a CUDA GPU (as upstream); float32 on a Mac's GPU
  // and the CPU, as every stage (docs/apple-silicon.md). float32 needs
  // more memory a puzzle, so a 64 GB Mac takes the 768 puzzles in smaller
  // micro-batches.
  EXPECT_EQ(big["precision"], "bfloat16 autocast, float32 weights");
  const auto mac = choice("64", "mps");
  EXPECT_EQ(mac["precision"], "float32");
  EXPECT_GT(mac["candidates"].back()["total_bytes"].get<double>(),
            big["candidates"].back()["total_bytes"].get<double>());
  EXPECT_LT(mac["choice"]["batch"].get<int64_t>(), 768);
  EXPECT_EQ(768 % mac["choice"]["batch"].get<int64_t>(), 0);
  EXPECT_EQ(choice("64", "cpu")["precision"], "float32");
  const auto small = choice("8");
  const int64_t b = small["choice"]["batch"];
  const double budget = small["budget_bytes"];
  EXPECT_LT(b, 768);
  EXPECT_EQ(768 % b, 0);
  EXPECT_LE(small["choice"]["total_bytes"].get<double>(), budget);
  for (const auto& c : small["candidates"]) // the next size up does not fit
    if (c["batch"].get<int64_t>() > b) {
      EXPECT_GT(c["total_bytes"].get<double>(), budget);
      break;
    }
  auto none = plan("0.5", false);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.out.find("(nothing fits)"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("lower global_batch_size"), std::string::npos);
}

} // namespace
} // namespace orchard
