#include "cli/common.h"

#include "core/error.h"
#include "dist/world.h"
#include "stages/trm/recursion.h"

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

namespace {
std::FILE* g_status = nullptr; // nullptr: stdout
} // namespace

void status_to_stderr() {
  g_status = stderr;
}

std::FILE* status_stream() {
  return g_status ? g_status : stdout;
}

DeviceInfo select_device(
    const DeviceFlags& flags,
    const MachineFacts& machine,
    bool trains,
    const EnvLookup& env) {
  DeviceInfo d = resolve_device(flags.device, machine);
  if (auto ws = env("WORLD_SIZE")) {
    char* end = nullptr;
    long n = std::strtol(ws->c_str(), &end, 10);
    if (ws->empty() || *end != '\0' || n < 1)
      throw UserError(
          "WORLD_SIZE='" + *ws +
          "' is not a process count; set it to 1 or more, or unset it.");
  }
  // Training reads the rest of the launch: of several processes, rank 0
  // alone prints from here on.
  const dist::LaunchEnv launch =
      trains ? dist::read_launch_env(env) : dist::LaunchEnv{};
  if (launch.rank == 0) {
    std::fprintf(status_stream(), "%s\n", using_device_line(d).c_str());
    for (const auto& note : platform_notes(machine))
      std::fprintf(status_stream(), "%s\n", note.c_str());
  }
  if (!trains)
    return d;
  // Several processes (torchrun, `orchard launch`, Slurm): one GPU each,
  // then the process group.
  if (!launch.multi())
    return d;
  check_distributed_supported(d, launch.world);
  d = device_of_local_rank(d, machine, launch.local_rank);
  if (launch.rank == 0)
    std::fprintf(
        status_stream(),
        "Waiting for all %d processes at %s:%d...\n",
        launch.world,
        launch.master_addr.c_str(),
        launch.master_port);
  std::fflush(status_stream());
  dist::init(launch, d.device);
  std::fprintf(
      status_stream(),
      "Distributed: %s, %s; rank 0 alone prints and writes.\n",
      launch.describe().c_str(),
      dist::backend_for(d.kind).second.c_str());
  std::fflush(status_stream());
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
      "the model of a stage: base, mid, sft or rl (its newest run)");
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
  app->add_option(
      "--dtype",
      flags.dtype,
      "with --model: auto (bfloat16 on CUDA from Ampere on, float32 "
      "elsewhere), float32, bfloat16 or float16; on a CPU bfloat16 decodes "
      "about twice as fast as float32, with bfloat16's rounding");
}

void add_chat_template_flag(CLI::App* app, ModelFlags& flags) {
  app->add_option(
         "--chat-template",
         flags.chat_template,
         "llama3|chatml|mistral|orchard|plain: a built-in chat template instead of "
         "the model folder's own")
      ->check(
          CLI::IsMember({"llama3", "chatml", "mistral", "orchard", "plain"}));
}

void add_sampling_extra_flags(CLI::App* app, infer::SamplingOptions& opt) {
  app->add_option(
         "--min-p",
         opt.min_p,
         "drop tokens less likely than this times the likeliest (0: off)")
      ->capture_default_str();
  app->add_option(
         "--repetition-penalty",
         opt.repetition_penalty,
         "divide the logits of tokens already in the text (1: off)")
      ->capture_default_str();
  app->add_option(
         "--sampling-device",
         opt.sampling_device,
         "where tokens are drawn: auto (the model's device), cpu (the same "
         "text on every device for a seed) or device")
      ->capture_default_str();
}

runs::LoadedModel open_model(const ModelFlags& flags, const DeviceInfo& d) {
  runs::asked_dtype(flags, d); // a bad --dtype before the model is looked for
  // A tiny recursive model trained on chat data decodes without a cache.
  const bool trm = flags.model_dir.empty() &&
      trm::is_trm_checkpoint(runs::model_path(flags));
  runs::LoadedModel loaded = trm
      ? trm::load_trm_chat(runs::model_path(flags), d.device)
      : runs::load_model(flags, d);
  std::fprintf(status_stream(), "Model: %s\n", loaded.description.c_str());
  if (!flags.model_dir.empty() && d.kind == "cpu" &&
      (flags.dtype.empty() || flags.dtype == "auto"))
    std::fprintf(
        status_stream(),
        "Decoding in float32 on the CPU; --dtype bfloat16 is about twice as "
        "fast (bfloat16's rounding, not float32's).\n");
  return loaded;
}

} // namespace orchard::cli
