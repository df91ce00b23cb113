// `orchard generate`: sample text from a trained model.
#include "cli/common.h"
#include "core/error.h"
#include "infer/engine.h"
#include "text/tokenizer_io.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

namespace orchard::cli {

Command register_generate(CLI::App& root) {
  struct State {
    DeviceFlags device;
    ModelFlags model;
    std::string prompt;
    infer::SamplingOptions sampling;
    bool interactive = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* app =
      root.add_subcommand("generate", "Generate text from a trained model");
  add_model_flags(app, st->model);
  app->add_option("--prompt", st->prompt, "text to continue");
  app->add_option(
         "--max-new-tokens", st->sampling.max_new_tokens, "tokens to generate")
      ->capture_default_str();
  app->add_option("--temperature", st->sampling.temperature, "0 = greedy")
      ->capture_default_str();
  app->add_option(
         "--top-k",
         st->sampling.top_k,
         "sample from the k likeliest tokens (0: all)")
      ->capture_default_str();
  app->add_option(
         "--top-p",
         st->sampling.top_p,
         "sample from the smallest set holding this probability")
      ->capture_default_str();
  app->add_option("--seed", st->sampling.seed, "random seed")
      ->capture_default_str();
  add_sampling_extra_flags(app, st->sampling);
  app->add_flag(
      "--interactive",
      st->interactive,
      "read prompts from standard input, one per line");
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        if (!st->interactive && st->prompt.empty())
          throw UserError(
              "give --prompt TEXT, or --interactive to type prompts.");
        if (auto p = infer::sampling_problem(st->sampling); !p.empty())
          throw UserError(p);
        MachineFacts m = machine_for(st->device);
        DeviceInfo d = select_device(st->device, m);
        runs::LoadedModel loaded = open_model(st->model, d);
        const text::Tokenizer& tok = *loaded.tokenizer;
        infer::Engine engine(loaded.model, d.device);
        auto bos = tok.document_start();
        infer::SamplingOptions opt = st->sampling;
        if (bos)
          opt.stop_tokens.push_back(*bos);
        for (auto id : tok.document_ends())
          opt.stop_tokens.push_back(id);
        auto run = [&](const std::string& prompt) {
          std::vector<int64_t> ids;
          if (bos)
            ids.push_back(*bos);
          for (auto id : tok.encode(prompt))
            ids.push_back(id);
          std::printf("%s", prompt.c_str());
          std::fflush(stdout);
          infer::GenerationStats stats;
          engine.generate(
              ids,
              opt,
              [&](int64_t id) {
                if (std::find(
                        opt.stop_tokens.begin(), opt.stop_tokens.end(), id) !=
                    opt.stop_tokens.end())
                  return false;
                std::string piece;
                tok.token_bytes(text::TokenId(id), piece);
                std::fwrite(piece.data(), 1, piece.size(), stdout);
                std::fflush(stdout);
                return true;
              },
              true,
              &stats);
          std::printf(
              "\n[%lld tokens; prompt %lld tokens at %.0f tokens/s, "
              "generation %.1f tokens/s]\n",
              (long long)stats.new_tokens,
              (long long)stats.prompt_tokens,
              stats.prefill_tokens_per_s(),
              stats.decode_tokens_per_s());
        };
        if (!st->prompt.empty())
          run(st->prompt);
        if (st->interactive) {
          std::string line;
          while (std::printf("> "),
                 std::fflush(stdout),
                 std::getline(std::cin, line))
            if (!line.empty())
              run(line);
          std::printf("\n");
        }
        return 0;
      }};
}

} // namespace orchard::cli
