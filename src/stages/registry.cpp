#include "stages/stage.h"

#include "core/error.h"
#include "core/version.h"
#include "dist/launch_env.h"
#include "dist/world.h"
#include "stages/finetune_stages.h"
#include "stages/gpt_stages.h"
#include "stages/grpo/grpo_stage.h"
#include "stages/trm/trm_stage.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace orchard::stages {
namespace {

// The stage the sources ask for; "" when none says. A source that does not
// parse is left for the real resolution to report.
std::string requested_stage(const config::Sources& s) {
  std::string stage;
  auto from_yaml = [&](const std::string& text) {
    try {
      YAML::Node n = YAML::Load(text);
      if (n.IsMap() && n["stage"] && n["stage"].IsScalar())
        stage = n["stage"].as<std::string>();
    } catch (const YAML::Exception&) {
    }
  };
  if (!s.preset.empty())
    if (auto text = config::preset_text(s.preset))
      from_yaml(*text);
  if (!s.config_file.empty()) {
    std::ifstream in(s.config_file);
    std::stringstream ss;
    ss << in.rdbuf();
    from_yaml(ss.str());
  }
  for (const auto& o : s.overrides)
    if (o.rfind("stage=", 0) == 0)
      stage = o.substr(6);
  return stage;
}

} // namespace

std::unique_ptr<Settings> Stage::configure(
    const config::Sources& sources) const {
  std::unique_ptr<Settings> s = defaults();
  s->origins = config::resolve(schema(), s->fields(), sources);
  // A rank its launcher started again after a failure resumes from the
  // run's newest checkpoint: resume=never would start over, and the failed
  // attempt's steps would be lost. (resume=DIR: the Trainer prefers the
  // run's newest checkpoint on a restart, and takes DIR where there is
  // none yet.)
  const config::Option* resume = schema().find("resume");
  if (const int restart = dist::restart_count();
      restart > 0 && resume != nullptr) {
    const std::string asked = config::value_text(*resume, s->fields());
    if (asked == "never") {
      config::Sources again = sources;
      again.overrides.push_back("resume=auto");
      s = defaults();
      s->origins = config::resolve(schema(), s->fields(), again);
      if (dist::read_launch_env().rank == 0)
        std::printf(
            "Restart %d of this run (TORCHELASTIC_RESTART_COUNT): resuming "
            "from its newest checkpoint, resume=auto in place of "
            "resume=never.\n",
            restart);
    }
  }
  s->stage = this;
  complete(*s);
  return s;
}

const std::vector<const Stage*>& all_stages() {
  static const std::vector<const Stage*> stages = {
      &base_stage(),
      &mid_stage(),
      &sft_stage(),
      &lora_stage(),
      &full_stage(),
      &grpo_stage(),
      &trm_stage()};
  return stages;
}

std::string stage_list() {
  std::string names;
  for (const Stage* s : all_stages())
    names += (names.empty() ? "" : "|") + s->name();
  return names;
}

const Stage& stage_named(const std::string& name) {
  for (const Stage* s : all_stages())
    if (s->name() == name)
      return *s;
  throw UserError(
      "stage=" + name + " is not a stage; the stages are " + stage_list() +
      ".");
}

namespace {

void check_data_parallel(const Stage& stage) {
  if (dist::size() <= 1 || stage.data_parallel())
    return;
  std::string which;
  for (const Stage* s : all_stages())
    if (s->data_parallel())
      which += (which.empty() ? "" : ", ") + s->name();
  throw UserError(
      "stage=" + stage.name() +
      " does not train with several processes yet "
      "(WORLD_SIZE=" +
      std::to_string(dist::size()) + "); the stages that do: " + which +
      ". Train it in one process (unset WORLD_SIZE, or leave out "
      "`orchard launch`/torchrun).");
}

} // namespace

void check_several_processes(Settings& settings) {
  if (dist::size() <= 1)
    return;
  check_data_parallel(*settings.stage);
  // The build, then every option's value, a line each, in the schema's
  // order.
  std::vector<std::string> keys = {"the Orchard version", "stage"};
  std::string mine = orchard_version() + "\n" + settings.stage->name() + "\n";
  for (const auto& o : settings.stage->schema().options()) {
    keys.push_back(o.key);
    mine += config::value_text(o, settings.fields()) + "\n";
  }
  const std::vector<std::string> all = dist::gather_strings(mine);
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      out.push_back(line);
    return out;
  };
  const std::vector<std::string> first = lines(all[0]);
  std::string differ;
  int shown = 0;
  constexpr int kMostShown = 5; // keys named in the message
  for (size_t r = 1; r < all.size() && shown < kMostShown; ++r) {
    const std::vector<std::string> theirs = lines(all[r]);
    for (size_t k = 0; k < keys.size() && shown < kMostShown; ++k) {
      const std::string a = k < first.size() ? first[k] : "?";
      const std::string b = k < theirs.size() ? theirs[k] : "?";
      if (a == b)
        continue;
      differ += std::string(shown++ ? "; " : "") + keys[k] + " is " + a +
          " on rank 0 but " + b + " on rank " + std::to_string(r);
      if (k < 2)
        break; // another build's or another stage's keys
    }
  }
  if (!differ.empty())
    throw UserError(
        "the processes were started with different settings: " + differ +
        ". Every rank trains one model: start each node's `orchard launch` "
        "with the same command (the same preset, --config file, "
        "environment and key=value settings).");
}

std::unique_ptr<Settings> configure(const config::Sources& sources) {
  const std::string asked = requested_stage(sources);
  return (asked.empty() ? base_stage() : stage_named(asked)).configure(sources);
}

} // namespace orchard::stages
