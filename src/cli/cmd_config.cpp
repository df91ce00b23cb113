// `orchard config`: resolve the config from every source, print it as YAML,
// and exit. The dry run: what a preset sets, what a run would use.
#include "cli/common.h"
#include "stages/stage.h"

#include <iostream>
#include <memory>

namespace orchard::cli {

Command register_config(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    std::unique_ptr<stages::Settings> defaults =
        stages::all_stages().front()->defaults();
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "config", "Print the resolved config as YAML and exit (a dry run)");
  add_config_flags(
      app, st->config, st->defaults->stage->schema(), st->defaults->fields());
  add_device_flags(app, st->device, /*allow_assume=*/true);
  return {app, [st] {
            auto settings = stages::configure(sources_of(st->config));
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = resolve_device(st->device.device, m);
            std::cout << "# " << using_device_line(d) << "\n"
                      << "# memory: " << format_bytes(d.total_memory)
                      << (d.unified_memory ? " unified" : "") << " ("
                      << (m.simulated ? "simulated" : m.ram_source) << ")\n"
                      << config::to_yaml(
                             settings->stage->schema(),
                             settings->fields(),
                             settings->origins);
            return 0;
          }};
}

} // namespace orchard::cli
