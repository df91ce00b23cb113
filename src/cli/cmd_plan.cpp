// `orchard plan`: what training would use on this machine (or an assumed
// one): the memory budget, each candidate micro-batch's predicted peak by
// part, the choice and why; --json for scripts; --probe measures the
// chosen size and the next one up.
#include "cli/common.h"
#include "core/error.h"
#include "core/memory_stats.h"
#include "core/torch_compat.h"
#include "text/tokenizer_io.h"
#include "train/data_cache.h"
#include "train/finetune.h"
#include "train/memory_probe.h"
#include "train/pretrain.h"

#include <cstdio>
#include <functional>
#include <memory>

namespace orchard::cli {

namespace {

struct PlanState {
  ConfigFlags config;
  DeviceFlags device;
  PretrainConfig defaults;
  bool json = false, probe = false;
};

// --probe: for each micro-batch (measure(i) for batches[i]), the measured peak
// of real training steps beside the prediction, or the out-of-memory error that
// ended them. Lines are printed as they come (text), or returned for the JSON
// (`json`).
nlohmann::json run_probes(
    const std::vector<int64_t>& batches,
    const std::function<std::pair<double, double>(size_t)>& measure,
    bool json) {
  nlohmann::json out = nlohmann::json::array();
  if (!json)
    std::printf("\nProbe (two real training steps each):\n");
  for (size_t i = 0; i < batches.size(); ++i) {
    const int64_t b = batches[i];
    try {
      const auto [measured, predicted] = measure(i);
      const double error = 100.0 * (predicted - measured) / measured;
      out.push_back(
          {{"batch", b},
           {"measured_bytes", measured},
           {"predicted_bytes", predicted},
           {"error_percent", error}});
      if (!json)
        std::printf(
            "  batch %lld: measured %s, predicted %s (%+.1f %%)\n",
            (long long)b,
            train::format_mb(measured).c_str(),
            train::format_mb(predicted).c_str(),
            error);
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e))
        throw;
      const std::string what =
          std::string(e.what_without_backtrace()).substr(0, 120);
      out.push_back({{"batch", b}, {"out_of_memory", what}});
      if (!json)
        std::printf(
            "  batch %lld: out of memory (%s)\n", (long long)b, what.c_str());
    }
    std::fflush(stdout);
  }
  return out;
}

void refuse_simulated_probe(const MachineFacts& m) {
  if (m.simulated)
    throw UserError(
        "--probe runs on this machine's device; it cannot measure "
        "an assumed one (drop --assume-device).");
}

// stage=lora|full: the fine-tuning estimate for the model's config.json
// (the weights are not read, so a 16 GB Mac can be planned anywhere);
// --probe loads them and trains two steps at the chosen micro-batch and the
// next one up.
int plan_finetune_command(const PlanState& st) {
  train::FinetuneConfig cfg;
  config::resolve(train::finetune_schema(), &cfg, sources_of(st.config));
  if (cfg.model.empty())
    throw UserError(
        "stage=" + cfg.stage +
        " plans for model=DIR: give the model folder (only its "
        "config.json is read).");
  const models::HfModelConfig mc = models::read_hf_config(cfg.model);
  MachineFacts m = machine_for(st.device);
  DeviceInfo d = select_device(st.device, m);
  if (st.probe)
    refuse_simulated_probe(m);
  const auto dtype = train::finetune_dtype(cfg, d);
  auto plan = train::plan_finetune(mc, cfg, dtype, d);
  std::vector<int64_t> sizes = {plan.choice.batch};
  for (const auto& r : plan.rows)
    if (r.batch > plan.choice.batch) {
      sizes.push_back(r.batch);
      break;
    }
  auto measure = [&](size_t i) {
    auto r = train::measure_finetune_peak(cfg, d, sizes[i]);
    return std::pair{r.measured, r.predicted.total()};
  };
  const char* dname = dtype == torch::kBFloat16 ? "bfloat16"
      : dtype == torch::kFloat16                ? "float16"
                                                : "float32";
  if (st.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : plan.rows)
      rows.push_back(
          {{"batch", r.batch},
           {"total_bytes", r.memory.total()},
           {"weights_bytes", r.memory.weights},
           {"activations_bytes", r.memory.activations},
           {"fits", r.fits}});
    nlohmann::json j = {
        {"stage", cfg.stage},
        {"architecture", mc.architecture},
        {"base_dtype", dname},
        {"load_in_4bit", cfg.load_in_4bit},
        {"seq_len", cfg.max_seq_length},
        {"budget_bytes", plan.budget},
        {"candidates", rows},
        {"choice",
         {{"batch", plan.choice.batch},
          {"total_bytes", plan.choice.memory.total()},
          {"fits", plan.choice.fits}}},
        {"why", plan.why}};
    if (st.probe)
      j["probe"] = run_probes(sizes, measure, /*json=*/true);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "Model: %s (%s), %s %s%s base, %lld tokens per row%s\n",
        cfg.model.c_str(),
        mc.architecture.c_str(),
        cfg.stage.c_str(),
        cfg.load_in_4bit ? "4-bit NF4 (computing in " : "",
        (std::string(dname) + (cfg.load_in_4bit ? ")" : "")).c_str(),
        (long long)cfg.max_seq_length,
        cfg.gradient_checkpointing ? ", gradient checkpointing" : "");
    std::printf("%s", train::finetune_plan_table(plan).c_str());
    if (st.probe)
      run_probes(sizes, measure, /*json=*/false);
  }
  return plan.choice.fits ? 0 : 1;
}

} // namespace

Command register_plan(CLI::App& root) {
  using State = PlanState;
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "plan",
      "Show the memory plan: budget, predicted peak per micro-batch, the "
      "choice and why");
  add_config_flags(app, st->config, pretrain_schema(), &st->defaults);
  add_device_flags(app, st->device, /*allow_assume=*/true);
  app->add_flag("--json", st->json, "print the plan as JSON");
  app->add_flag(
      "--probe",
      st->probe,
      "run a training step at the chosen size and the next one up and print "
      "the measured peak beside the prediction");
  return {
      app, [st] {
        if (train::is_finetune_stage(requested_stage(st->config)))
          return plan_finetune_command(*st);
        PretrainConfig cfg;
        config::resolve(pretrain_schema(), &cfg, sources_of(st->config));
        MachineFacts m = machine_for(st->device);
        DeviceInfo d = select_device(st->device, m);
        if (st->probe)
          refuse_simulated_probe(m);
        // The vocabulary: the given tokenizer's, or the size Orchard
        // trains for pretraining data.
        int64_t vocab = int64_t(train::kDefaultVocabSize);
        if (!cfg.tokenizer.empty())
          vocab = int64_t(text::load_tokenizer(cfg.tokenizer).vocab_size());
        models::GptConfig mc = models::resolve_gpt_config(cfg, vocab);
        train::Precision precision = train::resolve_precision(cfg.dtype, d);
        train::PlanSettings ps = train::plan_settings(cfg, precision, d);
        auto plan = train::plan_for(cfg, mc, precision, d);
        // --probe: the chosen size and the next one up.
        std::vector<train::PlanCandidate> sizes;
        if (st->probe && plan.choice) {
          sizes.push_back(*plan.choice);
          for (const auto& c : plan.candidates)
            if (c.checkpointing == plan.choice->checkpointing &&
                c.batch > plan.choice->batch) {
              sizes.push_back(c);
              break;
            }
        }
        std::vector<int64_t> batches;
        for (const auto& c : sizes)
          batches.push_back(c.batch);
        auto measure = [&](size_t i) {
          const train::PlanCandidate& c = sizes[i];
          train::PlanSettings s = ps;
          s.gradient_checkpointing = c.checkpointing;
          auto r = train::measure_step_peak(mc, s, c.batch, c.accum, d.device);
          return std::pair{r.measured, r.predicted};
        };
        if (st->json) {
          auto j = train::plan_json(plan, cfg.max_seq_len);
          if (!batches.empty())
            j["probe"] = run_probes(batches, measure, /*json=*/true);
          std::printf("%s\n", j.dump(2).c_str());
        } else {
          std::printf(
              "Model: %s, %lld parameters, %lld tokens per sequence, %s, "
              "%s\n",
              mc.tag().c_str(),
              (long long)train::plan_model_of(mc).params,
              (long long)cfg.max_seq_len,
              precision.name.c_str(),
              cfg.optimizer == "muon" ? "Muon + AdamW" : "AdamW");
          std::printf("%s", train::plan_table(plan, cfg.max_seq_len).c_str());
          if (!batches.empty())
            run_probes(batches, measure, /*json=*/false);
        }
        return plan.choice && plan.choice->fits ? 0 : 1;
      }};
}

} // namespace orchard::cli
