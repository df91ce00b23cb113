#include "data/sudoku.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <stdexcept>

namespace orchard::data::sudoku {
namespace {

// Candidate digits as bits 1..n of a mask.
using Mask = uint16_t;

int popcount(Mask m) {
  return __builtin_popcount(m);
}

struct Board {
  const Shape& s;
  Grid g;
  std::array<Mask, 9> row{}, col{}, box{};

  Board(const Shape& shape, const Grid& grid) : s(shape), g(grid) {}

  int box_of(int r, int c) const {
    return (r / s.box_rows) * (s.n / s.box_cols) + c / s.box_cols;
  }
  Mask full() const {
    return Mask(((1 << s.n) - 1) << 1);
  }
  // False when a given repeats.
  bool init() {
    for (int i = 0; i < s.cells(); ++i)
      if (int d = g[size_t(i)]) {
        const Mask bit = Mask(1 << d);
        const int r = i / s.n, c = i % s.n, b = box_of(r, c);
        if ((row[size_t(r)] | col[size_t(c)] | box[size_t(b)]) & bit)
          return false;
        set(i, d);
      }
    return true;
  }
  Mask candidates(int i) const {
    const int r = i / s.n, c = i % s.n;
    return Mask(
        full() &
        ~(row[size_t(r)] | col[size_t(c)] | box[size_t(box_of(r, c))]));
  }
  void set(int i, int d) {
    const Mask bit = Mask(1 << d);
    const int r = i / s.n, c = i % s.n;
    row[size_t(r)] |= bit;
    col[size_t(c)] |= bit;
    box[size_t(box_of(r, c))] |= bit;
    g[size_t(i)] = int8_t(d);
  }
  void unset(int i) {
    const Mask bit = Mask(1 << g[size_t(i)]);
    const int r = i / s.n, c = i % s.n;
    row[size_t(r)] &= Mask(~bit);
    col[size_t(c)] &= Mask(~bit);
    box[size_t(box_of(r, c))] &= Mask(~bit);
    g[size_t(i)] = 0;
  }
  // The blank cell with the fewest candidates (the first of equals); -1
  // when the grid is full.
  int most_constrained(Mask& cand) const {
    int best = -1, fewest = 99;
    for (int i = 0; i < s.cells(); ++i)
      if (!g[size_t(i)]) {
        const Mask m = candidates(i);
        const int k = popcount(m);
        if (k < fewest) {
          best = i;
          fewest = k;
          cand = m;
          if (k <= 1)
            break;
        }
      }
    return best;
  }
};

std::vector<int> ascending(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1);
  return v;
}

// Backtracking, most-constrained cell first; digits ascending (for
// counting), or with `rng` in a fresh random order at every cell (to fill
// a random grid: one order for the whole search would give the same grid,
// up to relabelling the digits, every time).
void search(
    Board& b,
    SolveResult& r,
    int64_t limit,
    std::mt19937_64* rng = nullptr) {
  Mask cand = 0;
  const int i = b.most_constrained(cand);
  if (i < 0) {
    if (r.solutions++ == 0)
      r.solution = b.g;
    return;
  }
  std::vector<int> order = ascending(b.s.n);
  if (rng)
    std::shuffle(order.begin(), order.end(), *rng);
  for (int d : order) {
    if (!(cand & (1 << d)))
      continue;
    ++r.nodes;
    b.set(i, d);
    search(b, r, limit, rng);
    b.unset(i);
    if (r.solutions >= limit)
      return;
  }
}

Grid random_full(const Shape& s, std::mt19937_64& rng) {
  Board b(s, Grid(size_t(s.cells()), 0));
  b.init();
  SolveResult r;
  search(b, r, 1, &rng);
  return r.solution;
}

// A permutation of n/k groups of k consecutive indices: groups shuffled,
// then the indices within each group.
std::vector<int> block_permutation(int n, int k, std::mt19937_64& rng) {
  std::vector<int> groups = ascending(n / k), out;
  std::shuffle(groups.begin(), groups.end(), rng);
  for (int g : groups) {
    std::vector<int> inner = ascending(k);
    std::shuffle(inner.begin(), inner.end(), rng);
    for (int i : inner)
      out.push_back((g - 1) * k + (i - 1));
  }
  return out;
}

// Every permutation block_permutation can return.
std::vector<std::vector<int>> all_block_permutations(int n, int k) {
  std::vector<std::vector<int>> out;
  std::vector<int> groups(static_cast<size_t>(n / k));
  std::iota(groups.begin(), groups.end(), 0);
  std::vector<std::vector<int>> inner_perms;
  std::vector<int> inner(static_cast<size_t>(k));
  std::iota(inner.begin(), inner.end(), 0);
  do
    inner_perms.push_back(inner);
  while (std::next_permutation(inner.begin(), inner.end()));
  do {
    // One choice of inner permutation per group: a mixed-radix counter.
    std::vector<size_t> pick(groups.size(), 0);
    for (;;) {
      std::vector<int> perm;
      for (size_t g = 0; g < groups.size(); ++g)
        for (int i : inner_perms[pick[g]])
          perm.push_back(groups[g] * k + i);
      out.push_back(perm);
      size_t g = 0;
      while (g < pick.size() && ++pick[g] == inner_perms.size())
        pick[g++] = 0;
      if (g == pick.size())
        break;
    }
  } while (std::next_permutation(groups.begin(), groups.end()));
  return out;
}

// Digits renumbered 1, 2, ... in order of first appearance.
std::string renumbered(const Grid& g) {
  std::array<int, 10> map{};
  int next = 0;
  std::string out(g.size(), '.');
  for (size_t i = 0; i < g.size(); ++i)
    if (int d = g[i]) {
      if (!map[size_t(d)])
        map[size_t(d)] = ++next;
      out[i] = char('0' + map[size_t(d)]);
    }
  return out;
}

} // namespace

Shape shape_for_cells(int64_t cells) {
  if (cells == 16)
    return {4, 2, 2};
  if (cells == 36)
    return {6, 2, 3};
  if (cells == 81)
    return {9, 3, 3};
  return {0, 0, 0};
}

SolveResult solve(const Shape& s, const Grid& puzzle, int64_t limit) {
  SolveResult r;
  Board b(s, puzzle);
  if (!b.init())
    return r;
  search(b, r, limit);
  return r;
}

bool solved_by_singles(const Shape& s, const Grid& puzzle) {
  Board b(s, puzzle);
  if (!b.init())
    return false;
  for (bool progress = true; progress;) {
    progress = false;
    // Naked singles.
    for (int i = 0; i < s.cells(); ++i)
      if (!b.g[size_t(i)]) {
        const Mask m = b.candidates(i);
        if (m == 0)
          return false;
        if (popcount(m) == 1) {
          b.set(i, __builtin_ctz(m));
          progress = true;
        }
      }
    // Hidden singles: per unit (rows, columns, boxes), a digit with one
    // place.
    for (int unit = 0; unit < 3 * s.n; ++unit) {
      std::vector<int> cells;
      const int u = unit % s.n;
      for (int k = 0; k < s.n; ++k) {
        if (unit < s.n)
          cells.push_back(u * s.n + k);
        else if (unit < 2 * s.n)
          cells.push_back(k * s.n + u);
        else {
          const int r0 = (u / (s.n / s.box_cols)) * s.box_rows;
          const int c0 = (u % (s.n / s.box_cols)) * s.box_cols;
          cells.push_back((r0 + k / s.box_cols) * s.n + c0 + k % s.box_cols);
        }
      }
      for (int d = 1; d <= s.n; ++d) {
        int place = -1, count = 0;
        bool present = false;
        for (int i : cells) {
          if (b.g[size_t(i)] == d)
            present = true;
          else if (!b.g[size_t(i)] && (b.candidates(i) & (1 << d))) {
            place = i;
            ++count;
          }
        }
        if (!present && count == 1) {
          b.set(place, d);
          progress = true;
        }
      }
    }
  }
  return std::find(b.g.begin(), b.g.end(), 0) == b.g.end();
}

std::string rule_broken(const Shape& s, const Grid& grid) {
  for (int i = 0; i < s.cells(); ++i)
    if (grid[size_t(i)] < 0 || grid[size_t(i)] > s.n)
      return "cell (" + std::to_string(i / s.n + 1) + ", " +
          std::to_string(i % s.n + 1) + ") holds " +
          std::to_string(grid[size_t(i)]) + ", not a digit 1-" +
          std::to_string(s.n);
  auto check = [&](const std::string& what, auto cell) -> std::string {
    for (int u = 0; u < s.n; ++u) {
      int seen[10] = {};
      for (int k = 0; k < s.n; ++k)
        if (int d = grid[size_t(cell(u, k))])
          if (++seen[d] == 2)
            return std::to_string(d) + " twice in " + what + " " +
                std::to_string(u + 1);
    }
    return "";
  };
  std::string why = check("row", [&](int u, int k) { return u * s.n + k; });
  if (why.empty())
    why = check("column", [&](int u, int k) { return k * s.n + u; });
  if (why.empty())
    why = check("box", [&](int u, int k) {
      const int r0 = (u / (s.n / s.box_cols)) * s.box_rows;
      const int c0 = (u % (s.n / s.box_cols)) * s.box_cols;
      return (r0 + k / s.box_cols) * s.n + c0 + k % s.box_cols;
    });
  return why;
}

Puzzle generate(const GenerateOptions& o, std::mt19937_64& rng) {
  const Shape& s = o.shape;
  // Tries before giving up on bounds that cannot be met.
  constexpr int kTries = 20000;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    Puzzle p;
    p.answer = random_full(s, rng);
    p.question = p.answer;
    const int lo = std::max(0, o.min_givens);
    const int hi = std::min(s.cells(), o.max_givens);
    const int target = o.minimal
        ? 0
        : std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
    std::vector<int> order(size_t(s.cells()));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    int givens = s.cells();
    for (int i : order) {
      if (givens <= target)
        break;
      const int8_t d = p.question[size_t(i)];
      p.question[size_t(i)] = 0;
      if (solve(s, p.question, 2).solutions == 1)
        --givens;
      else
        p.question[size_t(i)] = d;
    }
    if (givens < lo || givens > hi)
      continue;
    p.givens = givens;
    p.singles = solved_by_singles(s, p.question);
    p.nodes = solve(s, p.question, 2).nodes;
    if ((o.difficulty == "hard" || o.difficulty == "extreme") && p.singles)
      continue;
    if (o.difficulty == "extreme" && p.nodes < kExtremeNodes)
      continue;
    return p;
  }
  throw std::runtime_error(
      "no puzzle met the bounds in " + std::to_string(kTries) + " tries");
}

Symmetry random_symmetry(const Shape& s, std::mt19937_64& rng) {
  Symmetry t;
  t.digit = ascending(s.n);
  std::shuffle(t.digit.begin(), t.digit.end(), rng);
  t.digit.insert(t.digit.begin(), 0);
  t.row = block_permutation(s.n, s.box_rows, rng);
  t.col = block_permutation(s.n, s.box_cols, rng);
  t.transpose = s.box_rows == s.box_cols && (rng() & 1);
  return t;
}

Grid apply(const Shape& s, const Symmetry& t, const Grid& g) {
  Grid out(g.size());
  for (int i = 0; i < s.n; ++i)
    for (int j = 0; j < s.n; ++j) {
      const int8_t d = g[size_t(t.row[size_t(i)] * s.n + t.col[size_t(j)])];
      const size_t at = t.transpose ? size_t(j * s.n + i) : size_t(i * s.n + j);
      out[at] = int8_t(t.digit[size_t(d)]);
    }
  return out;
}

std::string canonical(const Shape& s, const Grid& g) {
  if (s.n > 6)
    return renumbered(g);
  const auto rows = all_block_permutations(s.n, s.box_rows);
  const auto cols = all_block_permutations(s.n, s.box_cols);
  Symmetry t;
  t.digit.resize(size_t(s.n) + 1);
  std::iota(t.digit.begin(), t.digit.end(), 0);
  std::string best;
  for (int tr = 0; tr < (s.box_rows == s.box_cols ? 2 : 1); ++tr)
    for (const auto& r : rows)
      for (const auto& c : cols) {
        t.row = r;
        t.col = c;
        t.transpose = tr == 1;
        std::string text = renumbered(apply(s, t, g));
        if (best.empty() || text < best)
          best = std::move(text);
      }
  return best;
}

std::string to_text(const Grid& g) {
  std::string out;
  for (int8_t d : g)
    out += d ? char('0' + d) : '.';
  return out;
}

Grid from_text(const std::string& text, const Shape& s, std::string* error) {
  Grid g;
  for (char ch : text) {
    if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t')
      continue;
    if (ch == '.' || ch == '0' || ch == '_')
      g.push_back(0);
    else if (ch >= '1' && ch <= char('0' + s.n))
      g.push_back(int8_t(ch - '0'));
    else {
      if (error)
        *error = std::string("'") + ch + "' is not a digit 1-" +
            std::to_string(s.n) + " or a blank ('.' or '0')";
      return {};
    }
  }
  if (int64_t(g.size()) != s.cells()) {
    if (error)
      *error = std::to_string(g.size()) + " cells where a " +
          std::to_string(s.n) + "x" + std::to_string(s.n) + " grid has " +
          std::to_string(s.cells());
    return {};
  }
  return g;
}

std::string pretty(const Shape& s, const Grid& g) {
  std::string out;
  for (int r = 0; r < s.n; ++r) {
    if (r > 0 && r % s.box_rows == 0) {
      for (int c = 0; c < s.n; ++c)
        out += std::string(c > 0 && c % s.box_cols == 0 ? "+-" : "") + "--";
      out.pop_back();
      out += "\n";
    }
    for (int c = 0; c < s.n; ++c) {
      if (c > 0 && c % s.box_cols == 0)
        out += "| ";
      const int8_t d = g[size_t(r * s.n + c)];
      out += d ? char('0' + d) : '.';
      out += ' ';
    }
    out.pop_back();
    out += "\n";
  }
  return out;
}

} // namespace orchard::data::sudoku
