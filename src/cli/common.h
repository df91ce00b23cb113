// What the subcommands share: the device flags, the config flags, and the
// one place that turns them into a device and a resolved config.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "core/machine.h"
#include "infer/sampling.h"
#include "runs/load.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace orchard::cli {

struct DeviceFlags {
  std::string device = "auto";
  std::string assume_device; // plan for another machine: cuda|mps|cpu
  double memory_gb = 0;      // with assume_device, or alone to override RAM
};

// --device on every command that computes; --assume-device / --memory-gb
// where a command can plan for a machine it is not on.
void add_device_flags(CLI::App* app, DeviceFlags& flags, bool allow_assume);

// The machine to plan for: simulated when --assume-device is given,
// otherwise detected (with --memory-gb overriding the detected memory).
MachineFacts machine_for(const DeviceFlags& flags);

// Where a command's human lines (Using device, Model) go: stdout, or
// stderr once a command's stdout carries only machine-readable output
// (plan --json) or only the answer (chat -p).
void status_to_stderr();
std::FILE* status_stream();

// Resolves --device, prints `Using device: ...` and the platform notes.
// WORLD_SIZE must be a count; a command that trains (`trains`) refuses more
// than one process.
DeviceInfo select_device(
    const DeviceFlags& flags,
    const MachineFacts& machine,
    bool trains = false,
    const EnvLookup& env = process_env());

// Which model a command uses (runs/load.h): -i/--run, --checkpoint, or
// --model [--adapter], and --chat-template.
using ModelFlags = runs::ModelSource;
void add_model_flags(CLI::App* app, ModelFlags& flags);
// --chat-template, for the commands that render conversations.
void add_chat_template_flag(CLI::App* app, ModelFlags& flags);
// --min-p, --repetition-penalty and --sampling-device auto|cpu|device
// (infer/sampling.h), for the commands that generate.
void add_sampling_extra_flags(CLI::App* app, infer::SamplingOptions& opt);
// runs::load_model, printing what was loaded.
runs::LoadedModel open_model(const ModelFlags& flags, const DeviceInfo& device);

struct ConfigFlags {
  std::string preset;
  std::string config_file;
  std::vector<std::string> overrides;
};

// --preset, --config and trailing key=value overrides; the schema's option
// table becomes the command's --help footer.
void add_config_flags(
    CLI::App* app,
    ConfigFlags& flags,
    const config::Schema& schema,
    void* defaults);

config::Sources sources_of(const ConfigFlags& flags);

// A subcommand: its CLI11 app and what to run once it was parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command register_doctor(CLI::App& root);
Command register_config(CLI::App& root);
Command register_tokenizer(CLI::App& root);
Command register_data(CLI::App& root);
Command register_train(CLI::App& root);
Command register_generate(CLI::App& root);
Command register_plan(CLI::App& root);
Command register_pipeline(CLI::App& root);
Command register_chat(CLI::App& root);
Command register_serve(CLI::App& root);
Command register_lora(CLI::App& root);
Command register_eval(CLI::App& root);
Command register_solve(CLI::App& root);
Command register_launch(CLI::App& root);
// `orchard launch [its options] train ...`, as torchrun is called: the `--`
// put in `args` (argv) before the launched command where it was left out,
// so that the command's options are not read as launch's.
void separate_launched_command(
    const CLI::App& root,
    std::vector<std::string>& args);
Command register_export(CLI::App& root);

} // namespace orchard::cli
