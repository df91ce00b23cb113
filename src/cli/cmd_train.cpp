// `orchard train`: train one stage of a GPT (stage=base|mid|sft). With no
// arguments: the default model pretrained on the default corpus (WordNet),
// on the best device.
#include "cli/common.h"

#include <cstdio>

#include <memory>

namespace orchard::cli {

Command register_train(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    PretrainConfig defaults;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "train",
      "Train a GPT stage: base (default, on WordNet), mid or sft; resumes from "
      "the run's checkpoints");
  add_config_flags(app, st->config, pretrain_schema(), &st->defaults);
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        PretrainConfig cfg;
        auto origins =
            config::resolve(pretrain_schema(), &cfg, sources_of(st->config));
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
