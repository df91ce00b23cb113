#include "stages/grpo/settings.h"

#include "core/error.h"
#include "models/hf/config.h"
#include "runs/checkpoint.h"
#include "stages/grpo/plan.h"
#include "train/finetune.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

namespace orchard::grpo {
namespace {

namespace fs = std::filesystem;

// The value the run in `run_dir` began with for `key` (weights_dtype or
// optim), one of the key's concrete choices; nullopt when the run has no
// checkpoint or none of its files says. An unreadable file says nothing:
// auto decides, and the optimizer still checks the state it loads.
std::optional<std::string> begun_with(
    const std::string& run_dir,
    const std::string& key) {
  const auto checkpoints = runs::list_checkpoints(run_dir);
  if (checkpoints.empty())
    return std::nullopt;
  std::optional<std::string> value;
  std::ifstream state_file(checkpoints.back().second + "/state.json");
  const nlohmann::json state =
      nlohmann::json::parse(state_file, nullptr, false);
  if (state.is_object() && state.contains(key) && state[key].is_string()) {
    value = state[key].get<std::string>();
  } else {
    try {
      const YAML::Node yaml = YAML::LoadFile(run_dir + "/config.yaml");
      if (yaml[key] && yaml[key].IsScalar())
        value = yaml[key].as<std::string>();
    } catch (const YAML::Exception&) {
    }
  }
  const auto& choices = grpo_schema().find(key)->choices;
  if (!value || *value == "auto" ||
      std::find(choices.begin(), choices.end(), *value) == choices.end())
    return std::nullopt;
  return value;
}

} // namespace

std::string grpo_run_dir(const GrpoConfig& cfg) {
  if (!cfg.run_dir.empty())
    return cfg.run_dir;
  const std::string source = cfg.model.empty() ? cfg.checkpoint : cfg.model;
  fs::path sp = fs::path(source).lexically_normal();
  if (sp.filename().empty())
    sp = sp.parent_path();
  return "runs/grpo/" +
      (!cfg.run.empty() ? cfg.run : sp.filename().string() + "-" + cfg.env);
}

GrpoConfig resolved(
    const GrpoConfig& given,
    const DeviceInfo& device,
    std::string* why,
    const std::string& run_dir) {
  if (given.model.empty() == given.checkpoint.empty())
    throw UserError(
        given.model.empty()
            ? "stage=grpo needs a policy: model=DIR (a Hugging Face folder) "
              "or checkpoint=RUN (an Orchard run, such as runs/sft/d4)."
            : "stage=grpo takes model=DIR or checkpoint=RUN, not both.");
  GrpoConfig cfg = given;
  std::string taken;
  if (!run_dir.empty() && cfg.resume != "never")
    for (auto [key, value] :
         {std::pair{"weights_dtype", &cfg.weights_dtype},
          std::pair{"optim", &cfg.optim}})
      if (*value == "auto")
        if (auto begun = begun_with(run_dir, key)) {
          *value = *begun;
          taken += (taken.empty() ? "" : " ") + std::string(key) + "=" + *begun;
        }
  train::FinetuneConfig ft = as_finetune(cfg);
  const std::string reason = train::resolve_auto_precision(
      ft,
      device,
      cfg.model.empty()
          ? std::nullopt
          : std::optional(models::read_hf_config(cfg.model).dtype));
  cfg.weights_dtype = ft.weights_dtype;
  cfg.optim = ft.optim;
  if (why)
    *why = taken.empty()
        ? reason
        : "as the run in " + run_dir + " began (" + taken + ")";
  return cfg;
}

} // namespace orchard::grpo
