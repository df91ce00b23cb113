// `orchard eval env=wordle games=N --model DIR [--adapter DIR]`: plays whole
// Wordle games turn by turn against held-out secrets (the prompts of GRPO's
// env=wordle, the answer read from <guess>...</guess>) and reports the
// solve rate and the mean guesses of solved games.
// `orchard eval --checkpoint RUN [data=DIR|FILE] [puzzles=N] [--json]` with a
// tiny recursive model (stage=trm): exact, cell and Q-halt accuracy on the
// held-out puzzles (the run's own, or data=), and exact accuracy after
// each supervision step.
#include "cli/common.h"
#include "core/error.h"
#include "core/progress.h"
#include "infer/chat.h"
#include "stages/grpo/environment.h"
#include "stages/trm/recursion.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <set>

namespace orchard::cli {
namespace {

int eval_trm(
    const std::string& checkpoint,
    const std::vector<std::string>& settings,
    const DeviceFlags& device,
    bool json) {
  std::string data;
  int64_t puzzles = 0; // 0: all held out
  for (const auto& kv : settings) {
    const auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (k == "data" && !v.empty())
      data = v;
    else if (
        k == "puzzles" && !v.empty() &&
        v.find_first_not_of("0123456789") == std::string::npos)
      puzzles = std::stoll(v);
    else
      throw UserError(
          "orchard eval: '" + kv +
          "' is not a setting of a tiny recursive model's evaluation; give "
          "data=DIR|FILE (default: the run's held-out puzzles) or "
          "puzzles=N.");
  }
  MachineFacts m = machine_for(device);
  DeviceInfo d = select_device(device, m);
  trm::TrainedTrm t = trm::load_trm(checkpoint, d.device);
  if (data.empty())
    data = t.data;
  const data::PuzzleSplits splits = data::load_puzzle_splits(data);
  const auto& test = splits.test;
  if (test.seq_len() != t.model->config.seq_len ||
      test.vocab > t.model->config.vocab_size)
    throw UserError(
        "data=" + data + " holds puzzles of " + std::to_string(test.seq_len()) +
        " cells; the model at " + t.checkpoint_dir + " was trained on " +
        std::to_string(t.model->config.seq_len) + ".");
  const int64_t n = puzzles > 0 ? std::min(puzzles, test.size()) : test.size();
  torch::NoGradGuard no_grad;
  const trm::EvalStats s = trm::evaluate(t.model, test, n, 256, d.device);
  if (json) {
    auto j = s.to_json();
    j["checkpoint"] = t.checkpoint_dir;
    j["weights"] = t.ema ? "ema" : "raw";
    j["data"] = data;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::string by_step;
  for (size_t k = 0; k < s.exact_by_step.size(); ++k)
    by_step += (k ? ", " : "") + fmt("%.1f", 100 * s.exact_by_step[k]);
  std::printf(
      "%s (%s weights) on %lld held-out puzzles of %s:\n"
      "  exact accuracy %.1f %%, cell accuracy %.1f %%, Q-halt accuracy "
      "%.1f %%\n  exact accuracy after supervision step 1..%zu: %s %%\n",
      t.checkpoint_dir.c_str(),
      t.ema ? "EMA" : "raw",
      (long long)s.puzzles,
      data.c_str(),
      100 * s.exact,
      100 * s.cells,
      100 * s.q_halt_accuracy,
      s.exact_by_step.size(),
      by_step.c_str());
  return 0;
}

} // namespace

Command register_eval(CLI::App& root) {
  struct State {
    DeviceFlags device;
    ModelFlags model;
    std::vector<std::string> settings;
    infer::SamplingOptions sampling;
    bool json = false;
  };
  auto st = std::make_shared<State>();
  st->sampling.temperature = 0;
  st->sampling.max_new_tokens = 256;
  CLI::App* app = root.add_subcommand(
      "eval",
      "Play an environment's task to the end (env=wordle games=N), or score a tiny recursive model on held-out puzzles");
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
  app->add_flag("--json", st->json, "stage=trm: the metrics as JSON");
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        if (!st->model.checkpoint.empty() &&
            trm::is_trm_checkpoint(st->model.checkpoint))
          return eval_trm(
              st->model.checkpoint, st->settings, st->device, st->json);
        std::string env = "wordle", words;
        int64_t games = 20;
        uint64_t seed = 42;
        for (const auto& kv : st->settings) {
          const auto eq = kv.find('=');
          const std::string k = kv.substr(0, eq),
                            v = eq == std::string::npos ? ""
                                                        : kv.substr(eq + 1);
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
          throw UserError(
              "games=" + std::to_string(games) + ": play at least one game.");
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
            solved
                ? std::to_string(double(guesses_when_solved) / double(solved))
                      .substr(0, 4)
                      .c_str()
                : "-",
            (long long)invalid);
        return 0;
      }};
}

} // namespace orchard::cli
