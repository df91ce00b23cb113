// What a stage is, and the registry of stages by name.
//
// A stage (base, mid, sft, lora, full, grpo, trm) is one entry
// here: its config section (a struct and its schema, src/core/config.h),
// how it trains (the task it hands the Trainer, src/train/trainer.h), its
// memory plan, the samples drawn from the finished model and the commands
// it suggests next. `orchard train`, `plan`, `config` and `pipeline` find
// the stage by name and never ask which one it is.
//
// Adding a stage: one file defining a Stage and its settings, and one line
// in registry.cpp's list.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "train/report.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orchard::stages {

class Stage;

// A run's settings: the stage, its section's struct (filled from presets,
// --config, the environment and key=value overrides) and where each value
// came from.
class Settings {
 public:
  virtual ~Settings() = default;
  // The section's struct, as config::resolve and config::to_yaml take it.
  virtual void* fields() = 0;
  const Stage* stage = nullptr;
  config::Origins origins;
};

// The settings of a stage whose section is the struct C.
template <class C>
class SettingsOf : public Settings {
 public:
  void* fields() override {
    return &cfg;
  }
  C cfg;
};

// The section of settings made by a stage whose section is C.
template <class C>
const C& section(const Settings& s) {
  return static_cast<const SettingsOf<C>&>(s).cfg;
}

// A memory plan as `orchard plan` prints it; with a probe, the micro-batches
// to measure and how (measured and predicted bytes of batches[i]).
struct Plan {
  std::string text;    // the table and its header lines
  nlohmann::json json; // the same for --json
  bool fits = false;
  std::vector<int64_t> probe_batches;
  std::function<std::pair<double, double>(size_t)> measure;
};

// A finished (or interrupted) stage: the result and the samples in its
// report.
using Report = train::StageReport;

class Stage {
 public:
  Stage(std::string name, std::string summary)
      : name_(std::move(name)), summary_(std::move(summary)) {}
  virtual ~Stage() = default;
  const std::string& name() const {
    return name_;
  }
  // One line for `orchard train --help`.
  const std::string& summary() const {
    return summary_;
  }
  virtual const config::Schema& schema() const = 0;
  // Settings at their defaults (for --help), and resolved from `sources`
  // (UserError for an unknown key or a bad value).
  virtual std::unique_ptr<Settings> defaults() const = 0;
  std::unique_ptr<Settings> configure(const config::Sources& sources) const;
  // Fills defaults that depend on more than the sources (a model's own
  // limits), after they were applied; configure() calls it.
  virtual void complete(Settings& settings) const {}

  // Trains (resuming from the run's checkpoints), draws `final_samples`
  // samples from the result and writes the run's report.md.
  virtual Report train(
      const Settings& settings,
      const DeviceInfo& device,
      int final_samples = 3) const = 0;
  // The memory plan on `device` (which may be simulated); the probe's
  // measurement only runs when asked for.
  virtual Plan plan(const Settings& settings, const DeviceInfo& device)
      const = 0;
  // What to run next, printed after training ("Chat with it: ...").
  virtual std::string next_steps(const Settings& settings, const Report& r)
      const = 0;
  // Whether several processes (src/dist) train this stage together, each on
  // its own part of the data.
  virtual bool data_parallel() const {
    return false;
  }

 private:
  std::string name_, summary_;
};

// Every stage, in pipeline order then the others.
const std::vector<const Stage*>& all_stages();
// The stage named `name`; UserError listing the stages.
const Stage& stage_named(const std::string& name);
// "base|mid|sft|lora|full".
std::string stage_list();
// Where this process is one of several (src/dist), collective: UserError
// on every rank when the stage does not train data-parallel yet, or when
// the ranks' settings differ (a node started with another command; the
// message names the keys and each rank's value). Left unchecked, ranks
// training different models fail in their first collective, or worse.
void check_several_processes(Settings& settings);

// The stage the sources ask for (stage=... in the preset, then --config,
// then key=value; the later wins), "base" when none says, and its settings
// resolved from them.
std::unique_ptr<Settings> configure(const config::Sources& sources);

} // namespace orchard::stages
