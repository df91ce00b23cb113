// Puzzle datasets for the tiny recursive model (stage=trm): a question and
// its answer as equal-length token grids.
//
// Three layouts are read:
// - Sudoku, in Sudoku-Extreme's CSV layout (the TRM paper's data):
//   `source,question,answer,rating`, question and answer n*n characters
//   (n = 4, 6 or 9), '.' (or '0') for a blank. Tokens: 0 padding (unused),
//   1 blank, d + 1 for the digit d, as upstream TRM numbers them; every
//   cell of the answer is supervised.
// - Mazes, in the same CSV layout: question and answer side*side
//   characters ('#' wall, '.' open, 'S' start, 'G' goal; 'o' marks the
//   shortest path in the answer), told from Sudoku by the '#'.
// - Grids, one JSON object per line in ARC's layout: {"input": [[...]],
//   "output": [[...]]} with colours 0-9 and an optional "puzzle" name
//   (examples of one puzzle share a learned puzzle embedding). Each grid
//   is drawn at the top left of an S x S canvas (S = the largest side in
//   the file + 1): 0 padding, 1 the end-of-grid marker along the row and
//   column past the grid, colour c as c + 2 (upstream's ARC tokens); every
//   canvas cell of the output is supervised.
// - Conversations, a .chat file from `orchard data chat`, for the chat
//   variant (next-token prediction): row i's input is conversation i's ids
//   but the last, its labels the ids one ahead where the loss mask says
//   learn, kIgnoreLabel elsewhere; rows padded on the right (input 0,
//   label ignored) to the longest. vocab is the largest id + 1 (the
//   stage takes the tokenizer's).
// `orchard data sudoku` writes a folder of train.csv, test.csv,
// puzzles.csv (the puzzles before augmentation, `source` saying which
// split) and dataset.json (how they were made and how hard they are).
#pragma once

#include "data/maze.h"
#include "data/sudoku.h"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard::data {

struct PuzzleSet {
  std::string kind;    // "sudoku" | "maze" | "grid" | "chat"
  sudoku::Shape shape; // sudoku: the grid's shape
  int64_t side = 0;    // rows = columns of the token grid
  int64_t length = 0;  // chat: tokens a row (no grid)
  int64_t vocab = 0;   // tokens 0 .. vocab-1
  int64_t num_puzzle_ids = 1;
  torch::Tensor inputs;     // [N, side*side] int64
  torch::Tensor labels;     // [N, side*side] int64
  torch::Tensor puzzle_ids; // [N] int64
  std::string source;       // "data/sudoku/train.csv (2,000 puzzles)"

  int64_t size() const {
    return inputs.defined() ? inputs.size(0) : 0;
  }
  int64_t seq_len() const {
    return length > 0 ? length : side * side;
  }
  // Rows [from, from + count) (views).
  PuzzleSet slice(int64_t from, int64_t count) const;
};

// Labels that no loss or accuracy counts (chat: prompts and padding).
constexpr int64_t kIgnoreLabel = -100;

// Reads a CSV (Sudoku, mazes), JSONL (grids) or .chat file; UserError with
// file:line for a bad record.
PuzzleSet read_puzzles(const std::string& path);

struct PuzzleSplits {
  PuzzleSet train, test;
  std::string description;
};

// data= of stage=trm: a folder (its train.* and test.*), or one file whose
// every 10th record is held out.
PuzzleSplits load_puzzle_splits(const std::string& path);

// The first line of a puzzle CSV.
constexpr const char* kPuzzleCsvHeader = "source,question,answer,rating";

// Maze tokens of a grid ('#' 1, '.' 2, 'S' 3, 'G' 4, 'o' 5: upstream's
// "# SGo" after padding) and back.
constexpr int64_t kMazeVocab = 6;
std::vector<int64_t> maze_tokens(const std::string& grid);
std::string maze_from_tokens(const int64_t* tokens, int64_t cells);

// Sudoku tokens of a grid (0 blank -> 1, d -> d + 1) and back.
std::vector<int64_t> sudoku_tokens(const sudoku::Grid& g);
sudoku::Grid sudoku_from_tokens(const int64_t* tokens, int64_t cells);

// What `orchard data sudoku` and `orchard data maze` share.
struct PuzzleDataOptions {
  int64_t count = 1000; // puzzles before augmentation
  std::string out;
  int64_t augment = 0; // augmented copies per training puzzle
  double test_fraction = 0.1;
  int64_t seed = 0;
};

struct PuzzleDataSummary {
  int64_t train = 0, test = 0, train_rows = 0;
  std::string difficulty_text; // how hard the kept puzzles are
};

// `orchard data sudoku`.
struct SudokuDataOptions : PuzzleDataOptions {
  int n = 9;
  std::string givens; // "MIN-MAX", "" for the difficulty's
  std::string difficulty =
      "auto";          // auto | any | easy | hard | extreme | minimal
  int64_t threads = 0; // 0: every core
};

struct SudokuDataSummary : PuzzleDataSummary {
  bool by_class = true; // the split keeps symmetry classes apart
};

SudokuDataSummary write_sudoku_dataset(const SudokuDataOptions& o);

// `orchard data maze`: the same files, mazes in the CSV layout (question
// and answer side*side characters, rating the shortest path's steps).
struct MazeDataOptions : PuzzleDataOptions {
  int side = maze::kHardSide;
  int min_path = 0; // 0: maze::default_min_path(side)
  double loops = 0.1;
};

struct MazeDataSummary : PuzzleDataSummary {
  int min_path = 0;
};

MazeDataSummary write_maze_dataset(const MazeDataOptions& o);

} // namespace orchard::data
