// `orchard train`: pretrain a GPT. With no arguments: the default model on
// the default corpus (WordNet), on the best device.
#include "cli/common.h"
#include "infer/engine.h"
#include "train/pretrain.h"

#include <cstdio>

#include <memory>

namespace orchard::cli {

Command register_train(CLI::App& root) {
  struct State {
    ConfigFlags config;
    DeviceFlags device;
    PretrainConfig defaults;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "train",
      "Pretrain a GPT (default: on WordNet); resumes from the run's checkpoints");
  add_config_flags(app, st->config, pretrain_schema(), &st->defaults);
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        PretrainConfig cfg;
        auto origins =
            config::resolve(pretrain_schema(), &cfg, sources_of(st->config));
        MachineFacts m = machine_for(st->device);
        DeviceInfo d = select_device(st->device, m);
        // Samples during training (sample_every): continuations of two
        // held-out documents with the weights evaluation uses.
        auto sample_hook = [&cfg](
                               const models::Gpt& model,
                               const std::string& tokenizer_dir,
                               const std::vector<std::string>& val_shards,
                               int64_t step) {
          infer::LoadedModel loaded;
          loaded.model = model;
          loaded.tokenizer_dir = tokenizer_dir;
          infer::SamplingOptions opt;
          opt.max_new_tokens = 24;
          opt.temperature = 0.7;
          opt.seed = uint64_t(cfg.seed);
          std::printf("Samples at step %lld:\n", (long long)step);
          for (const auto& [prompt, text] : infer::sample_validation_documents(
                   loaded, val_shards, 2, 6, opt))
            std::printf("  [%s]%s\n", prompt.c_str(), text.c_str());
          std::fflush(stdout);
        };
        auto result = train::run_pretraining(cfg, origins, d, sample_hook);
        if (result.interrupted)
          return 0;
        // A few continuations of held-out documents.
        infer::LoadedModel model = infer::load_trained_model(result.run_dir);
        infer::SamplingOptions opt;
        opt.max_new_tokens = 32;
        opt.temperature = 0.7;
        opt.seed = uint64_t(cfg.seed);
        std::printf("\nSamples (held-out text; the prompt in [brackets]):\n");
        for (const auto& [prompt, text] : infer::sample_validation_documents(
                 model, result.val_shards, 3, 6, opt))
          std::printf("  [%s]%s\n", prompt.c_str(), text.c_str());
        std::printf(
            "\nGenerate more: orchard generate --checkpoint %s --prompt \"...\"\n",
            result.run_dir.c_str());
        return 0;
      }};
}

} // namespace orchard::cli
