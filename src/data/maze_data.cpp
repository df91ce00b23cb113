// `orchard data maze`: mazes with one shortest path into train.csv,
// test.csv, puzzles.csv and dataset.json (puzzles.h).
#include "core/error.h"
#include "core/files.h"
#include "core/strings.h"
#include "data/puzzles.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <set>

namespace orchard::data {
namespace {

constexpr int kSymmetries = 8;
// Mazes made per maze asked before giving up on distinct ones.
constexpr int64_t kMaxMadePerWanted = 20;

} // namespace

MazeDataSummary write_maze_dataset(const MazeDataOptions& o) {
  if (o.side < maze::kMinSide || o.side > maze::kMaxSide)
    throw UserError(
        "--size " + std::to_string(o.side) + ": Orchard makes mazes of side " +
        std::to_string(maze::kMinSide) + " to " +
        std::to_string(maze::kMaxSide) + " (Maze-Hard's is 30).");
  if (o.count < 2)
    throw UserError(
        "--count must be at least 2 (some to train, some held out).");
  if (o.augment < 0 || o.augment >= kSymmetries)
    throw UserError(
        "--augment " + std::to_string(o.augment) +
        ": a maze has 8 symmetries (turns and mirrors), so 0 to 7 copies.");
  if (!(o.test_fraction > 0 && o.test_fraction < 1))
    throw UserError("--test-fraction is between 0 and 1, such as 0.1.");
  if (!(o.loops >= 0 && o.loops <= 1))
    throw UserError(
        "--loops is the share of inner walls opened, between 0 and 1 (0.1).");
  if (o.min_path < 0)
    throw UserError("--min-path is a number of steps, 0 (auto) or more.");
  if (o.out.empty())
    throw UserError("--out DIR is needed: the folder to write the mazes to.");
  maze::GenerateOptions g;
  g.side = o.side;
  g.min_path = o.min_path > 0 ? o.min_path : maze::default_min_path(o.side);
  g.loops = o.loops;

  // Maze i from its own generator (seed, i); distinct up to symmetry.
  const int64_t want_test =
      std::max<int64_t>(1, int64_t(double(o.count) * o.test_fraction + 0.5));
  std::vector<maze::Maze> test, train;
  std::set<std::string> seen;
  int64_t made = 0;
  for (; int64_t(test.size() + train.size()) < o.count &&
       made < kMaxMadePerWanted * o.count;
       ++made) {
    std::seed_seq seq{uint64_t(o.seed), uint64_t(made), uint64_t(0x3a2e)};
    std::mt19937_64 rng(seq);
    maze::Maze m;
    try {
      m = maze::generate(g, rng);
    } catch (const std::runtime_error&) {
      throw UserError(
          "no " + std::to_string(o.side) + "x" + std::to_string(o.side) +
          " maze had a unique shortest path of --min-path " +
          std::to_string(g.min_path) +
          " steps in many tries; lower "
          "--min-path or raise --size.");
    }
    if (!seen.insert(maze::canonical(o.side, m.question)).second)
      continue;
    (int64_t(test.size()) < want_test ? test : train).push_back(std::move(m));
  }
  if (int64_t(test.size() + train.size()) < o.count || train.empty())
    throw UserError(
        "only " + std::to_string(test.size() + train.size()) +
        " distinct mazes came out of " + std::to_string(made) + " made (" +
        std::to_string(o.count) + " asked); lower --count or raise --size.");

  auto row = [](const std::string& src, const maze::Maze& m) {
    return src + "," + m.question + "," + m.answer + "," +
        std::to_string(m.path_steps) + "\n";
  };
  std::string train_csv = std::string(kPuzzleCsvHeader) + "\n";
  std::string test_csv = train_csv, puzzles_csv = train_csv;
  // Copies under distinct symmetries; a maze's copies are its own class,
  // so none can be a held-out maze.
  std::mt19937_64 aug_rng(uint64_t(o.seed) * 7919 + 29);
  int64_t train_rows = 0;
  for (const maze::Maze& m : train) {
    train_csv += row("generated", m);
    puzzles_csv += row("train", m);
    ++train_rows;
    std::vector<int> ks = {1, 2, 3, 4, 5, 6, 7};
    std::shuffle(ks.begin(), ks.end(), aug_rng);
    std::set<std::string> copies = {m.question};
    for (int64_t k = 0; k < o.augment; ++k) {
      maze::Maze a;
      a.question = maze::transform(o.side, m.question, ks[size_t(k)]);
      a.answer = maze::transform(o.side, m.answer, ks[size_t(k)]);
      a.path_steps = m.path_steps;
      if (!copies.insert(a.question).second)
        continue; // a symmetric maze: this copy is the maze itself
      train_csv += row("augmented", a);
      ++train_rows;
    }
  }
  for (const maze::Maze& m : test) {
    test_csv += row("generated", m);
    puzzles_csv += row("test", m);
  }
  std::filesystem::create_directories(o.out);
  atomic_write(o.out + "/train.csv", train_csv);
  atomic_write(o.out + "/test.csv", test_csv);
  atomic_write(o.out + "/puzzles.csv", puzzles_csv);

  std::vector<int> steps;
  for (const auto* set : {&test, &train})
    for (const maze::Maze& m : *set)
      steps.push_back(m.path_steps);
  std::sort(steps.begin(), steps.end());
  const nlohmann::json meta = {
      {"kind", "maze"},
      {"size", o.side},
      {"count", o.count},
      {"train_puzzles", int64_t(train.size())},
      {"train_rows", train_rows},
      {"test_puzzles", int64_t(test.size())},
      {"repeats_dropped", made - o.count},
      {"augment", o.augment},
      {"min_path", g.min_path},
      {"loops", o.loops},
      {"path_steps",
       {{"min", steps.front()},
        {"median", steps[steps.size() / 2]},
        {"max", steps.back()},
        {"what",
         "moves on the one shortest path from S to G; the rating column"}}},
      {"seed", o.seed},
      {"split",
       "by maze up to its 8 symmetries: no held-out maze, turned or "
       "mirrored, is in training"},
      {"layout",
       "source,question,answer,rating; '#' wall, '.' open, 'S' start, 'G' "
       "goal, 'o' the shortest path"}};
  atomic_write(o.out + "/dataset.json", meta.dump(2) + "\n");
  MazeDataSummary s;
  s.train = int64_t(train.size());
  s.test = int64_t(test.size());
  s.train_rows = train_rows;
  s.min_path = g.min_path;
  s.difficulty_text = "shortest paths " + std::to_string(steps.front()) + "-" +
      std::to_string(steps.back()) + " steps (median " +
      std::to_string(steps[steps.size() / 2]) + "), each the only one";
  return s;
}

} // namespace orchard::data
