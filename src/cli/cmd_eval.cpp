// `orchard eval env=wordle games=N --model DIR [--adapter DIR]`: plays whole
// Wordle games turn by turn against held-out secrets (the prompts of GRPO's
// env=wordle, the answer read from <guess>...</guess>) and reports the
// solve rate and the mean guesses of solved games.
#include "cli/common.h"
#include "core/error.h"
#include "infer/chat.h"
#include "stages/grpo/environment.h"

#include <cstdio>
#include <memory>
#include <set>

namespace orchard::cli {

Command register_eval(CLI::App& root) {
  struct State {
    DeviceFlags device;
    ModelFlags model;
    std::vector<std::string> settings;
    infer::SamplingOptions sampling;
  };
  auto st = std::make_shared<State>();
  st->sampling.temperature = 0;
  st->sampling.max_new_tokens = 256;
  CLI::App* app = root.add_subcommand(
      "eval", "Play an environment's task to the end: env=wordle games=N");
  add_model_flags(app, st->model);
  app->add_option(
      "settings",
      st->settings,
      "env=wordle (the environment), games=N (20), words=FILE (the word "
      "list), seed=S (42)");
  app->add_option(
         "--max-new-tokens", st->sampling.max_new_tokens, "tokens per turn")
      ->capture_default_str();
  app->add_option("--temperature", st->sampling.temperature, "0 = greedy")
      ->capture_default_str();
  add_sampling_extra_flags(app, st->sampling);
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {app, [st] {
            std::string env = "wordle", words;
            int64_t games = 20;
            uint64_t seed = 42;
            for (const auto& kv : st->settings) {
              const auto eq = kv.find('=');
              const std::string k = kv.substr(0, eq),
                                v = eq == std::string::npos ? "" : kv.substr(eq + 1);
              try {
                if (eq == std::string::npos)
                  throw UserError("");
                if (k == "env")
                  env = v;
                else if (k == "games")
                  games = std::stoll(v);
                else if (k == "words")
                  words = v;
                else if (k == "seed")
                  seed = std::stoull(v);
                else
                  throw UserError("");
              } catch (const std::exception&) {
                throw UserError(
                    "orchard eval: '" + kv +
                    "' is not a setting; give env=wordle, games=N, "
                    "words=FILE or seed=S.");
              }
            }
            if (env != "wordle")
              throw UserError(
                  "orchard eval plays env=wordle; the other environments are "
                  "scored on held-out prompts while training (eval_reward in "
                  "metrics.jsonl).");
            if (games < 1)
              throw UserError("games=" + std::to_string(games) +
                              ": play at least one game.");
            if (auto p = infer::sampling_problem(st->sampling); !p.empty())
              throw UserError(p);
            const auto list = grpo::read_words(
                words.empty() ? grpo::default_word_list() : words, 5);
            const std::set<std::string> lookup(list.begin(), list.end());
            std::vector<std::string> secrets;
            for (const auto& e : grpo::wordle::make_turns(list, games, seed, true))
              secrets.push_back(e.columns["secret"]);
            if (secrets.empty())
              throw UserError("the word list has too few words for games.");
            MachineFacts m = machine_for(st->device);
            DeviceInfo d = select_device(st->device, m);
            infer::ChatModel chat(open_model(st->model, d), d.device);
            int64_t solved = 0, guesses_when_solved = 0, invalid = 0;
            for (size_t g = 0; g < secrets.size(); ++g) {
              const std::string& secret = secrets[g];
              const grpo::wordle::Game game = grpo::wordle::play(
                  secret, lookup, [&](const grpo::Example& e, int turn) {
                    std::vector<text::Message> msgs;
                    for (const auto& x : e.messages)
                      msgs.push_back({x["role"], x["content"]});
                    infer::SamplingOptions so = st->sampling;
                    so.seed = seed + g * 7 + size_t(turn);
                    return chat.reply(msgs, so);
                  });
              const auto& guesses = game.guesses;
              const bool won = game.solved;
              invalid += game.lost_turns;
              if (won) {
                ++solved;
                guesses_when_solved += int64_t(guesses.size());
              }
              std::printf(
                  "game %zu/%zu: %s %s in %zu guess(es)\n",
                  g + 1,
                  secrets.size(),
                  secret.c_str(),
                  won ? "solved" : "not solved",
                  guesses.size());
              std::fflush(stdout);
            }
            const double n = double(secrets.size());
            std::printf(
                "Wordle: solved %lld of %zu games (%.1f %%), mean guesses when "
                "solved %s, %lld turn(s) lost to answers that were not a word "
                "in <guess>...</guess>.\n",
                (long long)solved,
                secrets.size(),
                100.0 * double(solved) / n,
                solved ? std::to_string(double(guesses_when_solved) / double(solved))
                             .substr(0, 4)
                             .c_str()
                       : "-",
                (long long)invalid);
            return 0;
          }};
}

} // namespace orchard::cli
