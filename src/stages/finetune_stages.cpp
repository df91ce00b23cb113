#include "stages/finetune_stages.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/version.h"
#include "runs/load.h"
#include "stages/samples.h"
#include "train/finetune.h"

#include <cstdio>

namespace orchard::stages {
namespace {

class FinetuneStage : public Stage {
 public:
  using Stage::Stage;

  const config::Schema& schema() const override {
    return train::finetune_schema();
  }
  std::unique_ptr<Settings> defaults() const override {
    auto s = std::make_unique<SettingsOf<train::FinetuneConfig>>();
    s->cfg.stage = name();
    s->stage = this;
    return s;
  }

  // max_seq_length left at its default is the smaller of that and the
  // model's positions; a value the user set is kept (and refused later when
  // too long).
  void complete(Settings& settings) const override {
    auto& cfg = static_cast<SettingsOf<train::FinetuneConfig>&>(settings).cfg;
    if (settings.origins.count("max_seq_length") || cfg.model.empty())
      return;
    try {
      const int64_t positions =
          models::read_hf_config(cfg.model).max_position_embeddings;
      if (positions > 0 && positions < cfg.max_seq_len)
        cfg.max_seq_len = positions;
    } catch (const UserError&) {
      // A missing or bad model folder is reported by train and plan.
    }
  }

  Report train(
      const Settings& settings,
      const DeviceInfo& device,
      int final_samples) const override {
    const train::FinetuneConfig& cfg = section<train::FinetuneConfig>(settings);
    Report report;
    report.result = train::run_finetune(cfg, settings.origins, device);
    // Answers to held-out questions from the result, and the run report.
    return finish_stage(std::move(report), device, [&](Report& rep) {
      const train::TrainResult& r = rep.result;
      runs::LoadedModel loaded = runs::load_model(source(cfg, r), device);
      rep.samples =
          draw_samples(loaded, {{}, r.chat_val}, final_samples, cfg.seed);
      rep.sample_note =
          "answers to held-out questions (the model never trained on these "
          "records)";
    });
  }

  bool data_parallel() const override {
    return true;
  }

  Plan plan(const Settings& settings, const DeviceInfo& device) const override {
    train::FinetuneConfig cfg = section<train::FinetuneConfig>(settings);
    // Only config.json is read, so a 16 GB Mac can be planned anywhere; a
    // probe loads the weights.
    if (cfg.model.empty())
      throw UserError(
          "stage=" + cfg.stage +
          " plans for model=DIR: give the model folder (only its "
          "config.json is read).");
    const models::HfModelConfig mc = models::read_hf_config(cfg.model);
    train::resolve_auto_precision(cfg, device, mc.dtype);
    const auto dtype = train::finetune_dtype(cfg, device);
    const train::FinetunePlan fp = train::plan_finetune(mc, cfg, dtype, device);
    const std::string dname = dtype_name(dtype);
    const int64_t rows = train::finetune_rows_per_step(cfg);
    Plan out;
    out.fits = fp.choice.fits;
    nlohmann::json candidates = nlohmann::json::array();
    for (const auto& r : fp.rows)
      candidates.push_back(
          {{"batch", r.batch},
           {"total_bytes", r.memory.total()},
           {"weights_bytes", r.memory.weights},
           {"activations_bytes", r.memory.activations},
           {"fits", r.fits}});
    out.json = {
        {"stage", cfg.stage},
        {"architecture", mc.architecture},
        {"base_dtype", dname},
        {"load_in_4bit", cfg.load_in_4bit},
        {"seq_len", cfg.max_seq_len},
        {"budget_bytes", fp.budget},
        {"candidates", candidates},
        {"choice",
         {{"batch", fp.choice.batch},
          {"total_bytes", fp.choice.memory.total()},
          {"fits", fp.choice.fits}}},
        {"rows_per_step", rows},
        {"accumulation", rows / fp.choice.batch},
        {"why", fp.why}};
    out.text = "Model: " + cfg.model + " (" + mc.architecture + "), " +
        cfg.stage + " " +
        (cfg.load_in_4bit ? "4-bit NF4 (computing in " + dname + ")" : dname) +
        " base, " + std::to_string(cfg.max_seq_len) + " tokens per row" +
        (cfg.gradient_checkpointing ? ", gradient checkpointing" : "") + "\n" +
        train::finetune_plan_table(fp);
    // A probe measures the chosen size and the next one up.
    out.probe_batches = {fp.choice.batch};
    for (const auto& r : fp.rows)
      if (r.batch > fp.choice.batch) {
        out.probe_batches.push_back(r.batch);
        break;
      }
    out.measure = [cfg, device, batches = out.probe_batches](size_t i) {
      auto r = train::measure_finetune_peak(cfg, device, batches[i]);
      return std::pair{r.measured, r.predicted.total()};
    };
    return out;
  }

  std::string next_steps(const Settings& settings, const Report& report)
      const override {
    const train::FinetuneConfig& cfg = section<train::FinetuneConfig>(settings);
    const train::TrainResult& r = report.result;
    if (r.interrupted)
      return "Stopped; the same command resumes from the checkpoint.\n";
    const std::string template_flag = cfg.chat_template == "auto"
        ? ""
        : " --chat-template " + cfg.chat_template;
    const std::string& orchard = program_name();
    if (cfg.stage == "lora")
      return "\nChat with it: " + orchard + " chat --model " + cfg.model +
          " --adapter " + r.output_dir + template_flag +
          "\nMerge it:     " + orchard + " lora merge --model " + cfg.model +
          " --adapter " + r.output_dir + " --out merged-model\n";
    return "\nChat with it: " + orchard + " chat --model " + r.output_dir +
        template_flag + "\n";
  }

 private:
  // The trained model as generation loads it.
  static runs::ModelSource source(
      const train::FinetuneConfig& cfg,
      const train::TrainResult& r) {
    runs::ModelSource s;
    s.model_dir = cfg.stage == "lora" ? cfg.model : r.output_dir;
    if (cfg.stage == "lora")
      s.adapter = r.output_dir;
    if (cfg.chat_template != "auto")
      s.chat_template = cfg.chat_template;
    return s;
  }
};

} // namespace

const Stage& lora_stage() {
  static const FinetuneStage stage(
      "lora",
      "LoRA adapters on a frozen Hugging Face model (model=DIR data=FILE)");
  return stage;
}

const Stage& full_stage() {
  static const FinetuneStage stage(
      "full", "fine-tune every weight of a Hugging Face model (model=DIR)");
  return stage;
}

} // namespace orchard::stages
