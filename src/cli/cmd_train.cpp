// `orchard train`: train one stage of a GPT (stage=base|mid|sft). With no
// arguments: the default model pretrained on the default corpus (WordNet),
// on the best device.
#include "cli/common.h"
#include "infer/chat.h"
#include "train/finetune.h"

#include <cstdio>
#include <memory>

namespace orchard::cli {
namespace {

int run_finetune_command(const ConfigFlags& flags, const DeviceFlags& dflags) {
  train::FinetuneConfig cfg;
  auto origins =
      config::resolve(train::finetune_schema(), &cfg, sources_of(flags));
  MachineFacts m = machine_for(dflags);
  DeviceInfo d = select_device(dflags, m);
  auto r = train::run_finetune(cfg, origins, d);
  if (r.interrupted) {
    std::printf("Stopped; the same command resumes from the checkpoint.\n");
    return 0;
  }
  // Answers to held-out questions from the result, and the run report.
  train::StageReport report;
  train::TrainResult& t = report.result;
  t.stage = cfg.stage;
  t.run_dir = r.run_dir;
  t.tokenizer_dir = cfg.model;
  t.init_dir = cfg.model;
  t.data_description = r.data_description;
  t.step = r.step;
  t.total = r.total;
  t.val_loss = r.val_loss;
  t.train_seconds = r.train_seconds;
  t.peak_memory_bytes = r.peak_memory_bytes;
  t.checkpoint_dir = r.output_dir;
  t.chat_val = r.chat_val;
  ModelFlags mf;
  mf.model_dir = cfg.stage == "lora" ? cfg.model : r.output_dir;
  if (cfg.stage == "lora")
    mf.adapter = r.output_dir;
  if (cfg.chat_template != "auto")
    mf.chat_template = cfg.chat_template;
  infer::SamplingOptions so;
  so.max_new_tokens = 48;
  so.temperature = 0.7;
  so.seed = uint64_t(cfg.seed);
  infer::LoadedModel loaded = load_model(mf, d);
  report.sample_note =
      "answers to held-out questions (the model never trained on these "
      "records)";
  for (auto& s : infer::sample_chat_answers(loaded, r.chat_val, 3, so))
    report.samples.push_back({s.question, s.answer, s.reference});
  if (!r.already_done) {
    std::printf("\nSamples: %s\n", report.sample_note.c_str());
    print_samples(report.samples);
  }
  train::write_stage_report(d, report);
  std::printf("Report: %s/report.md\n", r.run_dir.c_str());
  const std::string template_flag =
      mf.chat_template.empty() ? "" : " --chat-template " + mf.chat_template;
  if (cfg.stage == "lora")
    std::printf(
        "\nChat with it: orchard chat --model %s --adapter %s%s\n"
        "Merge it:     orchard lora merge --model %s --adapter %s --out "
        "merged-model\n",
        cfg.model.c_str(),
        r.output_dir.c_str(),
        template_flag.c_str(),
        cfg.model.c_str(),
        r.output_dir.c_str());
  else
    std::printf(
        "\nChat with it: orchard chat --model %s%s\n",
        r.output_dir.c_str(),
        template_flag.c_str());
  return 0;
}

} // namespace

Command register_train(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    PretrainConfig defaults;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "train",
      "Train a GPT stage: base (default, on WordNet), mid or sft; or "
      "fine-tune a Hugging Face model: stage=lora|full model=DIR data=FILE "
      "(its keys: orchard config stage=lora); resumes from the run's "
      "checkpoints");
  add_config_flags(app, st->config, pretrain_schema(), &st->defaults);
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {app, [st] {
            if (train::is_finetune_stage(requested_stage(st->config)))
              return run_finetune_command(st->config, st->device);
            PretrainConfig cfg;
            auto origins = config::resolve(
                pretrain_schema(), &cfg, sources_of(st->config));
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = select_device(st->device, m);
            auto report = run_stage(cfg, origins, d);
            const auto& r = report.result;
            if (r.interrupted)
              return 0;
            // The same run as `-i STAGE` finds when it is the newest.
            const std::string which = "--checkpoint " + r.run_dir;
            if (r.stage == "base")
              std::printf(
                  "\nGenerate more: orchard generate %s --prompt \"...\"\n"
                  "Next stage: orchard train stage=mid%s\n",
                  which.c_str(),
                  cfg.run.empty() ? "" : (" run=" + cfg.run).c_str());
            else if (r.stage == "mid")
              std::printf(
                  "\nNext stage: orchard train stage=sft%s\n",
                  cfg.run.empty() ? "" : (" run=" + cfg.run).c_str());
            else
              std::printf(
                  "\nChat with it: orchard chat %s (or orchard serve %s)\n",
                  which.c_str(),
                  which.c_str());
            return 0;
          }};
}

} // namespace orchard::cli
