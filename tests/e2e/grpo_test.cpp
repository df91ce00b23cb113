// `orchard train stage=grpo` from the command line, on the tiny Llama that
// transformers made (tests/fixtures/hf/llama): a LoRA run with a built-in
// reward and reward_cmd that writes a PEFT adapter and GRPO's metrics, and
// resumes after SIGKILL (mid-generation-buffer) to the same adapter as an
// uninterrupted run; bad settings and a dying reward process; the guide's
// config planned for a 16 GB Mac.
#include "core/safetensors.h"
#include "runs/checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <csignal>
#include <sstream>
#include <sys/wait.h>
#include <thread>

namespace orchard {
namespace {

using test::run_orchard;
using test::TempDir;

using test::kLlama;

using test::contains;

std::string write_sums(const TempDir& dir) {
  return dir.write("sums.jsonl", test::sums_jsonl());
}

// A reward process: 1 for completions shorter than 20 characters.
const char* kShortCmd =
    "while read -r line; do "
    "c=$(printf '%s' \"$line\" | sed 's/.*\"completion\":\"\\([^\"]*\\)\".*/\\1/'); "
    "if [ ${#c} -lt 20 ]; then echo '{\"short\": 1}'; else echo '{\"short\": 0}'; fi; done";

std::vector<std::string> grpo_args(const TempDir& dir, const std::string& run) {
  return {"train",
          "stage=grpo",
          "model=" + kLlama,
          "env=answers",
          "data=" + dir.file("sums.jsonl"),
          std::string("reward_cmd=") + kShortCmd,
          "num_generations=4",
          "per_device_train_batch_size=4",
          "gradient_accumulation_steps=2",
          "steps_per_generation=4", // a generation feeds two steps
          "max_completion_length=10",
          "min_p=0.02",             // the sampler's filters, through resume
          "repetition_penalty=1.2",
          "max_steps=6",
          "save_steps=1",
          "save_total_limit=0",
          "eval_steps=0",
          "eval_prompts=2",
          "learning_rate=5e-3",
          "lora.r=4",
          "lora.alpha=8",
          "run_dir=" + dir.file(run),
          "--device",
          "cpu"};
}

std::map<std::string, torch::Tensor> adapter_of(const TempDir& dir, const std::string& run) {
  return safetensors::load(dir.file(run + "/adapter/adapter_model.safetensors"));
}

bool wait_for_checkpoint(const std::string& run_dir, int64_t step, pid_t pid) {
  for (int i = 0; i < 12000; ++i) {
    for (const auto& [s, d] : runs::list_checkpoints(run_dir))
      if (s >= step)
        return true;
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(GrpoCli, LoraRunWritesAnAdapterAndResumesExactlyAfterSigkill) {
  TempDir dir;
  write_sums(dir);
  const std::map<std::string, std::string> env = {
      {"ORCHARD_HOME", dir.file("home")}, {"OMP_NUM_THREADS", "1"}};
  auto ref = run_orchard(grpo_args(dir, "reference"), env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_TRUE(contains(ref.out, "Rollouts: 4 prompts x 4 completions")) << ref.out;
  EXPECT_TRUE(contains(ref.out, "reward ")) << ref.out;
  EXPECT_TRUE(contains(ref.out, "Adapter (PEFT format)")) << ref.out;
  // Every step's line in metrics.jsonl has GRPO's figures, per function.
  std::istringstream lines(test::read_text(dir.file("reference/metrics.jsonl")));
  int steps = 0;
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("loss"))
      continue;
    ++steps;
    for (const char* k :
         {"reward", "reward_std", "frac_reward_zero_std", "rewards/exact_answer/mean",
          "rewards/format/mean", "rewards/short/mean", "completions/mean_length",
          "completions/clipped_ratio", "rollout_tokens_per_s", "clip_ratio/region_mean"})
      EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
    const double len = j["completions/mean_length"];
    EXPECT_GT(len, 0);
    EXPECT_LE(len, 10);
  }
  EXPECT_EQ(steps, 6);
  auto want = adapter_of(dir, "reference");
  ASSERT_FALSE(want.empty());
  // Killed after step 3: half of the second generation's completions are
  // still to train on, and come back from the checkpoint.
  pid_t pid = test::spawn_orchard(grpo_args(dir, "killed"), env, dir.file("killed.log"));
  const bool mid_run = wait_for_checkpoint(dir.file("killed"), 3, pid);
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  EXPECT_TRUE(mid_run) << test::read_text(dir.file("killed.log"));
  auto again = run_orchard(grpo_args(dir, "killed"), env);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_TRUE(contains(again.out, "Resuming from")) << again.out;
  auto got = adapter_of(dir, "killed");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, t] : want)
    EXPECT_TRUE(torch::equal(t, got.at(k))) << k << " differs after the resume";
}

// Out of memory in a GRPO step (injected: a micro-step of more than 2 rows
// fails after taking its rows): the micro-batch is halved and the step
// redone from the same rollouts, and the adapter equals a run made with 2
// rows and twice the accumulation from the start (the same 16 completions
// per generation).
TEST(GrpoCli, OutOfMemoryHalvesTheMicroBatchAndKeepsTheRollouts) {
  TempDir dir;
  write_sums(dir);
  auto args = [&](const std::string& run) {
    auto a = grpo_args(dir, run);
    for (auto& x : a)
      if (x.rfind("max_steps=", 0) == 0)
        x = "max_steps=3";
    return a;
  };
  auto r = run_orchard(
      args("oom"), {{"ORCHARD_HOME", dir.file("home")}, {"ORCHARD_TEST_OOM_ROWS", "2"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(
      r.out,
      "Out of memory at step 1 with device_batch_size=4: halved to 2, "
      "gradient accumulation now 4"))
      << r.out;
  auto small = args("small");
  for (auto& x : small) {
    if (x.rfind("per_device_train_batch_size=", 0) == 0)
      x = "per_device_train_batch_size=2";
    if (x.rfind("gradient_accumulation_steps=", 0) == 0)
      x = "gradient_accumulation_steps=4";
    if (x.rfind("steps_per_generation=", 0) == 0)
      x = "steps_per_generation=8";
  }
  r = run_orchard(small, {{"ORCHARD_HOME", dir.file("home")}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Rollouts: 4 prompts x 4 completions")) << r.out;
  auto got = adapter_of(dir, "oom"), want = adapter_of(dir, "small");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, t] : want)
    EXPECT_TRUE(torch::allclose(got.at(k), t, 1e-4, 1e-6))
        << k << " max diff " << (got.at(k) - t).abs().max().item<double>();
}

// weights_dtype and optim left at auto resume in the precision a run began
// with (its config.yaml), not in what auto picks on this machine: a full
// fine-tune begun with bfloat16 weights and 8-bit moments resumes so on the
// CPU, where auto picks float32 and the 8-bit state would be refused.
TEST(GrpoCli, AResumedRunKeepsThePrecisionItBeganWith) {
  TempDir dir;
  write_sums(dir);
  auto args = [&](const std::string& run, int steps, bool set) {
    std::vector<std::string> a;
    for (const auto& x : grpo_args(dir, run))
      if (x.rfind("lora.", 0) != 0 && x.rfind("max_steps=", 0) != 0)
        a.push_back(x);
    a.insert(a.begin() + 2, "finetune=full");
    a.insert(a.begin() + 2, "max_steps=" + std::to_string(steps));
    if (set) {
      a.insert(a.begin() + 2, "weights_dtype=bfloat16");
      a.insert(a.begin() + 2, "optim=adamw_8bit");
    }
    return a;
  };
  const std::map<std::string, std::string> env = {
      {"ORCHARD_HOME", dir.file("home")}};
  auto r = run_orchard(args("run", 2, true), env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Loading the policy (full, bfloat16 weights"))
      << r.out;
  // Asked for float32 and AdamW by name, the resume is refused (and its
  // config.yaml is rewritten: the checkpoint is what the next one reads).
  auto asked = args("run", 3, false);
  asked.insert(asked.begin() + 2, "weights_dtype=float32");
  asked.insert(asked.begin() + 2, "optim=adamw_torch");
  r = run_orchard(asked, env);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "is 8-bit (optim=adamw_8bit)")) << r.err;
  r = run_orchard(args("run", 3, false), env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(
      r.out,
      "Weights and optimizer: as the run in " + dir.file("run") +
          " began (weights_dtype=bfloat16 optim=adamw_8bit)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "Loading the policy (full, bfloat16 weights"))
      << r.out;
  ASSERT_FALSE(runs::list_checkpoints(dir.file("run")).empty());
  EXPECT_EQ(runs::list_checkpoints(dir.file("run")).back().first, 3);
  // A new run on the CPU: auto's float32.
  r = run_orchard(args("fresh", 1, false), env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(
      r.out, "Weights and optimizer: auto: float32 weights and moments"))
      << r.out;
}

TEST(GrpoCli, BadSettingsAndADyingRewardProcessSayWhatAndKeepCheckpoints) {
  TempDir dir;
  write_sums(dir);
  const std::map<std::string, std::string> env = {{"ORCHARD_HOME", dir.file("home")}};
  auto with = [&](std::vector<std::string> extra) {
    auto args = grpo_args(dir, "bad");
    for (auto& e : extra)
      args.push_back(e);
    return run_orchard(args, env);
  };
  auto r = with({"generation_batch_size=6", "steps_per_generation=auto"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "not a multiple of num_generations=4")) << r.err;
  EXPECT_TRUE(contains(r.err, "4 or 8")) << r.err;
  r = with({"min_p=1.5"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "min_p")) << r.err;
  r = with({"weights_dtype=bfloat16"}); // LoRA: the base's dtype is dtype=
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "weights_dtype=bfloat16 sets how full fine-tuning holds"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "finetune=full")) << r.err;
  // An Orchard GPT trains float32 weights; refused before anything is read.
  r = run_orchard({"train", "stage=grpo", "checkpoint=" + dir.file("no-such-run"),
                   "weights_dtype=bfloat16", "env=wordnet", "--device", "cpu"},
                  env);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "weights_dtype=bfloat16 is for Hugging Face models"))
      << r.err;
  r = with({"repetition_penalty=0"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "repetition_penalty")) << r.err;
  r = with({"env=prompts", "reward_cmd="});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "reward_cmd")) << r.err;
  r = with({"checkpoint=" + dir.file("run")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "model=DIR or checkpoint=RUN, not both")) << r.err;
  r = with({"data=[" + dir.file("sums.jsonl") + "," + dir.file("sums.jsonl") + "]"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "reads one data file")) << r.err;
  r = with({"data=" + dir.file("missing.jsonl"), "run_dir=" + dir.file("nodata")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "cannot read data file")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("nodata"))); // no empty run folder left
  r = with({"num_generation=4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "num_generations")) << r.err;
  r = with({"reward_weights=[1,2]"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "reward_weights has 2 numbers but there are 3")) << r.err;
  // The reward process dies in the second generation (after the 8 answers
  // of the evaluation before training and the first generation's 16): the
  // run stops with a message and the checkpoints of steps 1 and 2 stay.
  r = with(
      {"reward_cmd=n=0; while read -r l; do n=$((n+1)); [ $n -gt 24 ] && exit 3; "
       "echo '{\"a\": 1}'; done",
       "run_dir=" + dir.file("dies")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "exited after answering 0 of 16")) << r.err;
  EXPECT_TRUE(contains(r.err, "status 3")) << r.err;
  const auto ckpts = runs::list_checkpoints(dir.file("dies"));
  ASSERT_FALSE(ckpts.empty());
  EXPECT_EQ(ckpts.back().first, 2);
}

TEST(GrpoCli, TheGuidesWordleRunFitsA16GbMacByThePlannersAccount) {
  // Only config.json is read: Qwen2.5-3B's.
  TempDir tmp;
  tmp.write(
      "q3b/config.json",
      nlohmann::json{{"architectures", {"Qwen2ForCausalLM"}},
                     {"model_type", "qwen2"},
                     {"vocab_size", 151936},
                     {"hidden_size", 2048},
                     {"intermediate_size", 11008},
                     {"num_hidden_layers", 36},
                     {"num_attention_heads", 16},
                     {"num_key_value_heads", 2},
                     {"max_position_embeddings", 32768},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 1000000.0},
                     {"tie_word_embeddings", true},
                     {"torch_dtype", "bfloat16"}}
          .dump());
  auto plan = [&](const std::string& gb) {
    return run_orchard(
        {"plan", "--preset", "grpo-wordle-qwen-3b", "model=" + tmp.file("q3b"),
         "--assume-device", "mps", "--memory-gb", gb, "--json"});
  };
  auto r = plan("16");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["stage"], "grpo");
  EXPECT_EQ(j["generation_batch"], 2);
  EXPECT_EQ(j["choice"]["batch"], 1);
  EXPECT_TRUE(j["choice"]["fits"].get<bool>());
  // The bf16 weights (6.2 GB) and the rollouts' cache are counted.
  EXPECT_GT(j["choice"]["total_bytes"].get<double>(), 6.1e9);
  EXPECT_GT(j["candidates"][0]["kv_cache_bytes"].get<double>(), 0);
  r = plan("8");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
}

// A full fine-tune of a bfloat16 checkpoint on a GPU defaults to bfloat16
// weights and 8-bit moments (weights_dtype=auto optim=auto); the plan counts
// them, and says float32 where auto picks it: a Mac, LoRA, a float32
// checkpoint. What is set stays as set.
TEST(GrpoCli, AutoPrecisionHoldsABfloat16CheckpointInBfloat16OnAGpu) {
  TempDir tmp;
  auto config = [&](const std::string& dir, const std::string& dtype) {
    tmp.write(
        dir + "/config.json",
        nlohmann::json{
            {"architectures", {"Qwen2ForCausalLM"}},
            {"model_type", "qwen2"},
            {"vocab_size", 151936},
            {"hidden_size", 896},
            {"intermediate_size", 4864},
            {"num_hidden_layers", 24},
            {"num_attention_heads", 14},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", 32768},
            {"tie_word_embeddings", true},
            {"torch_dtype", dtype}}
            .dump());
    return tmp.file(dir);
  };
  const std::string bf16 = config("q05", "bfloat16");
  const std::string fp32 = config("q05f", "float32");
  auto plan = [&](const std::string& model,
                  const std::string& device,
                  std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "plan",
        "stage=grpo",
        "model=" + model,
        "env=wordle",
        "max_completion_length=128",
        "per_device_train_batch_size=8",
        "--assume-device",
        device,
        "--memory-gb",
        "80",
        "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_orchard(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return nlohmann::json::parse(r.out.substr(r.out.find('{')));
  };
  auto precision = [](const nlohmann::json& j) {
    return j["weights_dtype"].get<std::string>() + " " +
        j["optim"].get<std::string>();
  };
  const auto gpu = plan(bf16, "cuda", {"finetune=full"});
  EXPECT_EQ(precision(gpu), "bfloat16 adamw_8bit");
  EXPECT_EQ(
      precision(plan(bf16, "mps", {"finetune=full"})), "float32 adamw_torch");
  EXPECT_EQ(
      precision(plan(bf16, "cpu", {"finetune=full"})), "float32 adamw_torch");
  EXPECT_EQ(
      precision(plan(fp32, "cuda", {"finetune=full"})), "float32 adamw_torch");
  EXPECT_EQ(
      precision(plan(bf16, "cuda", {"finetune=lora"})), "float32 adamw_torch");
  EXPECT_EQ(
      precision(plan(bf16, "cuda", {"finetune=full", "optim=adamw_torch"})),
      "bfloat16 adamw_torch");
  // optim=auto follows the weights: 8-bit moments for bfloat16 ones.
  EXPECT_EQ(
      precision(plan(bf16, "mps", {"finetune=full", "weights_dtype=bfloat16"})),
      "bfloat16 adamw_8bit");
  const auto set = plan(
      bf16,
      "cuda",
      {"finetune=full", "weights_dtype=float32", "optim=adamw_torch"});
  EXPECT_EQ(precision(set), "float32 adamw_torch");
  // 494M trained weights: float32 weights, gradients and moments take 16
  // bytes each, bfloat16 weights and gradients with 8-bit moments about 6.
  const double saved = set["choice"]["total_bytes"].get<double>() -
      gpu["choice"]["total_bytes"].get<double>();
  EXPECT_GT(saved, 0.494e9 * 9.5);
  EXPECT_LT(saved, 0.494e9 * 10.5);
}

} // namespace
} // namespace orchard

namespace orchard {
namespace {

// `orchard data wordle` writes turns whose feedback columns are the game's
// (recomputed here from secret and guesses), with the prompt in the guide's
// notation; `orchard eval` refuses what it cannot play.
TEST(GrpoCli, DataWordleWritesTurnsWithTheirFeedback) {
  TempDir dir;
  const std::string words = dir.write(
      "w.txt", "crane\ncrate\ntrace\nslate\nabbey\nbabes\nspeed\neerie\nplate\n"
               "grate\nirate\nbrave\nstare\nshale\nwhale\nquake\nflame\nframe\n");
  auto r = run_orchard(
      {"data", "wordle", "--count", "12", "--seed", "3", "--words", words, "--out",
       dir.file("turns.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::istringstream in(test::read_text(dir.file("turns.jsonl")));
  int n = 0, with_guesses = 0;
  for (std::string line; std::getline(in, line); ++n) {
    auto j = nlohmann::json::parse(line);
    const std::string secret = j["secret"];
    ASSERT_EQ(j["guesses"].size(), j["feedback"].size());
    std::string user = j["prompt"][1]["content"];
    for (size_t i = 0; i < j["guesses"].size(); ++i) {
      const std::string g = j["guesses"][i], f = j["feedback"][i];
      ASSERT_EQ(f.size(), 5u);
      for (size_t k = 0; k < 5; ++k) {
        // Green exactly where the letters agree; absent letters are absent.
        EXPECT_EQ(f[k] == 'G', g[k] == secret[k]) << g << " vs " << secret;
        if (f[k] == '-')
          EXPECT_TRUE(g[k] != secret[k]);
      }
      std::string upper(1, char(std::toupper(g[0])));
      EXPECT_NE(user.find(upper + "("), std::string::npos) << user;
      ++with_guesses;
    }
  }
  EXPECT_EQ(n, 12);
  EXPECT_GT(with_guesses, 0);
  r = run_orchard({"data", "wordle", "--count", "3", "--words", dir.file("missing"),
                   "--out", dir.file("x.jsonl")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot read the word list"), std::string::npos) << r.err;
  r = run_orchard({"eval", "env=chess", "--model", kLlama});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("env=wordle"), std::string::npos) << r.err;
  // Whole games from the command line: the tiny random model (its positions
  // raised so the rules fit) never answers a word in <guess>, so every
  // turn of both games is lost and none is solved (the default word
  // list, wamerican's).
  namespace fs = std::filesystem;
  fs::create_directories(dir.file("model"));
  for (const auto& e : fs::directory_iterator(kLlama))
    fs::copy(e.path(), fs::path(dir.file("model")) / e.path().filename());
  auto cfg = nlohmann::json::parse(test::read_text(dir.file("model/config.json")));
  cfg["max_position_embeddings"] = 4096;
  dir.write("model/config.json", cfg.dump());
  r = run_orchard({"eval", "env=wordle", "games=2", "--model", dir.file("model"), "--max-new-tokens", "4",
                   "--device", "cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("game 2/2: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not solved in 0 guess(es)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Wordle: solved 0 of 2 games (0.0 %), mean guesses when "
                       "solved -, 12 turn(s) lost"),
            std::string::npos)
      << r.out;
  r = run_orchard({"eval", "env=wordle", "games=0", "--model", dir.file("model")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("play at least one game"), std::string::npos) << r.err;
}

} // namespace
} // namespace orchard
