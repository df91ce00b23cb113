// `orchard chat`: talk to a chat model in the terminal. A multi-turn REPL
// with line editing and history (libedit) when the input is a terminal;
// plain lines otherwise (pipes, tests). Replies stream as they are made.
#include "cli/common.h"
#include "core/error.h"
#include "infer/chat.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

#ifdef ORCHARD_WITH_LIBEDIT
#include <editline/readline.h>
#endif

namespace orchard::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) {
  g_interrupted = 1;
}

// Ctrl-C while waiting for input ends the chat as Ctrl-D does (there is
// nothing to save); during a reply it stops the reply.
extern "C" void on_sigint_at_prompt(int) {
  const char newline = '\n';
  [[maybe_unused]] auto n = ::write(STDOUT_FILENO, &newline, 1);
  ::_exit(0);
}

struct PromptSignals {
  void (*previous)(int);
  PromptSignals() : previous(std::signal(SIGINT, on_sigint_at_prompt)) {}
  ~PromptSignals() {
    std::signal(SIGINT, previous);
  }
};

// One line of input; false at the end of input (Ctrl-D).
bool read_line(const char* prompt, std::string& line) {
  PromptSignals ctrl_c_ends_the_chat;
#ifdef ORCHARD_WITH_LIBEDIT
  if (isatty(STDIN_FILENO)) {
    char* s = readline(prompt);
    if (!s)
      return false;
    line = s;
    std::free(s);
    if (!line.empty())
      add_history(line.c_str());
    return true;
  }
#endif
  if (isatty(STDIN_FILENO)) {
    std::printf("%s", prompt);
    std::fflush(stdout);
  }
  return bool(std::getline(std::cin, line));
}

const char* kHelp =
    "Commands: /clear (new chat), /system TEXT (set the system message and "
    "start over), /exit (or Ctrl-D). Ctrl-C stops a reply.\n";

} // namespace

Command register_chat(CLI::App& root) {
  struct State {
    DeviceFlags device;
    ModelFlags model;
    std::string prompt, system;
    infer::SamplingOptions sampling;
    bool verbose = false;
  };
  auto st = std::make_shared<State>();
  st->sampling.max_new_tokens = 256;
  st->sampling.temperature = 0.7;
  CLI::App* app =
      root.add_subcommand("chat", "Chat with a trained model in the terminal");
  add_model_flags(app, st->model);
  add_chat_template_flag(app, st->model);
  CLI::Option* prompt_opt = app->add_option(
      "-p,--prompt",
      st->prompt,
      "answer this once and exit (only the answer goes to stdout)");
  app->add_option("--system", st->system, "system message");
  app->add_option("--temperature", st->sampling.temperature, "0 = greedy")
      ->capture_default_str();
  app->add_option("--top-k", st->sampling.top_k, "0: all tokens")
      ->capture_default_str();
  app->add_option("--top-p", st->sampling.top_p, "nucleus sampling")
      ->capture_default_str();
  app->add_option(
         "--max-new-tokens",
         st->sampling.max_new_tokens,
         "longest reply in tokens")
      ->capture_default_str();
  app->add_option("--seed", st->sampling.seed, "random seed")
      ->capture_default_str();
  add_sampling_extra_flags(app, st->sampling);
  app->add_flag(
      "--verbose",
      st->verbose,
      "after each reply, print its speed (prompt and generation tokens/s) "
      "on stderr");
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {app, [st, prompt_opt] {
            if (auto p = infer::sampling_problem(st->sampling); !p.empty())
              throw UserError(p);
            const bool one_shot = prompt_opt->count() > 0;
            if (one_shot &&
                st->prompt.find_first_not_of(" \t\r\n") == std::string::npos)
              throw UserError(
                  "-p/--prompt is empty; give the question to answer, or "
                  "leave -p out to chat interactively.");
            if (one_shot)
              status_to_stderr(); // the answer alone on stdout
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = select_device(st->device, m);
            runs::LoadedModel loaded = open_model(st->model, d);
            infer::ChatModel chat(loaded, d.device);
            std::vector<text::Message> messages;
            std::string system = st->system;
            auto restart = [&] {
              messages.clear();
              if (!system.empty())
                messages.push_back({"system", system});
            };
            restart();
            int64_t turn = 0;
            // Returns false when the reply could not be made (too long).
            auto answer = [&](const std::string& user) {
              messages.push_back({"user", user});
              infer::SamplingOptions opt = st->sampling;
              opt.seed = st->sampling.seed + uint64_t(turn++);
              g_interrupted = 0;
              auto previous = std::signal(SIGINT, on_sigint);
              std::string reply;
              infer::GenerationStats stats;
              try {
                reply = chat.reply(
                    messages,
                    opt,
                    [](const std::string& text) {
                      std::fwrite(text.data(), 1, text.size(), stdout);
                      std::fflush(stdout);
                      return g_interrupted == 0;
                    },
                    &stats);
              } catch (const UserError& e) {
                std::signal(SIGINT, previous);
                messages.pop_back();
                std::fprintf(stderr, "%s\n", e.what());
                return false;
              }
              std::signal(SIGINT, previous);
              std::printf("%s\n", g_interrupted ? " [stopped]" : "");
              if (st->verbose)
                std::fprintf(
                    stderr,
                    "[prompt %lld tokens at %.0f tokens/s; reply %lld tokens "
                    "at %.1f tokens/s]\n",
                    (long long)stats.prompt_tokens,
                    stats.prefill_tokens_per_s(),
                    (long long)stats.new_tokens,
                    stats.decode_tokens_per_s());
              messages.push_back({"assistant", reply});
              return true;
            };
            if (one_shot)
              return answer(st->prompt) ? 0 : 1;
            std::printf("%s", kHelp);
            std::string line;
            while (read_line("you> ", line)) {
              if (line.empty())
                continue;
              if (line == "/exit" || line == "/quit")
                break;
              if (line == "/help") {
                std::printf("%s", kHelp);
              } else if (line == "/clear") {
                restart();
                std::printf("(new chat)\n");
              } else if (line == "/system" || line.rfind("/system ", 0) == 0) {
                system = line.size() > 8 ? line.substr(8) : "";
                restart();
                std::printf(
                    system.empty() ? "(system message removed; new chat)\n"
                                   : "(system message set; new chat)\n");
              } else if (line[0] == '/') {
                std::printf("Unknown command %s. %s", line.c_str(), kHelp);
              } else {
                std::printf("orchard> ");
                std::fflush(stdout);
                answer(line);
              }
            }
            std::printf("\n");
            return 0;
          }};
}

} // namespace orchard::cli
