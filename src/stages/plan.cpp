#include "stages/plan.h"

#include "core/memory_stats.h"
#include "train/memory_plan.h"

#include <cstdio>

namespace orchard::stages {
namespace {
// Below this, a prediction is within the planner's usual error.
constexpr double kUnderPredictionWarnPercent = 10.0;
} // namespace

nlohmann::json run_probes(const Plan& plan, bool json) {
  nlohmann::json out = nlohmann::json::array();
  if (!json)
    std::printf("\nProbe (two real training steps each):\n");
  for (size_t i = 0; i < plan.probe_batches.size(); ++i) {
    const int64_t b = plan.probe_batches[i];
    try {
      const auto [measured, predicted] = plan.measure(i);
      const double error = 100.0 * (predicted - measured) / measured;
      out.push_back(
          {{"batch", b},
           {"measured_bytes", measured},
           {"predicted_bytes", predicted},
           {"error_percent", error}});
      if (!json)
        std::printf(
            "  batch %lld: measured %s, predicted %s (%+.1f %%)\n",
            (long long)b,
            train::format_mb(measured).c_str(),
            train::format_mb(predicted).c_str(),
            error);
      // An under-prediction is the dangerous side: the automatic batch is
      // chosen by the prediction.
      if (error < -kUnderPredictionWarnPercent) {
        const std::string warning = "the plan predicted " +
            std::to_string(int(-error + 0.5)) +
            " % less memory than this step used, so the automatic "
            "device_batch_size may not fit; set device_batch_size to a "
            "size the probe measured below your memory.";
        if (json)
          out.back()["warning"] = warning;
        else
          std::printf("  Warning: %s\n", warning.c_str());
      }
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e))
        throw;
      const std::string what =
          std::string(e.what_without_backtrace()).substr(0, 120);
      out.push_back({{"batch", b}, {"out_of_memory", what}});
      if (!json)
        std::printf(
            "  batch %lld: out of memory (%s)\n", (long long)b, what.c_str());
    }
    std::fflush(stdout);
  }
  return out;
}

} // namespace orchard::stages
