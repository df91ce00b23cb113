// `orchard doctor`: versions, devices, memory, measured speed, a tiny
// training step per device; "Ready to train on <device>" or each problem
// with its fix. Exit 0 when usable, 1 otherwise.
#include "cli/common.h"
#include "core/doctor.h"

#include <iostream>
#include <memory>

namespace orchard::cli {

Command register_doctor(CLI::App& root) {
  auto flags = std::make_shared<DeviceFlags>();
  CLI::App* app = root.add_subcommand(
      "doctor", "Check that this machine can train, and say how to fix it");
  add_device_flags(app, *flags, /*allow_assume=*/false);
  return {app, [flags] {
            MachineFacts m = machine_for(*flags);
            select_device(*flags, m);
            std::cout << "Checking every device (a few seconds)...\n"
                      << std::flush;
            DoctorReport report = run_doctor(m, flags->device);
            std::cout << render(report);
            return report.ready ? 0 : 1;
          }};
}

} // namespace orchard::cli
