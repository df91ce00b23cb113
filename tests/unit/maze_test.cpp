// Mazes for stage=trm: every generated maze has one shortest path and its
// answer marks it (checked by a different method than the generator's:
// distances relaxed from both ends, a path unique when each distance along
// it has one cell), symmetric copies stay valid, wrong answers are named,
// and bad maze files stop at their line.
#include "data/maze.h"
#include "core/error.h"
#include "data/puzzles.h"

#include <gtest/gtest.h>

#include <climits>
#include <fstream>
#include <vector>

namespace orchard {
namespace {

namespace mz = data::maze;

// Steps from `from` to every cell, by relaxing until nothing changes.
std::vector<int> relaxed_distances(int side, const std::string& g, int from) {
  std::vector<int> d(g.size(), INT_MAX);
  d[size_t(from)] = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (int c = 0; c < side * side; ++c) {
      if (g[size_t(c)] == '#' || d[size_t(c)] == INT_MAX)
        continue;
      const int r = c / side, k = c % side;
      const int next[4][2] = {{r - 1, k}, {r + 1, k}, {r, k - 1}, {r, k + 1}};
      for (const auto& n : next) {
        if (n[0] < 0 || n[1] < 0 || n[0] >= side || n[1] >= side)
          continue;
        const size_t j = size_t(n[0] * side + n[1]);
        if (g[j] != '#' && d[size_t(c)] + 1 < d[j]) {
          d[j] = d[size_t(c)] + 1;
          changed = true;
        }
      }
    }
  }
  return d;
}

// The cells on a shortest S-G path, and whether that path is unique.
struct OnPath {
  int steps = -1;
  bool unique = false;
  std::string marked; // the question with 'o' on the path (when unique)
};
OnPath check(int side, const std::string& q) {
  const int s = int(q.find('S')), g = int(q.find('G'));
  const auto ds = relaxed_distances(side, q, s);
  const auto dg = relaxed_distances(side, q, g);
  OnPath p;
  if (ds[size_t(g)] == INT_MAX)
    return p;
  p.steps = ds[size_t(g)];
  std::vector<int> at_distance(size_t(p.steps) + 1, 0);
  p.marked = q;
  for (size_t c = 0; c < q.size(); ++c)
    if (ds[c] != INT_MAX && dg[c] != INT_MAX && ds[c] + dg[c] == p.steps) {
      ++at_distance[size_t(ds[c])];
      if (q[c] == '.')
        p.marked[c] = 'o';
    }
  p.unique = true;
  for (int n : at_distance)
    p.unique = p.unique && n == 1;
  return p;
}

TEST(Maze, GeneratedMazesHaveOneShortestPathTheirAnswer) {
  for (int side : {9, 30}) {
    mz::GenerateOptions o;
    o.side = side;
    o.min_path = mz::default_min_path(side);
    std::mt19937_64 rng{static_cast<uint64_t>(side)};
    for (int i = 0; i < 20; ++i) {
      const mz::Maze m = mz::generate(o, rng);
      EXPECT_EQ(mz::text_problem(side, m.question, false), "");
      const OnPath p = check(side, m.question);
      ASSERT_GE(p.steps, o.min_path) << mz::pretty(side, m.question);
      EXPECT_TRUE(p.unique) << mz::pretty(side, m.question);
      EXPECT_EQ(p.steps, m.path_steps);
      EXPECT_EQ(m.answer, p.marked) << mz::pretty(side, m.answer);
      EXPECT_EQ(mz::answer_problem(side, m.question, m.answer), "");
      // Every turned and mirrored copy is a maze with the mapped answer.
      for (int k = 1; k < 8; ++k) {
        const std::string q = mz::transform(side, m.question, k);
        const OnPath t = check(side, q);
        EXPECT_TRUE(t.unique);
        EXPECT_EQ(t.marked, mz::transform(side, m.answer, k)) << k;
        EXPECT_EQ(mz::canonical(side, q), mz::canonical(side, m.question));
      }
    }
  }
  EXPECT_EQ(mz::default_min_path(30), 110); // Maze-Hard's floor
}

TEST(Maze, WrongAnswersAreNamed) {
  // S at the top left, G at the bottom left; the short way is down the
  // left column, the long way round the right.
  const int side = 5;
  const std::string q =
      "S...."
      ".###."
      ".#.#."
      ".###."
      "G....";
  const std::string right =
      "S...."
      "o###."
      "o#.#."
      "o###."
      "G....";
  ASSERT_EQ(check(side, q).steps, 4);
  EXPECT_EQ(mz::answer_problem(side, q, right), "");
  const std::string broken =
      "S...."
      "o###."
      ".#.#."
      "o###."
      "G....";
  EXPECT_NE(
      mz::answer_problem(side, q, broken).find("breaks off"),
      std::string::npos);
  const std::string longer =
      "Soooo"
      ".###o"
      ".#.#o"
      ".###o"
      "Goooo";
  EXPECT_NE(
      mz::answer_problem(side, q, longer).find("shortest takes 4"),
      std::string::npos)
      << mz::answer_problem(side, q, longer);
  const std::string extra =
      "S...o"
      "o###."
      "o#.#."
      "o###."
      "G....";
  EXPECT_NE(
      mz::answer_problem(side, q, extra).find("off the path"),
      std::string::npos);
  const std::string wall =
      "S...."
      "o#o#."
      "o#.#."
      "o###."
      "G....";
  EXPECT_NE(
      mz::answer_problem(side, q, wall).find("changes the maze at (2, 3)"),
      std::string::npos);
}

TEST(Maze, MazeFilesLoadAndBadOnesNameTheLine) {
  const std::string dir = ::testing::TempDir() + "/mazes";
  data::MazeDataOptions o;
  o.count = 30;
  o.side = 9;
  o.augment = 3;
  o.out = dir;
  const auto s = data::write_maze_dataset(o);
  EXPECT_EQ(s.train + s.test, 30);
  const auto splits = data::load_puzzle_splits(dir);
  EXPECT_EQ(splits.train.kind, "maze");
  EXPECT_EQ(splits.train.side, 9);
  EXPECT_EQ(splits.train.vocab, data::kMazeVocab);
  EXPECT_EQ(splits.test.size(), s.test);
  EXPECT_EQ(splits.train.size(), s.train_rows);
  EXPECT_GT(s.train_rows, s.train); // the copies
  // No held-out maze, in any orientation, is in training.
  std::set<std::string> train_classes;
  for (int64_t i = 0; i < splits.train.size(); ++i)
    train_classes.insert(mz::canonical(
        9,
        data::maze_from_tokens(
            splits.train.inputs[i].contiguous().data_ptr<int64_t>(), 81)));
  for (int64_t i = 0; i < splits.test.size(); ++i) {
    const std::string q = data::maze_from_tokens(
        splits.test.inputs[i].contiguous().data_ptr<int64_t>(), 81);
    EXPECT_EQ(train_classes.count(mz::canonical(9, q)), 0u) << q;
    const std::string a = data::maze_from_tokens(
        splits.test.labels[i].contiguous().data_ptr<int64_t>(), 81);
    EXPECT_EQ(check(9, q).marked, a);
  }

  // A maze that is not a square, then one that marks the long way round.
  const std::string path = ::testing::TempDir() + "/bad_mazes.csv";
  {
    std::ofstream f(path);
    f << "source,question,answer,rating\n"
      << "x,S.....###..#.#..###G....,S.....###..#.#..###G....,0\n";
  }
  auto refusal = [](const std::string& p) {
    try {
      data::read_puzzles(p);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no refusal");
  };
  EXPECT_NE(
      refusal(path).find(path + ":2: a maze of 24 cells"), std::string::npos)
      << refusal(path);
  {
    std::ofstream f(path);
    f << "source,question,answer,rating\n"
      << "x,S.....###..#.#..###.G....,S....o###.o#.#.o###.G....,4\n"
      << "y,S.....###..#.#..###.G....,Soooo.###o.#.#o.###oGoooo,12\n";
  }
  const std::string why = refusal(path);
  EXPECT_NE(why.find(path + ":3:"), std::string::npos) << why;
  EXPECT_NE(why.find("not the shortest path"), std::string::npos) << why;
}

} // namespace
} // namespace orchard
