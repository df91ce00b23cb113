// `orchard train stage=lora|full`, `orchard lora merge` and `--model/--adapter`
// from the command line, on the tiny Llama that transformers made
// (tests/fixtures/hf/llama, with its byte-level BPE and Llama 3 template).
#include "core/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <tuple>

namespace orchard {
namespace {

namespace fs = std::filesystem;
using test::run_orchard;
using test::TempDir;

using test::kLlama;

using test::contains;

std::string write_chats(const TempDir& dir) {
  const std::vector<std::pair<std::string, std::string>> words = {
      {"river", "a large natural stream of water"},
      {"mountain", "a land mass that projects well above its surroundings"},
      {"fox", "a small wild dog"},
      {"noun", "a word that names a thing"}};
  std::string text;
  for (int i = 0; i < 40; ++i) {
    const auto& [w, d] = words[size_t(i) % words.size()];
    text +=
        nlohmann::json{
            {"messages",
             {{{"role", "user"}, {"content", "what is a " + w + "?"}},
              {{"role", "assistant"}, {"content", d + "."}}}}}
            .dump() +
        "\n";
  }
  return dir.write("chat.jsonl", text);
}

std::vector<std::string> lora_args(const std::string& data, int steps) {
  return {
      "train",
      "stage=lora",
      "model=" + kLlama,
      "data=" + data,
      "max_steps=" + std::to_string(steps),
      "max_seq_length=64",
      "per_device_train_batch_size=4",
      "gradient_accumulation_steps=2",
      "lora.r=4",
      "lora.alpha=8",
      "learning_rate=5e-3",
      "warmdown_ratio=0",
      "save_steps=2",
      "eval_steps=3",
      "--device",
      "cpu"};
}

// lora_args for stage=full: no lora.* keys.
std::vector<std::string> full_args(const std::string& data, int steps) {
  auto args = lora_args(data, steps);
  args[1] = "stage=full";
  std::erase_if(
      args, [](const std::string& a) { return a.rfind("lora.", 0) == 0; });
  return args;
}

std::map<std::string, torch::Tensor> adapter_of(const std::string& dir) {
  return safetensors::load(dir + "/adapter_model.safetensors");
}

// `args` with the key of each "key=value" in `set` given that value.
std::vector<std::string> with(
    std::vector<std::string> args,
    const std::vector<std::string>& set) {
  for (const auto& kv : set) {
    const std::string key = kv.substr(0, kv.find('=') + 1);
    for (auto& a : args)
      if (a.rfind(key, 0) == 0)
        a = kv;
  }
  return args;
}

// One reply from `orchard chat -p` on the CPU.
test::CliResult chat_once(
    const std::string& model,
    const std::string& adapter,
    const std::string& prompt,
    int max_new_tokens,
    const std::map<std::string, std::string>& env) {
  return run_orchard(
      {"chat",
       "--model",
       model,
       "--adapter",
       adapter,
       "-p",
       prompt,
       "--max-new-tokens",
       std::to_string(max_new_tokens),
       "--device",
       "cpu"},
      env);
}

TEST(Finetune, LoraTrainsResumesExactlyAndWritesAPeftAdapter) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  const std::map<std::string, std::string> env = {
      {"ORCHARD_HOME", tmp.file("home")}};
  fs::create_directories(tmp.file("a"));
  fs::create_directories(tmp.file("b"));
  // Straight through: 6 steps.
  auto r = run_orchard(lora_args(data, 6), env, tmp.file("a"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Parameters: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Adapter (PEFT format)"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("Samples: answers to held-out questions"), std::string::npos)
      << r.out;
  const std::string report =
      test::read_text(tmp.file("a/runs/lora/llama/report.md"));
  EXPECT_NE(report.find("| Stage | lora"), std::string::npos) << report;
  EXPECT_NE(report.find("Peak memory"), std::string::npos) << report;
  const std::string a = tmp.file("a/runs/lora/llama/adapter");
  ASSERT_TRUE(fs::exists(a + "/adapter_config.json"));
  std::ifstream in(a + "/adapter_config.json");
  auto cfg = nlohmann::json::parse(in);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8.0);
  auto straight = adapter_of(a);
  EXPECT_EQ(straight.size(), 2u * 7 * 2); // A and B, 7 projections, 2 layers
  EXPECT_TRUE(straight.count(
      "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  // B starts at zero; training moved it.
  EXPECT_GT(
      straight["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
          .abs()
          .sum()
          .item<double>(),
      0.0);
  // In two runs: 3 steps, then the same command asked for 6 resumes.
  r = run_orchard(lora_args(data, 3), env, tmp.file("b"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_orchard(lora_args(data, 6), env, tmp.file("b"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Resuming from"), std::string::npos) << r.out;
  auto resumed = adapter_of(tmp.file("b/runs/lora/llama/adapter"));
  ASSERT_EQ(resumed.size(), straight.size());
  for (const auto& [k, t] : straight)
    EXPECT_TRUE(torch::equal(t, resumed[k])) << k;
  // Checkpoints hold the adapters only, not the frozen base.
  auto ckpt = safetensors::load(
      tmp.file("b/runs/lora/llama/checkpoints/step_000006/model.safetensors"));
  for (const auto& [k, t] : ckpt)
    EXPECT_NE(k.find(".lora_"), std::string::npos) << k;

  // The adapter in use: greedy text from base + adapter equals the merged
  // model's, and differs from the base alone.
  auto greedy = [&](std::vector<std::string> model) {
    std::vector<std::string> args = {
        "generate",
        "--prompt",
        "what is a river",
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        "--device",
        "cpu"};
    args.insert(args.end(), model.begin(), model.end());
    auto g = run_orchard(args, env, tmp.path().string());
    EXPECT_EQ(g.exit_code, 0) << g.out << g.err;
    const std::string text = g.out.substr(g.out.find("what is a river"));
    return text.substr(0, text.find("\n[")); // without the speed line
  };
  const std::string with_adapter = greedy({"--model", kLlama, "--adapter", a});
  r = run_orchard(
      {"lora",
       "merge",
       "--model",
       kLlama,
       "--adapter",
       tmp.file("a/runs/lora/llama"),
       "--out",
       tmp.file("merged")},
      env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("merged/tokenizer.json")));
  EXPECT_EQ(greedy({"--model", tmp.file("merged")}), with_adapter);
  // Merging into a folder that has files needs --force.
  r = run_orchard(
      {"lora",
       "merge",
       "--model",
       kLlama,
       "--adapter",
       a,
       "--out",
       tmp.file("merged")},
      env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  // Chat through the adapter, once.
  r = chat_once(kLlama, a, "what is a fox?", 4, env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("+ adapter"), std::string::npos)
      << r.err; // -p: on stderr
}

// Mistral with a SentencePiece-style tokenizer.json and sliding_window 8
// (tests/fixtures/hf/mistral_sp): conversations of about 30 tokens run past
// the window in training, and generation past it goes through the cache.
TEST(Finetune, MistralWithASentencePieceTokenizerLearnsPastItsWindow) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  const std::string model = std::string(ORCHARD_FIXTURES) + "/hf/mistral_sp";
  const std::map<std::string, std::string> env = {
      {"ORCHARD_HOME", tmp.file("home")}};
  auto r = run_orchard(
      with(lora_args(data, 16), {"model=" + model, "learning_rate=2e-2"}),
      env,
      tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<double> loss;
  std::ifstream metrics(tmp.file("runs/lora/mistral_sp/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss"))
      loss.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(loss.size(), 16u);
  // A 64-wide random model learns slowly: about 0.6 nats in 16 steps.
  EXPECT_LT((loss[13] + loss[14] + loss[15]) / 3, loss[0] - 0.4)
      << "first " << loss[0] << ", last " << loss[15];
  const std::string adapter = tmp.file("runs/lora/mistral_sp/adapter");
  r = run_orchard(
      {"generate",
       "--model",
       model,
       "--adapter",
       adapter,
       "--prompt",
       "what is a river",
       "--temperature",
       "0",
       "--max-new-tokens",
       "16",
       "--device",
       "cpu"},
      env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("what is a river"), std::string::npos) << r.out;
  r = chat_once(model, adapter, "what is a fox?", 12, env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// Out of memory while fine-tuning (injected with ORCHARD_TEST_OOM_ROWS: a
// micro-step of more than 2 rows fails after taking its data): the micro-
// batch is halved, the step redone, and the adapter equals a run made with
// 2 rows and twice the accumulation from the start.
TEST(Finetune, OutOfMemoryHalvesTheMicroBatchAndLosesNothing) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  fs::create_directories(tmp.file("a"));
  fs::create_directories(tmp.file("b"));
  auto r = run_orchard(
      lora_args(data, 4),
      {{"ORCHARD_HOME", tmp.file("home")}, {"ORCHARD_TEST_OOM_ROWS", "2"}},
      tmp.file("a"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(
      r.out.find("Out of memory at step 1 with device_batch_size=4: halved "
                 "to 2, gradient accumulation now 4"),
      std::string::npos)
      << r.out;
  r = run_orchard(
      with(
          lora_args(data, 4),
          {"per_device_train_batch_size=2", "gradient_accumulation_steps=4"}),
      {{"ORCHARD_HOME", tmp.file("home")}},
      tmp.file("b"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto halved = adapter_of(tmp.file("a/runs/lora/llama/adapter"));
  auto small = adapter_of(tmp.file("b/runs/lora/llama/adapter"));
  ASSERT_EQ(halved.size(), small.size());
  for (const auto& [k, t] : small)
    EXPECT_TRUE(torch::allclose(halved[k], t, 1e-5, 1e-7)) << k;
}

TEST(Finetune, LoraOnAFourBitBaseTrainsAndWritesAnAdapter) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  auto args = lora_args(data, 4);
  args.push_back("load_in_4bit=true");
  auto r = run_orchard(
      args, {{"ORCHARD_HOME", tmp.file("home")}}, tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("4-bit NF4"), std::string::npos) << r.out;
  auto adapter = adapter_of(tmp.file("runs/lora/llama/adapter"));
  EXPECT_EQ(adapter.size(), size_t(2 * 7 * 2)); // 2 layers, 7 projections
  // Trained: some B is no longer zero.
  double moved = 0;
  for (const auto& [k, t] : adapter)
    if (k.find("lora_B") != std::string::npos)
      moved += t.abs().sum().item<double>();
  EXPECT_GT(moved, 0);
}

TEST(Finetune, FullFineTuningWritesAModelFolder) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  auto args = full_args(data, 2);
  auto r = run_orchard(
      args, {{"ORCHARD_HOME", tmp.file("home")}}, tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string out = tmp.file("runs/full/llama/model");
  ASSERT_TRUE(fs::exists(out + "/model.safetensors"));
  auto w = safetensors::load(out);
  auto base = safetensors::load(kLlama + "/model.safetensors");
  EXPECT_FALSE(torch::equal(
      w["model.layers.0.mlp.up_proj.weight"],
      base["model.layers.0.mlp.up_proj.weight"]));
  r = run_orchard(
      {"generate",
       "--model",
       out,
       "--prompt",
       "hi",
       "--max-new-tokens",
       "3",
       "--device",
       "cpu"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// Full fine-tuning in bfloat16 weights with 8-bit moments: trains, writes
// bfloat16 weights that moved, checkpoints the 8-bit state, and a resume
// asking for the other optimizer is refused with what to do.
TEST(Finetune, Bfloat16WeightsAndEightBitMomentsTrainAndResumeOnlyAsMade) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  auto args = full_args(data, 4);
  args.push_back("weights_dtype=bfloat16");
  args.push_back("optim=adamw_8bit");
  auto r = run_orchard(
      args, {{"ORCHARD_HOME", tmp.file("home")}}, tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(
      r.out.find("bfloat16 weights (stochastic rounding)"), std::string::npos)
      << r.out;
  auto w = safetensors::load(tmp.file("runs/full/llama/model"));
  auto base = safetensors::load(kLlama + "/model.safetensors");
  const std::string key = "model.layers.0.mlp.up_proj.weight";
  EXPECT_EQ(w[key].scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(
      torch::equal(w[key].to(torch::kFloat32), base[key].to(torch::kFloat32)));
  // The checkpoint holds 8-bit codes, not float32 moments.
  bool codes = false, moments = false;
  for (const auto& e : fs::recursive_directory_iterator(
           tmp.file("runs/full/llama/checkpoints")))
    if (e.path().extension() == ".safetensors")
      for (const auto& [k, t] : safetensors::load(e.path().string())) {
        codes = codes || k.ends_with(".exp_avg.q8");
        moments = moments || k.ends_with(".exp_avg");
      }
  EXPECT_TRUE(codes);
  EXPECT_FALSE(moments);
  auto more = with(args, {"max_steps=6", "optim=adamw_torch"});
  r = run_orchard(
      more, {{"ORCHARD_HOME", tmp.file("home")}}, tmp.path().string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(
      r.err.find("resume with the optimizer it was made with"),
      std::string::npos)
      << r.err;
}

// Llama 3.2 3B's config.json (transformers' values) in <dir>/l3b: the
// planner reads only this.
void write_llama_3b_config(const TempDir& dir) {
  dir.write(
      "l3b/config.json",
      nlohmann::json{
          {"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 128256},
          {"hidden_size", 3072},
          {"intermediate_size", 8192},
          {"num_hidden_layers", 28},
          {"num_attention_heads", 24},
          {"num_key_value_heads", 8},
          {"head_dim", 128},
          {"max_position_embeddings", 131072},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 32.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}}},
          {"tie_word_embeddings", true},
          {"torch_dtype", "bfloat16"}}
          .dump());
}

TEST(Finetune, TheLlama32ConfigFitsA16GbMacByThePlannersAccount) {
  // Only config.json is read: Llama 3.2 3B's (transformers' values).
  TempDir tmp;
  write_llama_3b_config(tmp);
  auto plan = [&](const std::string& gb, std::string extra = "dtype=auto") {
    return run_orchard(
        {"plan",
         "--preset",
         "lora-llama-3.2-3b",
         "model=" + tmp.file("l3b"),
         extra,
         "--assume-device",
         "mps",
         "--memory-gb",
         gb,
         "--json"});
  };
  auto r = plan("16");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["base_dtype"], "bfloat16");
  EXPECT_EQ(j["choice"]["batch"], 1);
  EXPECT_TRUE(j["choice"]["fits"].get<bool>());
  // The estimate holds the bf16 weights (6.4 GB) and stays under the budget.
  const double total = j["choice"]["total_bytes"];
  EXPECT_GT(total, 6.4e9);
  EXPECT_LE(total, j["budget_bytes"].get<double>());
  // On an 8 GB Mac it does not fit: exit 1 and say so.
  r = plan("8");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // With the projections in 4 bits it does, at about a third of the bf16
  // estimate (the 0.79 GB embedding stays in bf16).
  r = plan("8", "load_in_4bit=true");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j4 = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_TRUE(j4["load_in_4bit"].get<bool>());
  EXPECT_TRUE(j4["choice"]["fits"].get<bool>());
  EXPECT_LT(j4["choice"]["total_bytes"].get<double>(), 0.5 * total);
  EXPECT_GT(j4["choice"]["total_bytes"].get<double>(), 2.2e9);
  // auto batch on 32 GB picks more rows, monotone in memory.
  r = run_orchard(
      {"plan",
       "stage=lora",
       "model=" + tmp.file("l3b"),
       "--assume-device",
       "mps",
       "--memory-gb",
       "32",
       "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_GT(j["choice"]["batch"].get<int>(), 1);
}

// The effective batch is the recipe: with device_batch_size=auto a 16 GB
// Mac and an 80 GB GPU train the same rows per step, each splitting them
// into the micro-batch it fits times accumulation.
TEST(Finetune, TheEffectiveBatchIsTheSameOnEveryMachine) {
  TempDir tmp;
  write_llama_3b_config(tmp);
  auto plan = [&](const std::string& device,
                  const std::string& gb,
                  std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "plan",
        "stage=lora",
        "model=" + tmp.file("l3b"),
        "bf16=true",
        "max_seq_length=512",
        "--assume-device",
        device,
        "--memory-gb",
        gb,
        "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_orchard(args);
  };
  std::vector<int> micro;
  for (const auto& [device, gb] :
       std::vector<std::pair<std::string, std::string>>{
           {"mps", "16"}, {"cuda", "80"}}) {
    auto r = plan(device, gb, {"gradient_accumulation_steps=2"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    // 8 rows (an auto micro-batch's share) x 2 accumulation steps.
    EXPECT_EQ(j["rows_per_step"], 16) << device;
    const int b = j["choice"]["batch"];
    EXPECT_EQ(16 % b, 0) << device;
    EXPECT_EQ(j["accumulation"].get<int>() * b, 16) << device;
    micro.push_back(b);
  }
  EXPECT_LT(micro[0], micro[1]); // the GPU takes more rows at once
  // total_batch_size in tokens sets the rows directly.
  auto r = plan("cuda", "80", {"total_batch_size=2048"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["rows_per_step"], 4);
  EXPECT_LE(j["choice"]["batch"].get<int>(), 4);
  // Impossible batches: what, and how to fix it.
  r = plan("cuda", "80", {"total_batch_size=1000"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "not a whole number of rows")) << r.err;
  EXPECT_TRUE(contains(r.err, "use a multiple of 512")) << r.err;
  r = plan("cuda", "80", {"device_batch_size=3", "total_batch_size=4096"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "does not divide the 8 rows")) << r.err;
}

// `plan --probe` for fine-tuning loads the model and measures two real
// steps. On a random Llama of 4.0 M parameters fully fine-tuned in float32,
// the second step's peak must hold the weights, their gradients and
// AdamW's two moments (16 bytes a parameter, counted independently of the
// planner); the planner's CPU estimate stays above what was measured.
TEST(Finetune, PlanProbeMeasuresARealStep) {
  TempDir tmp;
  const int64_t V = 4096, C = 256, I = 704, L = 4, H = 4, KV = 2, D = 64;
  fs::create_directories(tmp.file("m"));
  std::ofstream(tmp.file("m/config.json")) << nlohmann::json{
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", C},
      {"intermediate_size", I},
      {"num_hidden_layers", L},
      {"num_attention_heads", H},
      {"num_key_value_heads", KV},
      {"head_dim", D},
      {"vocab_size", V},
      {"max_position_embeddings", 512},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"}}.dump();
  torch::manual_seed(3);
  std::vector<std::pair<std::string, torch::Tensor>> w = {
      {"model.embed_tokens.weight", torch::randn({V, C}) * 0.02},
      {"model.norm.weight", torch::ones({C})}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto [name, rows, cols] :
         std::vector<std::tuple<std::string, int64_t, int64_t>>{
             {"self_attn.q_proj", H * D, C},
             {"self_attn.k_proj", KV * D, C},
             {"self_attn.v_proj", KV * D, C},
             {"self_attn.o_proj", C, H * D},
             {"mlp.gate_proj", I, C},
             {"mlp.up_proj", I, C},
             {"mlp.down_proj", C, I}})
      w.push_back({p + name + ".weight", torch::randn({rows, cols}) * 0.02});
    w.push_back({p + "input_layernorm.weight", torch::ones({C})});
    w.push_back({p + "post_attention_layernorm.weight", torch::ones({C})});
  }
  int64_t params = 0;
  for (const auto& [k, t] : w)
    params += t.numel();
  safetensors::save(tmp.file("m/model.safetensors"), w);
  auto probe = [&](const std::string& stage) {
    auto r = run_orchard(
        {"plan",
         "stage=" + stage,
         "model=" + tmp.file("m"),
         "max_seq_length=128",
         "per_device_train_batch_size=1",
         "--device",
         "cpu",
         "--probe",
         "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return nlohmann::json::parse(r.out.substr(r.out.find('{')))["probe"];
  };
  auto full = probe("full");
  ASSERT_EQ(full.size(), 2u) << full.dump(); // batch 1 and the next one up
  EXPECT_EQ(full[0]["batch"], 1);
  EXPECT_EQ(full[1]["batch"], 2);
  for (const auto& row : full) {
    const double measured = row["measured_bytes"];
    EXPECT_GE(measured, 16.0 * double(params)) << row.dump();
    EXPECT_LT(measured, row["predicted_bytes"].get<double>()) << row.dump();
  }
  // LoRA: the float32 base is loaded after the baseline.
  auto lora = probe("lora");
  ASSERT_EQ(lora.size(), 2u) << lora.dump();
  EXPECT_GE(lora[0]["measured_bytes"].get<double>(), 4.0 * double(params));
}

TEST(Finetune, BadInputSaysWhatAndHow) {
  TempDir tmp;
  const std::string data = write_chats(tmp);
  auto expect_error = [&](std::vector<std::string> args,
                          const std::string& what,
                          int code = 2) {
    auto r = run_orchard(
        args, {{"ORCHARD_HOME", tmp.file("home")}}, tmp.path().string());
    EXPECT_EQ(r.exit_code, code) << r.out << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    return r;
  };
  expect_error({"train", "stage=lora", "data=" + data}, "needs model=DIR");
  expect_error({"train", "stage=lora", "model=" + kLlama}, "needs data=FILE");
  expect_error(
      {"train", "stage=lora", "model=" + tmp.file("none"), "data=" + data},
      "does not exist");
  expect_error(
      {"train", "stage=lora", "model=" + kLlama, "data=" + data, "lora.rank=2"},
      "did you mean 'lora.r'");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + kLlama,
       "data=" + data,
       "max_seq_length=64",
       "lora.target_modules=[qkv]"},
      "q_proj");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + kLlama,
       "data=" + data,
       "max_seq_length=4096"},
      "max_position_embeddings");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + kLlama,
       "data=" + data,
       "fp16=true",
       "bf16=true"},
      "choose one");
  tmp.write("bad.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n");
  auto bad = expect_error(
      {"train",
       "stage=lora",
       "model=" + kLlama,
       "data=" + tmp.file("bad.jsonl"),
       "max_seq_length=64"},
      "bad.jsonl:1",
      /*code=*/1); // a data error, as orchard data chat
  // ... whose advice is one `orchard train` can follow (it has no
  // --skip-bad).
  EXPECT_NE(bad.err.find("Fix or remove the record"), std::string::npos)
      << bad.err;
  // The model's own template refuses a record (Mistral v0.1 has no system
  // role), or uses Jinja Orchard's subset lacks.
  const std::string v01 = tmp.file("mistral-v01");
  std::filesystem::copy(
      std::string(ORCHARD_FIXTURES) + "/hf/mistral_sp",
      v01,
      std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(
      std::string(ORCHARD_FIXTURES) + "/chat_templates/mistral-v0.1.jinja",
      v01 + "/chat_template.jinja",
      std::filesystem::copy_options::overwrite_existing);
  tmp.write(
      "system.jsonl",
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
      "{\"role\": \"user\", \"content\": \"u\"}, {\"role\": "
      "\"assistant\", \"content\": \"a\"}]}\n");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + v01,
       "data=" + tmp.file("system.jsonl"),
       "max_seq_length=64"},
      "system.jsonl:1: " + v01 +
          "/chat_template.jinja: the chat template refused the "
          "conversation: Conversation roles must alternate",
      1);
  tmp.write("mistral-v01/chat_template.jinja", "{% macro m() %}{% endmacro %}");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + v01,
       "data=" + data,
       "max_seq_length=64"},
      "chat_template.jinja:1: '{% macro %}' is not supported");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + v01,
       "data=" + data,
       "chat_template=zephyr"},
      "one of auto|llama3|chatml|mistral|orchard");
  // ... and chat_template= names a built-in family that renders instead.
  auto builtin = run_orchard(
      {"train",
       "stage=lora",
       "model=" + v01,
       "data=" + data,
       "max_seq_length=64",
       "max_steps=1",
       "chat_template=mistral",
       "run_dir=" + tmp.file("builtin-run")},
      {{"ORCHARD_HOME", tmp.file("home")}},
      tmp.path().string());
  EXPECT_EQ(builtin.exit_code, 0) << builtin.out << builtin.err;
  EXPECT_NE(builtin.out.find("(template: mistral)"), std::string::npos)
      << builtin.out;
  EXPECT_NE(
      builtin.out.find(
          "--adapter " + tmp.file("builtin-run") +
          "/adapter --chat-template mistral"),
      std::string::npos)
      << builtin.out;
  // `orchard chat` on that folder: the same choice, or the same error.
  auto chat = chat_once(v01, tmp.file("builtin-run"), "hi", 2, {});
  EXPECT_EQ(chat.exit_code, 2) << chat.out << chat.err;
  EXPECT_NE(chat.err.find("'{% macro %}' is not supported"), std::string::npos)
      << chat.err;
  chat = run_orchard(
      {"chat",
       "--model",
       v01,
       "--adapter",
       tmp.file("builtin-run"),
       "-p",
       "hi",
       "--max-new-tokens",
       "2",
       "--device",
       "cpu",
       "--chat-template",
       "mistral"});
  EXPECT_EQ(chat.exit_code, 0) << chat.out << chat.err;
  auto bad_family = run_orchard(
      {"chat", "--model", v01, "--chat-template", "zephyr", "-p", "hi"});
  EXPECT_EQ(bad_family.exit_code, 2) << bad_family.err;
  EXPECT_NE(
      bad_family.err.find(
          "zephyr not in {llama3,chatml,mistral,orchard,plain}"),
      std::string::npos)
      << bad_family.err;
  expect_error({"plan", "stage=lora"}, "plans for model=DIR");
  // --probe measures this machine, with the model's weights.
  expect_error(
      {"plan",
       "stage=lora",
       "model=" + kLlama,
       "--probe",
       "--assume-device",
       "mps",
       "--memory-gb",
       "16"},
      "cannot measure an assumed one (drop --assume-device)");
  fs::create_directories(tmp.file("config_only"));
  fs::copy_file(kLlama + "/config.json", tmp.file("config_only/config.json"));
  expect_error(
      {"plan",
       "stage=lora",
       "model=" + tmp.file("config_only"),
       "--probe",
       "--device",
       "cpu"},
      "holds no weights");
  expect_error(
      {"train",
       "stage=full",
       "model=" + kLlama,
       "data=" + data,
       "load_in_4bit=true"},
      "Use stage=lora");
  expect_error(
      {"train",
       "stage=lora",
       "model=" + kLlama,
       "data=" + data,
       "weights_dtype=bfloat16"},
      "weights_dtype=bfloat16 sets how full fine-tuning holds");
  expect_error(
      {"train", "stage=full", "model=" + kLlama, "data=" + data, "optim=sgd"},
      "adamw_8bit");
  expect_error(
      {"lora",
       "merge",
       "--model",
       kLlama,
       "--adapter",
       tmp.path().string(),
       "--out",
       tmp.file("m"),
       "--dtype",
       "int8"},
      "--dtype int8");
  expect_error(
      {"lora",
       "merge",
       "--model",
       kLlama,
       "--adapter",
       tmp.path().string(),
       "--out",
       tmp.file("m")},
      "adapter_config.json");
  expect_error(
      {"chat", "--adapter", tmp.path().string(), "-p", "hi"},
      "--adapter needs --model");
  expect_error(
      {"chat", "--model", kLlama, "--adapter", tmp.path().string(), "-p", "hi"},
      "adapter_config.json");
}

} // namespace
} // namespace orchard
