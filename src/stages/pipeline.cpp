#include "stages/pipeline.h"

#include "core/error.h"
#include "core/version.h"
#include "dist/world.h"
#include "runs/checkpoint.h"
#include "runs/run_folder.h"
#include "stages/gpt_stages.h"
#include "stages/grpo/grpo_stage.h"
#include "train/pretrain_config.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

namespace orchard::stages {
namespace {

// The rl stage's GRPO settings: 4 questions x 8 answers a step, answers cut
// at 32 tokens (the name and part of speech come first), an evaluation of
// 32 held-out questions before and after.
constexpr int64_t kRlGenerations = 8;
constexpr int64_t kRlGenerationBatch = 32;
constexpr int64_t kRlCompletion = 32;
constexpr int64_t kRlMicroBatch = 8; // each step trains the whole batch
constexpr const char* kRlLearningRate = "3e-4";
constexpr int64_t kRlEvalPrompts = 32;

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
  auto ckpts = runs::list_checkpoints(run_dir);
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

// A stage whose parent trains in this command, or was trained further
// since, is stale: it trains again (its old run is kept aside).
void mark_stale(const Pipeline& p, const PipelineStage& ps, StageStatus& st) {
  if (p.stages.empty() || st.step == 0)
    return;
  const PipelineStage& parent = p.stages.back();
  const std::string& parent_name = parent.name;
  const auto parent_ckpts = runs::list_checkpoints(parent.run_dir);
  const std::string was = runs::trained_from(ps.run_dir);
  if (!parent.done) {
    st.done = false;
    st.text = "trains again after " + parent_name +
        " (it was trained "
        "from " +
        parent_name + "'s older checkpoint)";
  } else if (
      !parent_ckpts.empty() && !was.empty() &&
      !runs::same_folder(was, parent_ckpts.back().second)) {
    st.done = false;
    st.text = "trained from " + was + ", not " + parent_name +
        "'s newest checkpoint: trains again";
  }
}

// The rl stage: GRPO from the sft run on WordNet's questions, rewarded for
// naming the asked word and its part of speech (stages/grpo/environment.h),
// with settings sized for the quick model on a CPU.
std::unique_ptr<Settings> rl_settings(
    const PretrainConfig& cfg,
    const std::string& name,
    const std::string& run_dir,
    const EnvLookup& env) {
  config::Sources src;
  src.env = env;
  src.overrides = {
      "env=wordnet",
      "checkpoint=" + runs::stage_run_dir("sft", name),
      "run_dir=" + run_dir,
      "max_steps=" + std::to_string(cfg.rl_iterations),
      "seed=" + std::to_string(cfg.seed),
      "num_generations=" + std::to_string(kRlGenerations),
      "generation_batch_size=" + std::to_string(kRlGenerationBatch),
      "max_completion_length=" +
          std::to_string(std::min(kRlCompletion, cfg.max_seq_len / 2)),
      "learning_rate=" + std::string(kRlLearningRate),
      "gradient_accumulation_steps=" +
          std::to_string(kRlGenerationBatch / kRlMicroBatch),
      "per_device_train_batch_size=" + std::to_string(kRlMicroBatch),
      "eval_prompts=" + std::to_string(kRlEvalPrompts),
      "eval_every=0",
      "save_every=" + std::to_string(cfg.save_every),
  };
  if (!cfg.data_dir.empty())
    src.overrides.push_back("data_dir=" + cfg.data_dir);
  return grpo_stage().configure(src);
}

} // namespace

Pipeline plan_pipeline(const config::Sources& sources) {
  std::unique_ptr<Settings> base = base_stage().configure(sources);
  const PretrainConfig& cfg = section<PretrainConfig>(*base);
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
  Pipeline p;
  p.custom_run = cfg.run;
  p.name = !cfg.run.empty()
      ? cfg.run
      : "d" + std::to_string(cfg.arch.n_layer.value_or(cfg.depth));
  // Each stage's settings: the pipeline's, with its own length; rl's are
  // GRPO's (rl_settings).
  for (const auto& stage : runs::pipeline_stages()) {
    if (stage == "rl") {
      // Opt-in, as nanochat's chat_rl: on the quick model it raises the
      // shaped reward but not the share answered right (docs/grpo.md).
      if (cfg.rl_iterations == 0)
        continue;
      PipelineStage ps;
      ps.name = stage;
      ps.run_dir = runs::stage_run_dir("rl", p.name);
      ps.settings = rl_settings(cfg, p.name, ps.run_dir, sources.env);
      StageStatus st = status_of(ps.run_dir, cfg.rl_iterations);
      mark_stale(p, ps, st);
      ps.done = st.done;
      ps.status = st.text;
      p.stages.push_back(std::move(ps));
      continue;
    }
    const Stage& entry = stage_named(stage);
    auto s = std::make_unique<SettingsOf<PretrainConfig>>();
    s->stage = &entry;
    s->cfg = cfg;
    s->origins = base->origins;
    PretrainConfig& c = s->cfg;
    config::Origins& o = s->origins;
    c.stage = stage;
    c.run = p.name;
    if (stage != "base") {
      c.num_iterations =
          stage == "mid" ? cfg.mid_iterations : cfg.sft_iterations;
      c.epochs.reset();
      c.target_tokens.reset();
      o["num_iterations"] =
          o.count(stage + "_iterations") ? o[stage + "_iterations"] : "default";
    }
    const bool fixed_length = c.stage != "base" ||
        (!c.epochs && !c.target_tokens && c.num_iterations);
    PipelineStage ps;
    ps.name = stage;
    ps.run_dir = runs::stage_run_dir(c.stage, p.name);
    StageStatus st =
        status_of(ps.run_dir, fixed_length ? *c.num_iterations : 0);
    mark_stale(p, ps, st);
    ps.done = st.done;
    ps.status = st.text;
    ps.settings = std::move(s);
    p.stages.push_back(std::move(ps));
  }
  return p;
}

std::string pipeline_status(const Pipeline& p) {
  std::string out = "Pipeline for " + p.name + ":\n";
  char line[512];
  for (const auto& s : p.stages) {
    std::snprintf(
        line,
        sizeof line,
        "  %-4s  %-16s %s\n",
        s.name.c_str(),
        s.run_dir.c_str(),
        s.status.c_str());
    out += line;
  }
  return out;
}

bool run_pipeline(const Pipeline& p, const DeviceInfo& d) {
  std::vector<train::StageReport> reports;
  for (const auto& s : p.stages)
    if (!s.done)
      check_several_processes(*s.settings);
  bool all_done = true;
  for (const auto& s : p.stages) {
    all_done = all_done && s.done;
    const Stage& stage = *s.settings->stage;
    // A stage done before is read again for the pipeline's report.
    std::printf(
        "\n==> Stage %s%s%s\n",
        s.name.c_str(),
        s.name == "rl" ? " (GRPO on WordNet's questions)" : "",
        s.done ? ": done before, read for the report" : "");
    std::fflush(stdout);
    reports.push_back(stage.train(*s.settings, d));
    // Rank 0 writes the stage's last checkpoint (after its final
    // evaluation and report), and every rank's next stage starts from it.
    dist::barrier("the end of stage " + s.name);
    if (reports.back().result.interrupted) {
      std::printf(
          "The pipeline stopped during %s; run the same command to "
          "resume it.\n",
          s.name.c_str());
      return false;
    }
  }
  const std::string report = "runs/report-" + p.name + ".md";
  std::string preamble = "Model `" + p.name + "`; stages:\n\n";
  for (const auto& s : p.stages)
    preamble += "- " + s.name +
        (s.name == "rl" ? " (GRPO on WordNet's questions)" : "") + ": " +
        (s.done ? "already done before this command"
                : "trained by this command") +
        "\n";
  if (!dist::leader()) // with several processes rank 0 writes the report
    return true;
  train::write_pipeline_report(report, d, reports, preamble);
  const auto& last = reports.back();
  std::printf(
      "\n%s. Report: %s\n",
      all_done ? "The pipeline was already complete"
               : "The pipeline is complete",
      report.c_str());
  for (const auto& [k, v] : last.result.report_rows)
    std::printf("%s: %s\n", k.c_str(), v.c_str());
  std::printf("\nChat exchanges about held-out words:\n");
  for (const auto& s : last.samples)
    std::printf(
        "  you:     %s\n  orchard: %s\n  (WordNet: %s)\n",
        s.prompt.c_str(),
        s.output.c_str(),
        s.reference.c_str());
  const std::string run_flag = p.custom_run.empty() ? "" : " --run " + p.name;
  const char* orchard = program_name().c_str();
  const char* stage = p.stages.back().name.c_str();
  // On several processes, training further is started alike.
  const std::string train = dist::launch().training_command(program_name());
  std::printf(
      "\nContinue:\n"
      "  %s chat -i %s%s                  chat in the terminal\n"
      "  %s serve -i %s%s                 web chat on "
      "http://127.0.0.1:8000 and an OpenAI-compatible API\n"
      "  %s pipeline mid_iterations=N      train further (the stages "
      "after retrain)\n",
      orchard,
      stage,
      run_flag.c_str(),
      orchard,
      stage,
      run_flag.c_str(),
      train.c_str());
  return true;
}

} // namespace orchard::stages
