// orchard: one binary for the whole path, tokenizer to chat. This file only
// dispatches to the subcommands; each lives in its own cmd_*.cpp.
#include "cli/common.h"
#include "core/blas_kernels.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/version.h"
#include "dist/world.h"

#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {
int run(int argc, char** argv);
}

// With several processes, the process group is taken down here, while CUDA
// is still up (dist::finish); left to static destruction, NCCL's
// destructor aborts the process after a successful run.
int main(int argc, char** argv) {
  orchard::use_fast_blas_kernels(argv); // may start the program again
  return orchard::dist::finish(run(argc, argv));
}

namespace {

int run(int argc, char** argv) {
  using namespace orchard;
  set_program_name(argc > 0 ? argv[0] : nullptr);
  // Output piped to a program that has gone (`| tee` closed with the
  // terminal, `| head`) fails to print rather than killing a run that
  // holds unsaved work: training goes on, and writes its log file too.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "Orchard trains and fine-tunes language models on the machine you have "
      "(CUDA, Apple Silicon, or CPU)."};
  app.set_version_flag("--version", orchard_version());
  app.require_subcommand(1);
  std::vector<cli::Command> commands = {
      cli::register_doctor(app),
      cli::register_config(app),
      cli::register_tokenizer(app),
      cli::register_data(app),
      cli::register_train(app),
      cli::register_generate(app),
      cli::register_plan(app),
      cli::register_pipeline(app),
      cli::register_chat(app),
      cli::register_serve(app),
      cli::register_lora(app),
      cli::register_eval(app),
      cli::register_solve(app),
      cli::register_launch(app),
      cli::register_export(app),
  };
  try {
    configure_allocator();
    configure_cpu_threads();
    std::vector<std::string> args(argv, argv + argc);
    cli::separate_launched_command(app, args);
    std::vector<char*> words;
    for (auto& a : args)
      words.push_back(a.data());
    app.parse(int(words.size()), words.data());
    for (auto& c : commands)
      if (c.app->parsed())
        return c.run();
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const UserError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(
        stderr,
        "internal error: %s\nThis is a bug in Orchard; please report it with "
        "the command you ran.\n",
        e.what());
    return kExitFailure;
  }
  return kExitUsage;
}

} // namespace
