// `orchard solve --checkpoint RUN --puzzle "53..7...." | --input FILE`: a
// trained tiny recursive model (stage=trm) answers Sudoku; prints the grid,
// the supervision steps it took, and whether the answer keeps the rules
// and the givens.
#include "cli/common.h"
#include "core/error.h"
#include "data/puzzles.h"
#include "stages/trm/recursion.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>

namespace orchard::cli {

Command register_solve(CLI::App& root) {
  struct State {
    DeviceFlags device;
    std::string checkpoint, puzzle, input;
    bool json = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "solve", "Solve Sudoku with a tiny recursive model (stage=trm)");
  app->add_option(
         "--checkpoint", st->checkpoint, "a stage=trm run or checkpoint folder")
      ->required();
  app->add_option(
      "--puzzle",
      st->puzzle,
      "the grid in one line, row by row, '.' or '0' for a blank");
  app->add_option(
      "--input",
      st->input,
      "a file of puzzles: one grid a line, or Sudoku-Extreme's CSV");
  app->add_flag("--json", st->json, "one JSON object per puzzle");
  add_device_flags(app, st->device, /*allow_assume=*/false);
  return {
      app, [st] {
        if (st->puzzle.empty() == st->input.empty())
          throw UserError(
              "orchard solve takes --puzzle \"53..7....\" or --input FILE "
              "(one of them).");
        MachineFacts m = machine_for(st->device);
        DeviceInfo d = select_device(st->device, m);
        trm::TrainedTrm t = trm::load_trm(st->checkpoint, d.device);
        const auto& puzzles = t.state.value("puzzles", nlohmann::json());
        if (puzzles.value("kind", "") != "sudoku")
          throw UserError(
              t.checkpoint_dir + " was trained on " +
              puzzles.value("kind", std::string("other puzzles")) +
              ", not Sudoku; `orchard eval --checkpoint` scores it on its "
              "held-out set.");
        const auto shape =
            data::sudoku::shape_for_cells(t.model->config.seq_len);
        // The puzzles: lines of one grid each (a CSV's question column).
        std::vector<std::string> lines;
        std::vector<std::string> where;
        if (!st->puzzle.empty()) {
          lines.push_back(st->puzzle);
          where.push_back("--puzzle");
        } else {
          std::ifstream in(st->input);
          if (!in)
            throw UserError("cannot read " + st->input + ".");
          std::string line;
          for (int64_t n = 1; std::getline(in, line); ++n) {
            if (line.find_first_not_of(" \t\r") == std::string::npos ||
                line.rfind("source,", 0) == 0)
              continue;
            const auto c1 = line.find(',');
            if (c1 != std::string::npos) {
              const auto c2 = line.find(',', c1 + 1);
              line = line.substr(c1 + 1, c2 - c1 - 1);
            }
            lines.push_back(line);
            where.push_back(st->input + ":" + std::to_string(n));
          }
        }
        std::vector<data::sudoku::Grid> grids;
        std::vector<int64_t> tokens;
        for (size_t i = 0; i < lines.size(); ++i) {
          std::string err;
          auto g = data::sudoku::from_text(lines[i], shape, &err);
          if (g.empty())
            throw UserError(
                where[i] + ": " + err + "; this model solves " +
                std::to_string(shape.n) + "x" + std::to_string(shape.n) +
                " Sudoku, given row by row with '.' for a blank.");
          if (auto why = data::sudoku::rule_broken(shape, g); !why.empty())
            throw UserError(
                where[i] + ": the puzzle itself breaks a rule: " + why + ".");
          for (int64_t tk : data::sudoku_tokens(g))
            tokens.push_back(tk);
          grids.push_back(std::move(g));
        }
        const int64_t n = int64_t(grids.size());
        const auto inputs =
            torch::tensor(tokens, torch::kLong).view({n, shape.cells()});
        torch::NoGradGuard no_grad;
        const auto sols = trm::solve(
            t.model, inputs, torch::zeros({n}, torch::kLong), d.device);
        int64_t valid = 0;
        for (int64_t i = 0; i < n; ++i) {
          const auto& s = sols[size_t(i)];
          auto answer =
              data::sudoku_from_tokens(s.tokens.data(), shape.cells());
          std::string problem = data::sudoku::rule_broken(shape, answer);
          for (size_t c = 0; c < answer.size() && problem.empty(); ++c)
            if (answer[c] == 0)
              problem = "cell (" + std::to_string(c / size_t(shape.n) + 1) +
                  ", " + std::to_string(c % size_t(shape.n) + 1) +
                  ") is left blank";
            else if (grids[size_t(i)][c] && grids[size_t(i)][c] != answer[c])
              problem = "it changes the given " +
                  std::to_string(grids[size_t(i)][c]) + " at (" +
                  std::to_string(c / size_t(shape.n) + 1) + ", " +
                  std::to_string(c % size_t(shape.n) + 1) + ")";
          valid += problem.empty();
          if (st->json) {
            std::printf(
                "%s\n",
                nlohmann::json{
                    {"puzzle", data::sudoku::to_text(grids[size_t(i)])},
                    {"answer", data::sudoku::to_text(answer)},
                    {"steps", s.steps},
                    {"halted_by_q", s.halted_by_q},
                    {"valid", problem.empty()},
                    {"problem", problem}}
                    .dump()
                    .c_str());
            continue;
          }
          std::printf(
              "%s%s\nSolved in %lld supervision step(s)%s. %s\n",
              n > 1 ? (where[size_t(i)] + "\n").c_str() : "",
              data::sudoku::pretty(shape, answer).c_str(),
              (long long)s.steps,
              s.halted_by_q ? " (the model chose to stop)"
                            : " (the most it may take)",
              problem.empty()
                  ? "The answer keeps every rule and every given."
                  : ("The answer breaks a rule: " + problem + ".").c_str());
        }
        if (!st->json && n > 1)
          std::printf(
              "%lld of %lld answers keep every rule and given.\n",
              (long long)valid,
              (long long)n);
        return 0;
      }};
}

} // namespace orchard::cli
