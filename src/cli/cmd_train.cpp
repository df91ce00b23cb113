// `orchard train`: train one stage (stages/stage.h): base (default, on
// WordNet), mid, sft, or lora/full of a Hugging Face model folder.
#include "cli/common.h"
#include "stages/stage.h"
#include "train/trainer.h"

#include <cstdio>
#include <memory>

namespace orchard::cli {

Command register_train(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    std::unique_ptr<stages::Settings> defaults =
        stages::all_stages().front()->defaults();
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "train",
      "Train a stage: " + stages::stage_list() +
          " (base by default, on WordNet); lora and full fine-tune a Hugging "
          "Face model: stage=lora model=DIR data=FILE (its keys: orchard "
          "config stage=lora); resumes from the run's checkpoints");
  add_config_flags(
      app, st->config, st->defaults->stage->schema(), st->defaults->fields());
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {app, [st] {
            auto settings = stages::configure(sources_of(st->config));
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = select_device(st->device, m, /*trains=*/true);
            const stages::Stage& stage = *settings->stage;
            stages::check_several_processes(*settings);
            const stages::Report report = stage.train(*settings, d);
            std::printf("%s", stage.next_steps(*settings, report).c_str());
            if (report.result.interrupted)
              return 128 + train::last_stop_signal(); // saved; resumable
            return 0;
          }};
}

} // namespace orchard::cli
