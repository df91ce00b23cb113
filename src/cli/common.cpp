#include "cli/common.h"

#include "core/error.h"
#include "models/lora.h"
#include "train/finetune.h"
#include "train/trained_model.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orchard::cli {

void add_device_flags(CLI::App* app, DeviceFlags& flags, bool allow_assume) {
  app->add_option(
         "--device",
         flags.device,
         "auto|cuda|cuda:N|mps|cpu; auto picks CUDA, then MPS, then the CPU")
      ->capture_default_str();
  if (!allow_assume)
    return;
  app->add_option(
      "--assume-device",
      flags.assume_device,
      "plan for a machine Orchard is not on: cuda|mps|cpu (with --memory-gb)");
  app->add_option(
      "--memory-gb",
      flags.memory_gb,
      "memory of that machine in GB (unified memory on mps, GPU memory on "
      "cuda); alone, overrides the detected RAM like MEMORY_SIZE");
}

MachineFacts machine_for(const DeviceFlags& flags) {
  if (!flags.assume_device.empty()) {
    if (flags.memory_gb <= 0)
      throw UserError(
          "--assume-device " + flags.assume_device +
          " needs --memory-gb, the memory of that machine (e.g. "
          "--assume-device mps --memory-gb 64).");
    return simulated_machine(flags.assume_device, flags.memory_gb);
  }
  MachineFacts m = probe_machine();
  if (flags.memory_gb > 0) {
    m.ram_total_bytes = m.ram_available_bytes =
        static_cast<uint64_t>(flags.memory_gb * double(kGiB));
    m.ram_source = "--memory-gb";
  }
  return m;
}

DeviceInfo select_device(
    const DeviceFlags& flags,
    const MachineFacts& machine,
    const EnvLookup& env) {
  DeviceInfo d = resolve_device(flags.device, machine);
  std::printf("%s\n", using_device_line(d).c_str());
  for (const auto& note : platform_notes(machine))
    std::printf("%s\n", note.c_str());
  if (auto ws = env("WORLD_SIZE")) {
    char* end = nullptr;
    long n = std::strtol(ws->c_str(), &end, 10);
    if (ws->empty() || *end != '\0' || n < 1)
      throw UserError(
          "WORLD_SIZE='" + *ws +
          "' is not a process count; set it to 1 or more, or unset it.");
    check_distributed_supported(d, static_cast<int>(n));
  }
  return d;
}

void add_config_flags(
    CLI::App* app,
    ConfigFlags& flags,
    const config::Schema& schema,
    void* defaults) {
  std::string names;
  for (const auto& n : config::preset_names())
    names += (names.empty() ? "" : "|") + n;
  app->add_option("--preset", flags.preset, "start from a preset: " + names);
  app->add_option(
      "--config", flags.config_file, "YAML file of settings (over the preset)");
  app->add_option(
      "overrides",
      flags.overrides,
      "key=value settings, applied last (depth=8 arch.n_embd=512 "
      "data_paths=[a,b])");
  app->footer(
      "\n" + config::help_table(schema, defaults) +
      "\nLater sources win: preset, --config, environment, key=value.");
}

config::Sources sources_of(const ConfigFlags& flags) {
  config::Sources s;
  s.preset = flags.preset;
  s.config_file = flags.config_file;
  s.overrides = flags.overrides;
  return s;
}

void add_model_flags(CLI::App* app, ModelFlags& flags) {
  app->add_option(
      "-i,--stage",
      flags.stage,
      "the model of a stage: base, mid or sft (its newest run)");
  app->add_option(
      "--run", flags.run, "with -i: the run's name (runs/<stage>/<name>)");
  app->add_option(
      "--checkpoint",
      flags.checkpoint,
      "a run folder (its newest checkpoint) or a checkpoint folder");
  app->add_option(
      "--model",
      flags.model_dir,
      "a Hugging Face model folder (Llama, Qwen2, Mistral: config.json, "
      "*.safetensors, tokenizer.json)");
  app->add_option(
      "--adapter",
      flags.adapter,
      "with --model: a LoRA adapter folder (PEFT's format) or an `orchard "
      "train stage=lora` run folder");
}

void add_chat_template_flag(CLI::App* app, ModelFlags& flags) {
  app->add_option(
         "--chat-template",
         flags.chat_template,
         "llama3|chatml|mistral|orchard: a built-in chat template instead of "
         "the model folder's own")
      ->check(CLI::IsMember({"llama3", "chatml", "mistral", "orchard"}));
}

std::string model_path(const ModelFlags& flags) {
  if (!flags.model_dir.empty())
    return flags.model_dir;
  if (!flags.adapter.empty())
    throw UserError(
        "--adapter needs --model DIR, the base model the adapter was trained "
        "on.");
  if (!flags.stage.empty() && !flags.checkpoint.empty())
    throw UserError("give either -i STAGE or --checkpoint DIR, not both.");
  if (!flags.checkpoint.empty())
    return flags.checkpoint;
  if (flags.stage.empty())
    throw UserError(
        "which model? Give -i base|mid|sft (a stage's newest run) or "
        "--checkpoint DIR (a run or checkpoint folder).");
  return train::find_stage_run(flags.stage, flags.run);
}

std::string adapter_folder(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(path) / "adapter_config.json"))
    return path;
  if (fs::exists(fs::path(path) / "adapter" / "adapter_config.json"))
    return (fs::path(path) / "adapter").string();
  throw UserError(
      "--adapter " + path +
      " holds no adapter_config.json (nor adapter/adapter_config.json, as an "
      "orchard train stage=lora run folder does once it finishes).");
}

infer::LoadedModel load_model(const ModelFlags& flags, const DeviceInfo& d) {
  if (flags.model_dir.empty()) {
    infer::LoadedModel loaded = infer::load_trained_model(model_path(flags));
    std::printf(
        "Model: %s (step %lld)\n",
        loaded.checkpoint_dir.c_str(),
        (long long)loaded.step);
    return loaded;
  }
  if (!flags.stage.empty() || !flags.checkpoint.empty())
    throw UserError("give either --model DIR or -i/--checkpoint, not both.");
  models::LoadOptions opt;
  opt.device = d.device;
  opt.dtype = train::finetune_dtype(train::FinetuneConfig{}, d);
  models::Llama model = models::load_hf_model(flags.model_dir, opt);
  std::string adapter;
  if (!flags.adapter.empty()) {
    adapter = adapter_folder(flags.adapter);
    models::load_adapter(model, adapter, torch::kFloat32);
  }
  model->eval();
  std::printf(
      "Model: %s (%s, %lld layers)%s\n",
      flags.model_dir.c_str(),
      model->config.architecture.c_str(),
      (long long)model->config.num_hidden_layers,
      adapter.empty() ? "" : (" + adapter " + adapter).c_str());
  infer::LoadedModel out;
  out.model = model.ptr();
  out.tokenizer_dir = flags.model_dir;
  out.chat_template = flags.chat_template;
  out.checkpoint_dir = flags.model_dir;
  return out;
}

std::string model_name(const ModelFlags& flags) {
  namespace fs = std::filesystem;
  if (!flags.model_dir.empty()) {
    std::string n =
        fs::path(flags.model_dir).lexically_normal().filename().string();
    if (n.empty())
      n = fs::path(flags.model_dir)
              .lexically_normal()
              .parent_path()
              .filename()
              .string();
    return flags.adapter.empty() ? n : n + "+adapter";
  }
  fs::path run(model_path(flags));
  if (fs::exists(run / "state.json"))
    run = run.parent_path().parent_path();
  run = run.lexically_normal();
  if (run.filename().empty())
    run = run.parent_path();
  return run.parent_path().filename().string() + "/" + run.filename().string();
}

// The stage the sources ask for (preset, then --config, then key=value;
// the later wins), so fine-tuning stages read their own keys. "" when none
// says; a source that does not parse is left for the real resolution to
// report.
std::string requested_stage(const ConfigFlags& f) {
  std::string stage;
  auto from_yaml = [&](const std::string& text) {
    try {
      YAML::Node n = YAML::Load(text);
      if (n.IsMap() && n["stage"] && n["stage"].IsScalar())
        stage = n["stage"].as<std::string>();
    } catch (const YAML::Exception&) {
    }
  };
  if (!f.preset.empty())
    if (auto text = config::preset_text(f.preset))
      from_yaml(*text);
  if (!f.config_file.empty()) {
    std::ifstream in(f.config_file);
    std::stringstream ss;
    ss << in.rdbuf();
    from_yaml(ss.str());
  }
  for (const auto& o : f.overrides)
    if (o.rfind("stage=", 0) == 0)
      stage = o.substr(6);
  return stage;
}

} // namespace orchard::cli
