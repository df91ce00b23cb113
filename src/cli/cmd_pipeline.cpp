// `orchard pipeline`: base, mid, sft and rl training and a report in one
// command (stages/pipeline.h); runs only the stages not yet done.
#include "cli/common.h"
#include "stages/gpt_stages.h"
#include "stages/pipeline.h"
#include "train/trainer.h"

#include <cstdio>
#include <memory>

namespace orchard::cli {

Command register_pipeline(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    std::unique_ptr<stages::Settings> defaults =
        stages::base_stage().defaults();
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "pipeline",
      "Base, mid, sft and rl training and a report in one command; runs only "
      "the stages not yet done");
  add_config_flags(
      app, st->config, st->defaults->stage->schema(), st->defaults->fields());
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {app, [st] {
            stages::Pipeline p = stages::plan_pipeline(sources_of(st->config));
            MachineFacts m = machine_for(st->device);
            // With several processes this joins them, after which rank 0
            // alone prints: the plan is printed once.
            DeviceInfo d = select_device(st->device, m, /*trains=*/true);
            std::printf("%s", stages::pipeline_status(p).c_str());
            std::fflush(stdout);
            if (!stages::run_pipeline(p, d))
              return 128 + train::last_stop_signal(); // saved; resumable
            return 0;
          }};
}

} // namespace orchard::cli
