// `orchard plan`: what training would use on this machine (or an assumed
// one): the memory budget, each candidate micro-batch's predicted peak by
// part, the choice and why; --json for scripts; --probe measures the
// chosen size and the next one up.
#include "cli/common.h"
#include "core/error.h"
#include "core/memory_stats.h"
#include "stages/plan.h"

#include <cstdio>
#include <memory>

namespace orchard::cli {

Command register_plan(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    std::unique_ptr<stages::Settings> defaults =
        stages::all_stages().front()->defaults();
    bool json = false, probe = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "plan",
      "Show the memory plan: budget, predicted peak per micro-batch, the "
      "choice and why");
  add_config_flags(
      app, st->config, st->defaults->stage->schema(), st->defaults->fields());
  add_device_flags(app, st->device, /*allow_assume=*/true);
  app->add_flag("--json", st->json, "print the plan as JSON");
  app->add_flag(
      "--probe",
      st->probe,
      "run a training step at the chosen size and the next one up and print "
      "the measured peak beside the prediction");
  return {app, [st] {
            if (st->json)
              status_to_stderr(); // JSON alone on stdout
            auto settings = stages::configure(sources_of(st->config));
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = select_device(st->device, m);
            if (st->probe && m.simulated)
              throw UserError(
                  "--probe runs on this machine's device; it cannot measure "
                  "an assumed one (drop --assume-device).");
            if (st->probe)
              fix_host_allocator(); // repeatable resident sets to measure
            stages::Plan plan = settings->stage->plan(*settings, d);
            if (st->json) {
              if (st->probe)
                plan.json["probe"] = stages::run_probes(plan, /*json=*/true);
              std::printf("%s\n", plan.json.dump(2).c_str());
            } else {
              std::printf("%s", plan.text.c_str());
              if (st->probe)
                stages::run_probes(plan, /*json=*/false);
            }
            return plan.fits ? 0 : 1;
          }};
}

} // namespace orchard::cli
