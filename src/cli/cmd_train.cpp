// `orchard train`: train one stage of a GPT (stage=base|mid|sft). With no
// arguments: the default model pretrained on the default corpus (WordNet),
// on the best device.
#include "cli/common.h"
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
  if (cfg.stage == "lora")
    std::printf(
        "\nChat with it: orchard chat --model %s --adapter %s\n"
        "Merge it:     orchard lora merge --model %s --adapter %s --out "
        "merged-model\n",
        cfg.model.c_str(),
        r.output_dir.c_str(),
        cfg.model.c_str(),
        r.output_dir.c_str());
  else
    std::printf(
        "\nChat with it: orchard chat --model %s\n", r.output_dir.c_str());
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
