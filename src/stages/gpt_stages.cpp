#include "stages/gpt_stages.h"

#include "core/dtype.h"
#include "core/version.h"
#include "dist/world.h"
#include "runs/load.h"
#include "stages/plan.h"
#include "stages/samples.h"
#include "text/tokenizer_io.h"
#include "train/data_cache.h"
#include "train/memory_probe.h"
#include "train/pretrain.h"

#include <cstdio>

namespace orchard::stages {
namespace {

class GptStage : public Stage {
 public:
  using Stage::Stage;

  const config::Schema& schema() const override {
    return pretrain_schema();
  }
  std::unique_ptr<Settings> defaults() const override {
    auto s = std::make_unique<SettingsOf<PretrainConfig>>();
    s->cfg.stage = name();
    s->stage = this;
    return s;
  }

  Report train(
      const Settings& settings,
      const DeviceInfo& device,
      int final_samples) const override {
    const PretrainConfig& cfg = section<PretrainConfig>(settings);
    // Samples during training (sample_every), with the weights evaluation
    // uses.
    auto hook = [&cfg](
                    const models::Gpt& model,
                    const std::string& tokenizer_dir,
                    const SampleSource& source,
                    int64_t step) {
      std::printf("Samples at step %lld:\n", (long long)step);
      print_samples(draw_samples(
          runs::loaded_from(model.ptr(), tokenizer_dir), source, 2, cfg.seed));
    };
    Report report;
    report.result = train::run_training(cfg, settings.origins, device, hook);
    return finish_stage(std::move(report), device, [&](Report& rep) {
      const train::TrainResult& r = rep.result;
      runs::LoadedModel model =
          runs::load_model(runs::ModelSource{.checkpoint = r.run_dir}, device);
      rep.samples = draw_samples(
          model,
          {r.val_shards, r.chat_val},
          final_samples,
          cfg.seed,
          &rep.sample_note);
    });
  }

  Plan plan(const Settings& settings, const DeviceInfo& device) const override {
    // With a batch schedule the micro-batch divides its unit.
    PretrainConfig cfg = section<PretrainConfig>(settings);
    train::resolve_batch_schedule(cfg, settings.origins);
    // The vocabulary: the given tokenizer's, or the size Orchard trains
    // for pretraining data.
    int64_t vocab = int64_t(train::kDefaultVocabSize);
    if (!cfg.tokenizer.empty())
      vocab = int64_t(text::load_tokenizer(cfg.tokenizer).vocab_size());
    const models::GptConfig mc = resolve_gpt_config(cfg, vocab);
    const train::Precision precision =
        train::resolve_precision(cfg.dtype, device);
    const train::PlanSettings ps = train::plan_settings(cfg, precision, device);
    const train::BatchPlan bp = train::plan_for(cfg, mc, precision, device);
    Plan out;
    out.fits = bp.choice && bp.choice->fits;
    out.json = train::plan_json(bp, cfg.max_seq_len);
    char head[512];
    std::snprintf(
        head,
        sizeof head,
        "Model: %s, %lld parameters, %lld tokens per sequence, %s, %s\n",
        mc.tag().c_str(),
        (long long)train::plan_model_of(mc).params,
        (long long)cfg.max_seq_len,
        precision.name.c_str(),
        cfg.optimizer == "muon" ? "Muon + AdamW" : "AdamW");
    out.text = head + train::plan_table(bp, cfg.max_seq_len);
    // A probe measures the chosen size and the next one up.
    std::vector<train::PlanCandidate> sizes;
    if (bp.choice) {
      sizes.push_back(*bp.choice);
      for (const auto& c : bp.candidates)
        if (c.checkpointing == bp.choice->checkpointing &&
            c.batch > bp.choice->batch) {
          sizes.push_back(c);
          break;
        }
    }
    for (const auto& c : sizes)
      out.probe_batches.push_back(c.batch);
    out.measure = [sizes, mc, ps, dev = device.device](size_t i) {
      const train::PlanCandidate& c = sizes[i];
      train::PlanSettings s = ps;
      s.gradient_checkpointing = c.checkpointing;
      auto r = train::measure_step_peak(mc, s, c.batch, c.accum, dev);
      return std::pair{r.measured, r.predicted};
    };
    return out;
  }

  bool data_parallel() const override {
    return true;
  }

  std::string next_steps(const Settings& settings, const Report& report)
      const override {
    const PretrainConfig& cfg = section<PretrainConfig>(settings);
    const train::TrainResult& r = report.result;
    if (r.interrupted)
      return "";
    // The same run as `-i STAGE` finds when it is the newest.
    const std::string which = "--checkpoint " + r.run_dir;
    const std::string run = cfg.run.empty() ? "" : " run=" + cfg.run;
    const std::string& orchard = program_name();
    // Training on several processes: the next stage is started alike.
    const std::string train =
        dist::launch().training_command(orchard) + " train";
    if (name() == "base")
      return "\nGenerate more: " + orchard + " generate " + which +
          " --prompt \"...\"\nNext stage: " + train + " stage=mid" + run + "\n";
    if (name() == "mid")
      return "\nNext stage: " + train + " stage=sft" + run + "\n";
    return "\nChat with it: " + orchard + " chat " + which + " (or " + orchard +
        " serve " + which + ")\n";
  }
};

} // namespace

const Stage& base_stage() {
  static const GptStage stage(
      "base", "pretrain a GPT from scratch on text (WordNet by default)");
  return stage;
}

const Stage& mid_stage() {
  static const GptStage stage(
      "mid", "continue a base model on conversations mixed with text");
  return stage;
}

const Stage& sft_stage() {
  static const GptStage stage(
      "sft", "fine-tune a mid model on conversations, loss on the answers");
  return stage;
}

} // namespace orchard::stages
