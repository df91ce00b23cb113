// `orchard train`: pretrain a GPT. With no arguments: the default model on
// the default corpus (WordNet), on the best device.
#include "cli/common.h"
#include "train/pretrain.h"

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
      "Pretrain a GPT (default: on WordNet); resumes from the run's checkpoints");
  add_config_flags(app, st->config, pretrain_schema(), &st->defaults);
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {app, [st] {
            PretrainConfig cfg;
            auto origins = config::resolve(
                pretrain_schema(), &cfg, sources_of(st->config));
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = select_device(st->device, m);
            train::run_pretraining(cfg, origins, d);
            return 0;
          }};
}

} // namespace orchard::cli
