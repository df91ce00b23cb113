// What the subcommands share: the device flags, the config flags, and the
// one place that turns them into a device and a resolved config.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "core/machine.h"
#include "infer/engine.h"
#include "train/pretrain_config.h"
#include "train/report.h"

#include <CLI/CLI.hpp>

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

// Resolves --device, prints `Using device: ...` and the platform notes, and
// refuses multi-process runs on MPS (WORLD_SIZE > 1).
DeviceInfo select_device(
    const DeviceFlags& flags,
    const MachineFacts& machine,
    const EnvLookup& env = process_env());

// Which trained model a command uses: `-i base|mid|sft [--run NAME]` (the
// stage's run, the newest when no name is given) or `--checkpoint DIR` (a
// run or checkpoint folder).
// Or `--model DIR [--adapter DIR]`: a Hugging Face model folder, with a
// LoRA adapter (PEFT's format, or a run folder of `orchard train
// stage=lora`).
struct ModelFlags {
  std::string stage, run, checkpoint;
  std::string model_dir, adapter;
  std::string chat_template; // "": the folder's own; or a built-in family
};
void add_model_flags(CLI::App* app, ModelFlags& flags);
// --chat-template, for the commands that render conversations.
void add_chat_template_flag(CLI::App* app, ModelFlags& flags);
// The run or checkpoint folder; UserError when neither or both are given.
std::string model_path(const ModelFlags& flags);
// The model the flags name, on `device` (Hugging Face models in bfloat16 on
// CUDA and MPS, float32 on the CPU); prints what was loaded.
infer::LoadedModel load_model(
    const ModelFlags& flags,
    const DeviceInfo& device);
// A human name for the model: "sft/d4", "Llama-3.2-3B + adapter".
std::string model_name(const ModelFlags& flags);
// An adapter folder: `path` itself, or <path>/adapter (a LoRA run folder).
std::string adapter_folder(const std::string& path);

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
// The stage the sources ask for (preset, then --config, then key=value;
// the later wins), "" when none says: fine-tuning stages (lora, full) read
// their own keys.
std::string requested_stage(const ConfigFlags& flags);

// A subcommand: its CLI11 app and what to run once it was parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Trains one stage (cfg.stage) with samples during and after training and
// writes its report.md; the pipeline runs each stage through this too.
train::StageReport run_stage(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device,
    int final_samples = 3);

// Prints samples as "Q: / A: / (reference: ...)" or "[prompt]continuation".
void print_samples(const std::vector<train::Sample>& samples);

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

} // namespace orchard::cli
