// Sudoku of side 4, 6 or 9: a solver that counts solutions, a generator of
// puzzles with exactly one solution, a difficulty measure, and the
// symmetries that map a puzzle to an equivalent one.
//
// A grid is n*n cells in row order, 0 for a blank and 1..n for a digit.
// Boxes are r x c: 2x2 (n=4), 2x3 (n=6, two rows of three columns), 3x3.
//
// Difficulty (stated in a dataset's metadata) is measured two ways:
// - givens, and whether the puzzle falls to singles alone (naked singles:
//   a cell with one candidate; hidden singles: a digit with one place in a
//   row, column or box) - what a person solves without search;
// - the nodes a plain backtracking solver visits (most-constrained cell
//   first), the "search effort".
// Presets: easy 26-36 givens (any), hard at most 25 givens and not solved
// by singles, extreme minimal (no given can go) and not solved by singles
// with at least kExtremeNodes search nodes. Sudoku-Extreme (the TRM
// paper's set) is of the hard/extreme kind.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace orchard::data::sudoku {

using Grid = std::vector<int8_t>;

struct Shape {
  int n = 9, box_rows = 3, box_cols = 3;
  int cells() const {
    return n * n;
  }
};

// The shape of a grid of `cells` cells (16, 36, 81); n = 0 when none.
Shape shape_for_cells(int64_t cells);

struct SolveResult {
  int64_t solutions = 0; // counted up to the limit given
  int64_t nodes = 0;     // cells tried (the search effort)
  Grid solution;         // the first found
};

// Counts solutions of `puzzle` up to `limit` (2 answers "unique?").
SolveResult solve(const Shape& s, const Grid& puzzle, int64_t limit = 2);

// True when naked and hidden singles alone fill the grid.
bool solved_by_singles(const Shape& s, const Grid& puzzle);

// The rule a filled or partial grid breaks ("7 twice in row 3", rows and
// columns 1-based), "" when it breaks none: each digit at most once per
// row, column and box, digits within 1..n.
std::string rule_broken(const Shape& s, const Grid& grid);

struct GenerateOptions {
  Shape shape;
  int min_givens = 0, max_givens = 81; // givens kept
  std::string difficulty = "any";      // any | easy | hard | extreme
  bool minimal = false;                // remove givens while unique
};

// Bumped when generated puzzles change for the same options and seed (2:
// each puzzle its own random solution grid; 1 gave one grid up to
// relabelling). Cached sets of an older version are made again.
constexpr int kGeneratorVersion = 2;

// Search nodes from which a minimal puzzle counts as extreme.
constexpr int64_t kExtremeNodes = 60;

struct Puzzle {
  Grid question, answer;
  int givens = 0;
  int64_t nodes = 0;    // backtracking nodes to solve it
  bool singles = false; // solved by singles alone
};

// One puzzle with exactly one solution meeting `o`; throws
// std::runtime_error after too many tries (bounds that cannot be met).
Puzzle generate(const GenerateOptions& o, std::mt19937_64& rng);

// A random symmetry of the shape: digits relabelled, bands (and rows in a
// band) and stacks (and columns in a stack) permuted, transposed when
// boxes are square.
struct Symmetry {
  std::vector<int> digit;    // digit[d] for d in 0..n (digit[0] = 0)
  std::vector<int> row, col; // new cell (i, j) takes old (row[i], col[j])
  bool transpose = false;
};
Symmetry random_symmetry(const Shape& s, std::mt19937_64& rng);
Grid apply(const Shape& s, const Symmetry& t, const Grid& g);

// A canonical representative of the puzzle's class under every symmetry
// above (the smallest string over all of them, digits renumbered by first
// appearance). Exhaustive, so for n <= 6 only (9x9 has 3.4 million
// geometric symmetries): n = 9 gets the digit renumbering alone.
std::string canonical(const Shape& s, const Grid& g);

// "53..7...." (81 characters, '.' for a blank) and back; parse returns an
// empty grid with `error` set when the text is not a grid.
std::string to_text(const Grid& g);
Grid from_text(const std::string& text, const Shape& s, std::string* error);

// The grid as rows for a terminal, with box lines.
std::string pretty(const Shape& s, const Grid& g);

} // namespace orchard::data::sudoku
