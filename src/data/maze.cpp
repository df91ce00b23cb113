#include "data/maze.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <stdexcept>
#include <vector>

namespace orchard::data::maze {
namespace {

// Maze tries before giving up, and starts tried per maze.
constexpr int kMazeTries = 2000;
constexpr int kStartsPerMaze = 8;

const int kDr[4] = {-1, 1, 0, 0};
const int kDc[4] = {0, 0, -1, 1};

// Calls f(neighbour) for the cells up, down, left and right of `cell`.
template <class F>
void for_each_neighbour(int side, int cell, F f) {
  const int r = cell / side, k = cell % side;
  for (int d = 0; d < 4; ++d) {
    const int nr = r + kDr[d], nk = k + kDc[d];
    if (nr >= 0 && nk >= 0 && nr < side && nk < side)
      f(nr * side + nk);
  }
}

bool passable(char ch) {
  return ch != kWall;
}

std::string where(int side, int cell) {
  return "(" + std::to_string(cell / side + 1) + ", " +
      std::to_string(cell % side + 1) + ")";
}

// Breadth-first distances from `from` (-1 unreachable) and the number of
// shortest paths to each cell, capped at 2.
struct Bfs {
  std::vector<int> dist;
  std::vector<int64_t> count;
};
Bfs bfs(int side, const std::string& g, int from) {
  Bfs b{std::vector<int>(g.size(), -1), std::vector<int64_t>(g.size(), 0)};
  std::deque<int> queue{from};
  b.dist[size_t(from)] = 0;
  b.count[size_t(from)] = 1;
  while (!queue.empty()) {
    const int c = queue.front();
    queue.pop_front();
    for_each_neighbour(side, c, [&](int n) {
      if (!passable(g[size_t(n)]))
        return;
      if (b.dist[size_t(n)] < 0) {
        b.dist[size_t(n)] = b.dist[size_t(c)] + 1;
        queue.push_back(n);
      }
      if (b.dist[size_t(n)] == b.dist[size_t(c)] + 1)
        b.count[size_t(n)] =
            std::min<int64_t>(2, b.count[size_t(n)] + b.count[size_t(c)]);
    });
  }
  return b;
}

// Walls carved into a lattice maze: cells at even (row, column).
std::string carve(int side, double loops, std::mt19937_64& rng) {
  std::string g(size_t(side) * size_t(side), kWall);
  const int cells = (side + 1) / 2; // lattice cells a side
  auto at = [&](int r, int k) -> char& {
    return g[size_t(r) * size_t(side) + size_t(k)];
  };
  std::vector<char> seen(size_t(cells) * size_t(cells), 0);
  std::uniform_int_distribution<int> pick(0, cells - 1);
  std::vector<std::pair<int, int>> stack{{pick(rng), pick(rng)}};
  seen[size_t(stack[0].first * cells + stack[0].second)] = 1;
  at(2 * stack[0].first, 2 * stack[0].second) = kOpen;
  while (!stack.empty()) {
    const auto [r, k] = stack.back();
    int options[4], n = 0;
    for (int d = 0; d < 4; ++d) {
      const int nr = r + kDr[d], nk = k + kDc[d];
      if (nr >= 0 && nk >= 0 && nr < cells && nk < cells &&
          !seen[size_t(nr * cells + nk)])
        options[n++] = d;
    }
    if (n == 0) {
      stack.pop_back();
      continue;
    }
    const int d = options[std::uniform_int_distribution<int>(0, n - 1)(rng)];
    const int nr = r + kDr[d], nk = k + kDc[d];
    seen[size_t(nr * cells + nk)] = 1;
    at(2 * r + kDr[d], 2 * k + kDc[d]) = kOpen;
    at(2 * nr, 2 * nk) = kOpen;
    stack.push_back({nr, nk});
  }
  // Loops: walls between two lattice cells (odd on one axis, even on the
  // other) opened with probability `loops`.
  std::bernoulli_distribution open(loops);
  for (int r = 0; r < 2 * cells - 1; ++r)
    for (int k = 0; k < 2 * cells - 1; ++k)
      if ((r % 2) != (k % 2) && at(r, k) == kWall && open(rng))
        at(r, k) = kOpen;
  return g;
}

} // namespace

int default_min_path(int side) {
  return std::max(
      2,
      int(std::lround(
          kHardMinPath * double(side) * side / (kHardSide * kHardSide))));
}

Maze generate(const GenerateOptions& o, std::mt19937_64& rng) {
  if (o.side < 3)
    throw std::runtime_error("a maze needs a side of at least 3");
  const size_t cells = size_t(o.side) * size_t(o.side);
  for (int attempt = 0; attempt < kMazeTries; ++attempt) {
    std::string g = carve(o.side, o.loops, rng);
    std::vector<int> open;
    for (size_t c = 0; c < cells; ++c)
      if (g[c] == kOpen)
        open.push_back(int(c));
    std::uniform_int_distribution<size_t> pick(0, open.size() - 1);
    for (int s = 0; s < kStartsPerMaze; ++s) {
      const int start = open[pick(rng)];
      const Bfs b = bfs(o.side, g, start);
      std::vector<int> goals;
      for (int c : open)
        if (b.dist[size_t(c)] >= std::max(1, o.min_path) &&
            b.count[size_t(c)] == 1)
          goals.push_back(c);
      if (goals.empty())
        continue;
      const int goal = goals[std::uniform_int_distribution<size_t>(
          0, goals.size() - 1)(rng)];
      Maze m;
      m.question = g;
      m.question[size_t(start)] = kStart;
      m.question[size_t(goal)] = kGoal;
      m.answer = m.question;
      m.path_steps = b.dist[size_t(goal)];
      // Walk back from G along strictly falling distances: the one path.
      for (int c = goal; c != start;) {
        int back = c;
        for_each_neighbour(o.side, c, [&](int n) {
          if (b.dist[size_t(n)] == b.dist[size_t(c)] - 1)
            back = n;
        });
        c = back;
        if (c != start)
          m.answer[size_t(c)] = kPath;
      }
      return m;
    }
  }
  throw std::runtime_error(
      "no maze of side " + std::to_string(o.side) +
      " had a unique shortest path of " + std::to_string(o.min_path) +
      " steps or more");
}

ShortestPaths shortest_paths(int side, const std::string& q) {
  const auto s = q.find(kStart), g = q.find(kGoal);
  if (s == std::string::npos || g == std::string::npos)
    return {};
  const Bfs b = bfs(side, q, int(s));
  return {b.dist[g], b.count[g]};
}

std::string answer_problem(
    int side,
    const std::string& question,
    const std::string& answer) {
  if (answer.size() != question.size())
    return "the answer has " + std::to_string(answer.size()) +
        " cells, the maze " + std::to_string(question.size());
  const int start = int(question.find(kStart));
  const int goal = int(question.find(kGoal));
  int marked = 0;
  for (size_t c = 0; c < answer.size(); ++c) {
    if (answer[c] == kPath && question[c] == kOpen) {
      ++marked;
      continue;
    }
    if (answer[c] != question[c])
      return std::string("it changes the maze at ") + where(side, int(c)) +
          " ('" + question[c] + "' to '" + answer[c] + "')";
  }
  // Walk from S along marked cells: each must continue the path alone.
  auto on_path = [&](int c) { return answer[size_t(c)] == kPath || c == goal; };
  int steps = 0;
  for (int c = start, previous = -1; c != goal; ++steps) {
    if (steps > marked)
      return "the marked cells do not lead from S to G";
    int next = -1, ways = 0;
    for_each_neighbour(side, c, [&](int n) {
      if (n != previous && on_path(n)) {
        next = n;
        ++ways;
      }
    });
    if (ways == 0)
      return "the path breaks off at " + where(side, c);
    if (ways > 1)
      return "the path branches at " + where(side, c);
    previous = c;
    c = next;
  }
  if (steps != marked + 1)
    return "cells off the path are marked (" + std::to_string(marked) +
        " marked, the path from S to G uses " + std::to_string(steps - 1) + ")";
  const ShortestPaths best = shortest_paths(side, question);
  if (steps != best.steps)
    return "the path takes " + std::to_string(steps) +
        " steps; the shortest takes " + std::to_string(best.steps);
  return "";
}

std::string transform(int side, const std::string& g, int k) {
  std::string out(g.size(), kWall);
  for (int r = 0; r < side; ++r)
    for (int c = 0; c < side; ++c) {
      int nr = r, nc = c;
      for (int q = 0; q < (k & 3); ++q) { // a quarter turn clockwise
        const int t = nr;
        nr = nc;
        nc = side - 1 - t;
      }
      if (k >= 4)
        nc = side - 1 - nc;
      out[size_t(nr * side + nc)] = g[size_t(r * side + c)];
    }
  return out;
}

std::string canonical(int side, const std::string& g) {
  std::string best = g;
  for (int k = 1; k < 8; ++k)
    best = std::min(best, transform(side, g, k));
  return best;
}

int side_for_cells(int64_t cells) {
  const int side = int(std::lround(std::sqrt(double(cells))));
  return int64_t(side) * side == cells ? side : 0;
}

std::string text_problem(int side, const std::string& text, bool answer) {
  if (int64_t(text.size()) != int64_t(side) * side)
    return std::to_string(text.size()) + " cells where a maze of side " +
        std::to_string(side) + " has " + std::to_string(side * side);
  int starts = 0, goals = 0;
  for (size_t c = 0; c < text.size(); ++c) {
    const char ch = text[c];
    starts += ch == kStart;
    goals += ch == kGoal;
    if (ch != kWall && ch != kOpen && ch != kStart && ch != kGoal &&
        !(answer && ch == kPath))
      return std::string("'") + ch + "' at " + where(side, int(c)) +
          " is not a maze cell ('#' wall, '.' open, 'S' start, 'G' goal" +
          (answer ? ", 'o' path" : "") + ")";
  }
  if (starts != 1 || goals != 1)
    return std::to_string(starts) + " S and " + std::to_string(goals) +
        " G where a maze has one of each";
  return "";
}

std::string pretty(int side, const std::string& g) {
  std::string out;
  for (int r = 0; r < side; ++r)
    out += g.substr(size_t(r * side), size_t(side)) + "\n";
  return out;
}

} // namespace orchard::data::maze
