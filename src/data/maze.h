// Mazes with exactly one shortest path, the tiny recursive model's second
// task (the TRM and HRM papers' "Maze-Hard": 30x30, shortest path longer
// than 110 steps).
//
// A maze is side*side characters in row order: '#' a wall, '.' open, 'S'
// the start, 'G' the goal; its answer is the same grid with every open
// cell of the shortest path from S to G marked 'o'. Steps go up, down,
// left and right.
//
// The generator carves a maze on the lattice of even (row, column) cells
// with a randomised depth-first search (long winding corridors), opens a
// share of the remaining walls between lattice cells (`loops`, so that
// routes compete), then draws S and a G whose shortest path is unique and
// at least `min_path` steps long. An even side leaves its last row and
// column as wall.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace orchard::data::maze {

constexpr char kWall = '#', kOpen = '.', kStart = 'S', kGoal = 'G', kPath = 'o';

// The sides the generator takes: a 3x3 lattice at least, 60 at most
// (3,600 positions, four times Maze-Hard's).
constexpr int kMinSide = 5, kMaxSide = 60;

// The side of upstream's Maze-Hard, and its shortest-path floor.
constexpr int kHardSide = 30;
constexpr int kHardMinPath = 110;

// The default floor for a side: Maze-Hard's 110 at 30, scaled with the
// area below it.
int default_min_path(int side);

struct GenerateOptions {
  int side = kHardSide;
  int min_path = kHardMinPath; // steps from S to G
  double loops = 0.1; // share of the walls between lattice cells opened
};

struct Maze {
  std::string question, answer;
  int path_steps = 0; // moves from S to G
};

// One maze meeting `o`; throws std::runtime_error after too many tries
// (a floor longer than the side allows).
Maze generate(const GenerateOptions& o, std::mt19937_64& rng);

struct ShortestPaths {
  int steps = -1;    // -1: G cannot be reached (or S or G is missing)
  int64_t count = 0; // shortest paths, counted up to 2
};
ShortestPaths shortest_paths(int side, const std::string& question);

// What is wrong with `answer` as the solution of `question`, "" when it is
// the shortest path (rows and columns 1-based): the maze changed, a path
// that breaks off or branches, one longer than the shortest.
std::string answer_problem(
    int side,
    const std::string& question,
    const std::string& answer);

// The grid under one of the square's 8 symmetries (k = 0 ... 7: k & 3
// quarter turns, then a mirror when k >= 4).
std::string transform(int side, const std::string& grid, int k);

// The smallest of the 8 transforms: mazes equal under a symmetry share it.
std::string canonical(int side, const std::string& grid);

// The side of a grid of `cells` characters (0 when not a square).
int side_for_cells(int64_t cells);

// "" when `text` is a maze of side*side cells with one S and one G, else
// what is wrong; with `answer` true 'o' is allowed.
std::string text_problem(int side, const std::string& text, bool answer);

// The grid as `side` lines.
std::string pretty(int side, const std::string& grid);

} // namespace orchard::data::maze
