// `orchard solve --checkpoint RUN --puzzle "53..7...." | --input FILE`: a
// trained tiny recursive model (stage=trm) answers Sudoku or mazes; prints
// the grid, the supervision steps it took, and whether the answer keeps
// the rules and the givens (Sudoku) or is the shortest path (mazes).
#include "cli/common.h"
#include "core/error.h"
#include "data/puzzles.h"
#include "stages/trm/recursion.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>

namespace orchard::cli {
namespace {

// The puzzles given: one a line (a CSV's question column), and for mazes
// also drawn as `side` lines of `side` characters.
struct Given {
  std::vector<std::string> lines, where;
};

Given read_given(
    const std::string& puzzle,
    const std::string& input,
    int drawn_side) {
  Given g;
  if (!puzzle.empty()) {
    g.lines.push_back(puzzle);
    g.where.push_back("--puzzle");
    return g;
  }
  std::ifstream in(input);
  if (!in)
    throw UserError("cannot read " + input + ".");
  std::string line, drawing, drawing_at;
  int rows = 0;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos ||
        line.rfind("source,", 0) == 0)
      continue;
    const auto c1 = line.find(',');
    if (c1 != std::string::npos) {
      const auto c2 = line.find(',', c1 + 1);
      line = line.substr(c1 + 1, c2 - c1 - 1);
    }
    if (drawn_side > 0 && int(line.size()) == drawn_side) {
      if (rows++ == 0)
        drawing_at = input + ":" + std::to_string(n);
      drawing += line;
      if (rows == drawn_side) {
        g.lines.push_back(drawing);
        g.where.push_back(drawing_at);
        drawing.clear();
        rows = 0;
      }
      continue;
    }
    g.lines.push_back(line);
    g.where.push_back(input + ":" + std::to_string(n));
  }
  if (rows > 0)
    throw UserError(
        drawing_at + ": a maze drawn in " + std::to_string(rows) +
        " rows where this model's have " + std::to_string(drawn_side) + ".");
  if (g.lines.empty())
    throw UserError(input + " holds no puzzles.");
  return g;
}

// The model's answers to `count` puzzles of `cells` tokens each.
std::vector<trm::Solution> run_model(
    trm::TrainedTrm& t,
    const std::vector<int64_t>& tokens,
    int64_t count,
    torch::Device device) {
  const auto inputs = torch::tensor(tokens, torch::kLong)
                          .view({count, t.model->config.seq_len});
  torch::NoGradGuard no_grad;
  return trm::solve(
      t.model, inputs, torch::zeros({count}, torch::kLong), device);
}

// One answer as printed: the texts, the drawing, what is wrong ("" when
// nothing) and the verdict line.
struct Answer {
  std::string puzzle, answer, drawn, problem, verdict;
  nlohmann::json extra; // more JSON fields
};

int print_answers(
    const Given& given,
    const std::vector<trm::Solution>& sols,
    const std::vector<Answer>& answers,
    bool json,
    const char* all_right) {
  const size_t n = answers.size();
  int64_t right = 0;
  for (size_t i = 0; i < n; ++i) {
    const Answer& a = answers[i];
    right += a.problem.empty();
    if (json) {
      nlohmann::json j = {
          {"puzzle", a.puzzle},
          {"answer", a.answer},
          {"steps", sols[i].steps},
          {"halted_by_q", sols[i].halted_by_q},
          {"valid", a.problem.empty()},
          {"problem", a.problem}};
      j.update(a.extra);
      std::printf("%s\n", j.dump().c_str());
      continue;
    }
    std::printf(
        "%s%s\nSolved in %lld supervision step(s)%s. %s\n",
        n > 1 ? (given.where[i] + "\n").c_str() : "",
        a.drawn.c_str(),
        (long long)sols[i].steps,
        sols[i].halted_by_q ? " (the model chose to stop)"
                            : " (the most it may take)",
        a.verdict.c_str());
  }
  if (!json && n > 1)
    std::printf(
        "%lld of %lld answers %s.\n",
        (long long)right,
        (long long)n,
        all_right);
  return 0;
}

int solve_sudoku(
    trm::TrainedTrm& t,
    const Given& given,
    torch::Device device,
    bool json) {
  const auto shape = data::sudoku::shape_for_cells(t.model->config.seq_len);
  std::vector<data::sudoku::Grid> grids;
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < given.lines.size(); ++i) {
    std::string err;
    auto g = data::sudoku::from_text(given.lines[i], shape, &err);
    if (g.empty())
      throw UserError(
          given.where[i] + ": " + err + "; this model solves " +
          std::to_string(shape.n) + "x" + std::to_string(shape.n) +
          " Sudoku, given row by row with '.' for a blank.");
    if (auto why = data::sudoku::rule_broken(shape, g); !why.empty())
      throw UserError(
          given.where[i] + ": the puzzle itself breaks a rule: " + why + ".");
    for (int64_t tk : data::sudoku_tokens(g))
      tokens.push_back(tk);
    grids.push_back(std::move(g));
  }
  const auto sols = run_model(t, tokens, int64_t(grids.size()), device);
  std::vector<Answer> answers;
  for (size_t i = 0; i < grids.size(); ++i) {
    auto answer =
        data::sudoku_from_tokens(sols[i].tokens.data(), shape.cells());
    std::string problem = data::sudoku::rule_broken(shape, answer);
    for (size_t c = 0; c < answer.size() && problem.empty(); ++c)
      if (answer[c] == 0)
        problem = "cell (" + std::to_string(c / size_t(shape.n) + 1) + ", " +
            std::to_string(c % size_t(shape.n) + 1) + ") is left blank";
      else if (grids[i][c] && grids[i][c] != answer[c])
        problem = "it changes the given " + std::to_string(grids[i][c]) +
            " at (" + std::to_string(c / size_t(shape.n) + 1) + ", " +
            std::to_string(c % size_t(shape.n) + 1) + ")";
    answers.push_back(
        {data::sudoku::to_text(grids[i]),
         data::sudoku::to_text(answer),
         data::sudoku::pretty(shape, answer),
         problem,
         problem.empty() ? "The answer keeps every rule and every given."
                         : "The answer breaks a rule: " + problem + ".",
         nlohmann::json::object()});
  }
  return print_answers(given, sols, answers, json, "keep every rule and given");
}

int solve_maze(
    trm::TrainedTrm& t,
    const Given& given,
    torch::Device device,
    bool json) {
  const int64_t cells = t.model->config.seq_len;
  const int side = data::maze::side_for_cells(cells);
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < given.lines.size(); ++i) {
    if (auto why = data::maze::text_problem(side, given.lines[i], false);
        !why.empty())
      throw UserError(
          given.where[i] + ": " + why + "; this model solves " +
          std::to_string(side) + "x" + std::to_string(side) +
          " mazes, given in one line row by row or drawn in " +
          std::to_string(side) + " rows.");
    if (data::maze::shortest_paths(side, given.lines[i]).steps < 0)
      throw UserError(
          given.where[i] +
          ": no path leads from S to G in this maze; open a wall on the "
          "way.");
    for (int64_t tk : data::maze_tokens(given.lines[i]))
      tokens.push_back(tk);
  }
  const auto sols = run_model(t, tokens, int64_t(given.lines.size()), device);
  std::vector<Answer> answers;
  for (size_t i = 0; i < given.lines.size(); ++i) {
    const std::string& q = given.lines[i];
    const std::string a = data::maze_from_tokens(sols[i].tokens.data(), cells);
    const int best = data::maze::shortest_paths(side, q).steps;
    const std::string problem = data::maze::answer_problem(side, q, a);
    answers.push_back(
        {q,
         a,
         data::maze::pretty(side, a),
         problem,
         problem.empty()
             ? "The path is the shortest, " + std::to_string(best) + " steps."
             : "The answer is not the shortest path: " + problem + ".",
         {{"shortest_path", best}}});
  }
  return print_answers(given, sols, answers, json, "are the shortest path");
}

} // namespace

Command register_solve(CLI::App& root) {
  struct State {
    DeviceFlags device;
    std::string checkpoint, puzzle, input;
    bool json = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "solve", "Solve Sudoku or mazes with a tiny recursive model (stage=trm)");
  app->add_option(
         "--checkpoint", st->checkpoint, "a stage=trm run or checkpoint folder")
      ->required();
  app->add_option(
      "--puzzle",
      st->puzzle,
      "the grid in one line, row by row ('.' or '0' for a blank in Sudoku; "
      "'#' wall, '.' open, 'S', 'G' in a maze)");
  app->add_option(
      "--input",
      st->input,
      "a file of puzzles: one grid a line, the CSV layout, or mazes drawn "
      "row by row");
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
        const std::string kind =
            t.state.value("puzzles", nlohmann::json()).value("kind", "");
        if (kind == "chat")
          throw UserError(
              t.checkpoint_dir +
              " was trained on conversations, not puzzles: `orchard chat "
              "--checkpoint` and `orchard generate --checkpoint` use it.");
        if (kind != "sudoku" && kind != "maze")
          throw UserError(
              t.checkpoint_dir + " was trained on " +
              (kind.empty() ? std::string("other puzzles")
                            : kind + " puzzles") +
              ", not Sudoku or mazes; `orchard eval --checkpoint` scores it "
              "on its held-out set.");
        const Given given = read_given(
            st->puzzle,
            st->input,
            kind == "maze" ? data::maze::side_for_cells(t.model->config.seq_len)
                           : 0);
        return kind == "maze" ? solve_maze(t, given, d.device, st->json)
                              : solve_sudoku(t, given, d.device, st->json);
      }};
}

} // namespace orchard::cli
