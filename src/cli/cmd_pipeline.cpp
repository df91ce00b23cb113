// `orchard pipeline`: tokenizer -> data -> base -> mid -> sft -> report,
// running only what is missing. Each stage is `orchard train stage=...`
// (run_stage); a stage whose final checkpoint exists is done, one with any
// other checkpoint resumes from it.
#include "cli/common.h"
#include "core/error.h"
#include "train/checkpoint.h"
#include "train/trained_model.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

namespace orchard::cli {
namespace {

struct StageStatus {
  bool done = false;
  int64_t step = 0; // of the newest checkpoint (0: none)
  std::string text;
};

// From the newest complete checkpoint folder's state.json: the final
// checkpoint of a finished run says "complete": true. `wanted` is the
// number of steps asked for (0 when it depends on the data).
StageStatus status_of(const std::string& run_dir, int64_t wanted) {
  StageStatus st;
  auto ckpts = train::list_checkpoints(run_dir);
  if (ckpts.empty()) {
    st.text = "not started";
    return st;
  }
  st.step = ckpts.back().first;
  nlohmann::json state = nlohmann::json::object();
  std::ifstream in(ckpts.back().second + "/state.json");
  state = nlohmann::json::parse(in, nullptr, false);
  const bool complete = state.is_object() && state.value("complete", false);
  st.done = complete && (wanted == 0 || st.step >= wanted);
  if (st.done)
    st.text = "done at step " + std::to_string(st.step);
  else if (complete)
    st.text = "done at step " + std::to_string(st.step) + "; " +
        std::to_string(wanted) + " asked for, so it trains on";
  else
    st.text = "partial at step " + std::to_string(st.step) +
        ": resumes from its checkpoint";
  return st;
}

} // namespace

Command register_pipeline(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    PretrainConfig defaults;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "pipeline",
      "Base, mid and sft training and a report in one command; runs only "
      "the stages not yet done");
  add_config_flags(app, st->config, pretrain_schema(), &st->defaults);
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        PretrainConfig cfg;
        auto origins =
            config::resolve(pretrain_schema(), &cfg, sources_of(st->config));
        if (cfg.stage != "base")
          throw UserError(
              "stage=" + cfg.stage +
              " was given to `orchard pipeline`, which runs every stage; "
              "use `orchard train stage=" +
              cfg.stage + "` for one stage.");
        if (!cfg.run_dir.empty())
          throw UserError(
              "run_dir names one run folder, but the pipeline writes one per "
              "stage (runs/<stage>/<run>); set run=NAME instead.");
        if (cfg.init != "auto")
          throw UserError(
              "init= chooses a stage's starting model; the pipeline starts "
              "each stage from the one before. Use `orchard train stage=mid "
              "init=...` to start from another model.");
        const std::string name = !cfg.run.empty()
            ? cfg.run
            : "d" + std::to_string(cfg.arch.n_layer.value_or(cfg.depth));
        // Each stage's settings: the pipeline's, with its own length.
        std::vector<std::pair<PretrainConfig, config::Origins>> stages;
        for (const auto& stage : train::stage_names()) {
          PretrainConfig c = cfg;
          config::Origins o = origins;
          c.stage = stage;
          c.run = name;
          if (stage != "base") {
            c.num_iterations =
                stage == "mid" ? cfg.mid_iterations : cfg.sft_iterations;
            c.epochs.reset();
            c.target_tokens.reset();
            o["num_iterations"] = o.count(stage + "_iterations")
                ? o[stage + "_iterations"]
                : "default";
          }
          stages.push_back({c, o});
        }
        std::printf("Pipeline for %s:\n", name.c_str());
        std::vector<StageStatus> status;
        bool all_done = true;
        for (const auto& [c, o] : stages) {
          const bool fixed_length = c.stage != "base" ||
              (!c.epochs && !c.target_tokens && c.num_iterations);
          StageStatus s = status_of(
              train::stage_run_dir(c.stage, name),
              fixed_length ? *c.num_iterations : 0);
          std::printf(
              "  %-4s  %-16s %s\n",
              c.stage.c_str(),
              train::stage_run_dir(c.stage, name).c_str(),
              s.text.c_str());
          all_done = all_done && s.done;
          status.push_back(s);
        }
        std::fflush(stdout);
        MachineFacts m = machine_for(st->device);
        DeviceInfo d = select_device(st->device, m);
        std::vector<train::StageReport> reports;
        for (size_t i = 0; i < stages.size(); ++i) {
          const auto& [c, o] = stages[i];
          if (!status[i].done)
            std::printf("\n==> Stage %s\n", c.stage.c_str());
          std::fflush(stdout);
          reports.push_back(run_stage(c, o, d));
          if (reports.back().result.interrupted) {
            std::printf(
                "The pipeline stopped during %s; run the same command to "
                "resume it.\n",
                c.stage.c_str());
            return 0;
          }
        }
        const std::string report = "runs/report-" + name + ".md";
        std::string preamble = "Model `" + name + "`; stages:\n\n";
        for (size_t i = 0; i < stages.size(); ++i)
          preamble += "- " + stages[i].first.stage + ": " +
              (status[i].done ? "already done before this command"
                              : "trained by this command") +
              "\n";
        train::write_pipeline_report(report, d, reports, preamble);
        const auto& sft = reports.back();
        std::printf(
            "\n%s. Report: %s\n",
            all_done ? "The pipeline was already complete"
                     : "The pipeline is complete",
            report.c_str());
        std::printf("\nChat exchanges about held-out words:\n");
        for (const auto& s : sft.samples)
          std::printf(
              "  you:     %s\n  orchard: %s\n  (WordNet: %s)\n",
              s.prompt.c_str(),
              s.output.c_str(),
              s.reference.c_str());
        const std::string run_flag = cfg.run.empty() ? "" : " --run " + name;
        std::printf(
            "\nContinue:\n"
            "  orchard chat -i sft%s              chat in the terminal\n"
            "  orchard serve -i sft%s             web chat on "
            "http://127.0.0.1:8000 and an OpenAI-compatible API\n"
            "  orchard pipeline mid_iterations=N  train further (done stages "
            "are skipped)\n",
            run_flag.c_str(),
            run_flag.c_str());
        return 0;
      }};
}

} // namespace orchard::cli
