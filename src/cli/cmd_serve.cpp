// `orchard serve`: the web chat page and an OpenAI-compatible API.
#include "cli/common.h"
#include "core/error.h"
#include "infer/chat.h"
#include "serve/server.h"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace orchard::cli {
namespace {
serve::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server)
    g_server->stop();
}
} // namespace

Command register_serve(CLI::App& root) {
  struct State {
    DeviceFlags device;
    ModelFlags model;
    serve::ServeOptions options;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "serve", "Web chat page and OpenAI-compatible API for a chat model");
  add_model_flags(app, st->model);
  add_chat_template_flag(app, st->model);
  auto& o = st->options;
  app->add_option("--host", o.host, "address to listen on")
      ->capture_default_str();
  app->add_option("--port", o.port, "port (0: any free one)")
      ->capture_default_str();
  app->add_option(
      "--api-key",
      o.api_key,
      "require 'Authorization: Bearer KEY' on /v1 requests");
  app->add_option("--max-batch", o.max_batch, "requests decoded together")
      ->capture_default_str();
  app->add_option(
         "--max-tokens-limit",
         o.max_tokens_limit,
         "largest max_tokens accepted")
      ->capture_default_str();
  app->add_option(
         "--max-messages", o.max_messages, "messages per request at most")
      ->capture_default_str();
  app->add_option(
         "--max-message-chars",
         o.max_message_chars,
         "characters per message at most")
      ->capture_default_str();
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        auto& o = st->options;
        if (o.max_batch < 1 || o.max_tokens_limit < 1 || o.max_messages < 1 ||
            o.max_message_chars < 1 || o.port < 0 || o.port > 65535)
          throw UserError(
              "--max-batch, --max-tokens-limit, --max-messages and "
              "--max-message-chars must be at least 1, and --port in 0..65535.");
        MachineFacts m = machine_for(st->device);
        DeviceInfo d = select_device(st->device, m);
        runs::LoadedModel loaded = open_model(st->model, d);
        if (!loaded.model->supports_kv_cache())
          throw UserError(
              loaded.checkpoint_dir +
              " is a tiny recursive model, which decodes one sequence at a "
              "time without a cache; orchard serve batches requests with "
              "one. Talk to it with `orchard chat --checkpoint " +
              loaded.checkpoint_dir + "`.");
        infer::ChatModel chat(loaded, d.device);
        // The model's id: the run's name and stage (runs/sft/d4 -> sft/d4).
        o.model_name = loaded.name;
        serve::Server server(chat, o);
        const int port = server.bind();
        std::printf(
            "Serving %s on http://%s:%d  (chat page: /, API: /v1/chat/completions, "
            "/v1/completions, /v1/models, /health)%s\nCtrl-C stops.\n",
            o.model_name.c_str(),
            o.host.c_str(),
            port,
            o.api_key.empty() ? "" : "; API key required");
        if (o.host != "127.0.0.1" && o.host != "localhost" && o.api_key.empty())
          std::printf(
              "Warning: listening on %s without --api-key: anyone who can "
              "reach this machine can use the model.\n",
              o.host.c_str());
        std::fflush(stdout);
        g_server = &server;
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        server.run();
        g_server = nullptr;
        std::printf("Stopped.\n");
        return 0;
      }};
}

} // namespace orchard::cli
