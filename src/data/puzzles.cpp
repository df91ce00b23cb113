#include "data/puzzles.h"

#include "core/error.h"
#include "core/files.h"
#include "core/progress.h"
#include "core/strings.h"
#include "data/chat_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace orchard::data {
namespace {

namespace fs = std::filesystem;

// Grid tokens (ARC's layout): padding, the end-of-grid marker, colour + 2.
constexpr int64_t kPad = 0, kEndOfGrid = 1, kColourOffset = 2;
constexpr int64_t kColours = 10;
constexpr int64_t kMaxGridSide = 30; // ARC's largest grids

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  for (char ch : line) {
    if (ch == ',')
      out.emplace_back();
    else if (ch != '\r')
      out.back() += ch;
  }
  return out;
}

PuzzleSet from_rows(
    std::string kind,
    int64_t side,
    int64_t vocab,
    const std::vector<int64_t>& in,
    const std::vector<int64_t>& out,
    const std::vector<int64_t>& ids,
    int64_t num_ids) {
  PuzzleSet p;
  p.kind = std::move(kind);
  p.side = side;
  p.vocab = vocab;
  p.num_puzzle_ids = std::max<int64_t>(1, num_ids);
  const int64_t n = int64_t(ids.size()), l = side * side;
  p.inputs = torch::tensor(in, torch::kLong).view({n, l});
  p.labels = torch::tensor(out, torch::kLong).view({n, l});
  p.puzzle_ids = torch::tensor(ids, torch::kLong);
  return p;
}

// The records of a puzzle CSV (header and blank lines skipped).
struct CsvRow {
  int64_t line = 0;
  std::string question, answer;
};

constexpr const char* kSudokuLayout =
    "Each line is source,question,answer,rating (Sudoku-Extreme's layout) "
    "with n*n cells, '.' for a blank.";
constexpr const char* kMazeLayout =
    "Each line is source,question,answer,rating with side*side cells: '#' "
    "wall, '.' open, 'S' start, 'G' goal, and 'o' on the answer's shortest "
    "path.";

UserError bad_row(
    const std::string& path,
    int64_t line,
    const std::string& why,
    const char* layout) {
  return UserError(
      path + ":" + std::to_string(line) + ": " + why + ". " + layout);
}

std::vector<CsvRow> read_csv_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw UserError("cannot read " + path + ": " + std::strerror(errno) + ".");
  std::vector<CsvRow> rows;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (trim(line).empty() || (line_no == 1 && trim(line) == kPuzzleCsvHeader))
      continue;
    const auto f = split_csv(line);
    if (f.size() != 4)
      throw bad_row(
          path,
          line_no,
          std::to_string(f.size()) + " fields where 4 were expected",
          kSudokuLayout);
    rows.push_back({line_no, trim(f[1]), trim(f[2])});
  }
  if (rows.empty())
    throw UserError(
        path +
        " holds no puzzles; write lines of source,question,answer,"
        "rating.");
  return rows;
}

PuzzleSet read_sudoku_csv(
    const std::string& path,
    const std::vector<CsvRow>& rows) {
  std::vector<int64_t> q, a;
  const sudoku::Shape shape =
      sudoku::shape_for_cells(int64_t(rows.front().question.size()));
  if (shape.n == 0)
    throw bad_row(
        path,
        rows.front().line,
        "a question of " + std::to_string(rows.front().question.size()) +
            " characters; Orchard reads 4x4, 6x6 and 9x9 grids (16, 36 or 81 "
            "cells)",
        kSudokuLayout);
  for (const CsvRow& r : rows) {
    auto bad = [&](const std::string& why) {
      return bad_row(path, r.line, why, kSudokuLayout);
    };
    std::string err;
    const sudoku::Grid qg = sudoku::from_text(r.question, shape, &err);
    if (qg.empty())
      throw bad("question: " + err);
    const sudoku::Grid ag = sudoku::from_text(r.answer, shape, &err);
    if (ag.empty())
      throw bad("answer: " + err);
    if (std::find(ag.begin(), ag.end(), 0) != ag.end())
      throw bad("the answer has blanks; it must be the whole solved grid");
    if (const std::string why = sudoku::rule_broken(shape, ag); !why.empty())
      throw bad("the answer breaks a rule: " + why);
    for (size_t i = 0; i < qg.size(); ++i)
      if (qg[i] && qg[i] != ag[i])
        throw bad(
            "the answer changes the given " + std::to_string(qg[i]) +
            " at row " + std::to_string(i / size_t(shape.n) + 1) + ", column " +
            std::to_string(i % size_t(shape.n) + 1));
    for (int64_t t : sudoku_tokens(qg))
      q.push_back(t);
    for (int64_t t : sudoku_tokens(ag))
      a.push_back(t);
  }
  std::vector<int64_t> ids(rows.size(), 0);
  PuzzleSet p = from_rows("sudoku", shape.n, shape.n + 2, q, a, ids, 1);
  p.shape = shape;
  p.source = path;
  return p;
}

PuzzleSet read_maze_csv(
    const std::string& path,
    const std::vector<CsvRow>& rows) {
  const int side = maze::side_for_cells(int64_t(rows.front().question.size()));
  if (side < 3)
    throw bad_row(
        path,
        rows.front().line,
        "a maze of " + std::to_string(rows.front().question.size()) +
            " cells, not a square of side 3 or more",
        kMazeLayout);
  std::vector<int64_t> q, a;
  for (const CsvRow& r : rows) {
    auto bad = [&](const std::string& why) {
      return bad_row(path, r.line, why, kMazeLayout);
    };
    if (auto why = maze::text_problem(side, r.question, false); !why.empty())
      throw bad("question: " + why);
    if (auto why = maze::text_problem(side, r.answer, true); !why.empty())
      throw bad("answer: " + why);
    if (auto why = maze::answer_problem(side, r.question, r.answer);
        !why.empty())
      throw bad("the answer is not the shortest path: " + why);
    for (int64_t t : maze_tokens(r.question))
      q.push_back(t);
    for (int64_t t : maze_tokens(r.answer))
      a.push_back(t);
  }
  std::vector<int64_t> ids(rows.size(), 0);
  PuzzleSet p = from_rows("maze", side, kMazeVocab, q, a, ids, 1);
  p.source = path;
  return p;
}

PuzzleSet read_grid_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw UserError("cannot read " + path + ": " + std::strerror(errno) + ".");
  struct Record {
    std::vector<std::vector<int64_t>> input, output;
    int64_t id = 0;
  };
  std::vector<Record> records;
  std::map<std::string, int64_t> names;
  std::string line;
  int64_t line_no = 0, side = 0;
  auto bad = [&](const std::string& why) {
    return UserError(
        path + ":" + std::to_string(line_no) + ": " + why +
        ". Each line is {\"input\": [[...]], \"output\": [[...]]} with "
        "colours 0-9 (ARC's layout), and optionally \"puzzle\": a name.");
  };
  auto grid = [&](const nlohmann::json& j, const char* key) {
    if (!j.contains(key) || !j[key].is_array() || j[key].empty())
      throw bad(
          std::string("\"") + key + "\" is missing or not a list of rows");
    std::vector<std::vector<int64_t>> g;
    for (const auto& row : j[key]) {
      if (!row.is_array() || row.empty())
        throw bad(std::string("a row of \"") + key + "\" is not a list");
      std::vector<int64_t> r;
      for (const auto& v : row) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
            v.get<int64_t>() >= kColours)
          throw bad(
              std::string("\"") + key + "\" holds " + v.dump() +
              ", not a colour 0-9");
        r.push_back(v.get<int64_t>());
      }
      if (!g.empty() && r.size() != g.front().size())
        throw bad(std::string("the rows of \"") + key + "\" differ in length");
      g.push_back(std::move(r));
    }
    if (int64_t(g.size()) > kMaxGridSide ||
        int64_t(g.front().size()) > kMaxGridSide)
      throw bad(
          std::string("\"") + key + "\" is larger than 30 x 30 (ARC's limit)");
    side = std::max({side, int64_t(g.size()), int64_t(g.front().size())});
    return g;
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty())
      continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object())
      throw bad("not a JSON object");
    Record r;
    r.input = grid(j, "input");
    r.output = grid(j, "output");
    if (j.contains("puzzle")) {
      if (!j["puzzle"].is_string())
        throw bad("\"puzzle\" is not a string");
      r.id =
          names.emplace(j["puzzle"].get<std::string>(), int64_t(names.size()))
              .first->second;
    }
    records.push_back(std::move(r));
  }
  if (records.empty())
    throw UserError(path + " holds no grids.");
  const int64_t canvas = side + 1; // room for the end-of-grid marker
  std::vector<int64_t> in_tok, out_tok, ids;
  auto draw = [&](const std::vector<std::vector<int64_t>>& g,
                  std::vector<int64_t>& out) {
    std::vector<int64_t> c(size_t(canvas * canvas), kPad);
    const int64_t h = int64_t(g.size()), w = int64_t(g.front().size());
    for (int64_t r = 0; r < h; ++r)
      for (int64_t k = 0; k < w; ++k)
        c[size_t(r * canvas + k)] = g[size_t(r)][size_t(k)] + kColourOffset;
    for (int64_t r = 0; r <= h; ++r)
      c[size_t(r * canvas + w)] = kEndOfGrid;
    for (int64_t k = 0; k <= w; ++k)
      c[size_t(h * canvas + k)] = kEndOfGrid;
    out.insert(out.end(), c.begin(), c.end());
  };
  for (const auto& r : records) {
    draw(r.input, in_tok);
    draw(r.output, out_tok);
    ids.push_back(r.id);
  }
  PuzzleSet p = from_rows(
      "grid",
      canvas,
      kColours + kColourOffset,
      in_tok,
      out_tok,
      ids,
      int64_t(names.size()));
  p.source = path;
  return p;
}

PuzzleSet read_chat_rows(const std::string& path) {
  const ChatFile f = ChatFile::open(path);
  if (f.size() == 0)
    throw UserError(path + " holds no conversations.");
  int64_t longest = 0, top = 0;
  for (size_t i = 0; i < f.size(); ++i)
    longest = std::max(longest, int64_t(f.length(i)) - 1);
  if (longest < 1)
    throw UserError(
        path +
        " holds conversations of one token; next-token training needs "
        "two or more.");
  const int64_t n = int64_t(f.size());
  std::vector<int64_t> in(size_t(n * longest), 0),
      out(size_t(n * longest), kIgnoreLabel), ids(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t* t = f.ids(size_t(i));
    const uint8_t* m = f.mask(size_t(i));
    for (int64_t k = 0; k + 1 < int64_t(f.length(size_t(i))); ++k) {
      in[size_t(i * longest + k)] = t[k];
      if (m[k + 1])
        out[size_t(i * longest + k)] = t[k + 1];
      top = std::max<int64_t>(top, t[k + 1]);
    }
    top = std::max<int64_t>(top, t[0]);
  }
  PuzzleSet p;
  p.kind = "chat";
  p.length = longest;
  p.vocab = top + 1;
  p.inputs = torch::tensor(in, torch::kLong).view({n, longest});
  p.labels = torch::tensor(out, torch::kLong).view({n, longest});
  p.puzzle_ids = torch::tensor(ids, torch::kLong);
  p.source = path;
  return p;
}

std::string with_count(const PuzzleSet& p, const char* what) {
  return p.source + " (" + std::to_string(p.size()) + " " + what + ")";
}

} // namespace

PuzzleSet PuzzleSet::slice(int64_t from, int64_t count) const {
  PuzzleSet p = *this;
  p.inputs = inputs.narrow(0, from, count);
  p.labels = labels.narrow(0, from, count);
  p.puzzle_ids = puzzle_ids.narrow(0, from, count);
  return p;
}

std::vector<int64_t> sudoku_tokens(const sudoku::Grid& g) {
  std::vector<int64_t> t;
  for (int8_t d : g)
    t.push_back(int64_t(d) + 1);
  return t;
}

std::vector<int64_t> maze_tokens(const std::string& grid) {
  static const std::string chars = {
      maze::kWall, maze::kOpen, maze::kStart, maze::kGoal, maze::kPath};
  std::vector<int64_t> t;
  for (char ch : grid)
    t.push_back(int64_t(chars.find(ch)) + 1); // npos + 1: padding
  return t;
}

std::string maze_from_tokens(const int64_t* tokens, int64_t cells) {
  static const std::string chars = {
      '?', maze::kWall, maze::kOpen, maze::kStart, maze::kGoal, maze::kPath};
  std::string g(size_t(cells), '?');
  for (int64_t i = 0; i < cells; ++i)
    if (tokens[i] >= 0 && tokens[i] < int64_t(chars.size()))
      g[size_t(i)] = chars[size_t(tokens[i])];
  return g;
}

sudoku::Grid sudoku_from_tokens(const int64_t* tokens, int64_t cells) {
  sudoku::Grid g(static_cast<size_t>(cells));
  for (int64_t i = 0; i < cells; ++i)
    g[size_t(i)] = int8_t(std::max<int64_t>(0, tokens[i] - 1));
  return g;
}

PuzzleSet read_puzzles(const std::string& path) {
  const std::string ext = lower(fs::path(path).extension().string());
  if (ext == ".csv") {
    const std::vector<CsvRow> rows = read_csv_rows(path);
    if (rows.front().question.find(maze::kWall) != std::string::npos)
      return read_maze_csv(path, rows);
    return read_sudoku_csv(path, rows);
  }
  if (ext == ".jsonl" || ext == ".json")
    return read_grid_jsonl(path);
  if (ext == ".chat")
    return read_chat_rows(path);
  throw UserError(
      path +
      ": puzzles are read from .csv (Sudoku-Extreme's layout, mazes), "
      ".jsonl (ARC-style grids) or .chat (`orchard data chat`) files.");
}

PuzzleSplits load_puzzle_splits(const std::string& path) {
  PuzzleSplits s;
  if (fs::is_directory(path)) {
    auto find = [&](const std::string& stem) {
      for (const char* ext : {".csv", ".jsonl", ".chat"})
        if (fs::exists(fs::path(path) / (stem + ext)))
          return (fs::path(path) / (stem + ext)).string();
      throw UserError(
          "data=" + path + " has no " + stem + ".csv or " + stem +
          ".jsonl; make one with `orchard data sudoku --out " + path +
          "` (or `orchard data maze`), or give data= a single puzzle "
          "file.");
    };
    s.train = read_puzzles(find("train"));
    s.test = read_puzzles(find("test"));
    if (s.train.kind == "chat" && s.test.kind == "chat") {
      // Conversations of different lengths: both padded to the longer.
      const int64_t l = std::max(s.train.length, s.test.length);
      for (PuzzleSet* p : {&s.train, &s.test}) {
        const int64_t more = l - p->length;
        p->inputs = torch::constant_pad_nd(p->inputs, {0, more}, 0);
        p->labels = torch::constant_pad_nd(p->labels, {0, more}, kIgnoreLabel);
        p->length = l;
      }
      s.train.vocab = s.test.vocab = std::max(s.train.vocab, s.test.vocab);
    }
    if (s.train.kind != s.test.kind || s.train.seq_len() != s.test.seq_len())
      throw UserError(
          "data=" + path + ": train and test hold different puzzles (" +
          std::to_string(s.train.side) + " and " + std::to_string(s.test.side) +
          " cells a side); they must match.");
    s.description =
        with_count(s.train, "train") + ", " + with_count(s.test, "held out");
    return s;
  }
  if (!fs::exists(path))
    throw UserError(
        "data=" + path +
        " does not exist; give a folder from `orchard data "
        "sudoku` or `orchard data maze`, or a .csv/.jsonl puzzle file.");
  PuzzleSet all = read_puzzles(path);
  if (all.size() < 2)
    throw UserError(
        path +
        " holds one puzzle; training needs some to learn from and "
        "some held out (every 10th).");
  // Every 10th record held out.
  auto idx = torch::arange(all.size());
  auto test_mask = (idx % 10) == 9;
  if (all.size() < 10)
    test_mask = idx == all.size() - 1;
  auto pick = [&](const torch::Tensor& m) {
    PuzzleSet p = all;
    p.inputs = all.inputs.index({m});
    p.labels = all.labels.index({m});
    p.puzzle_ids = all.puzzle_ids.index({m});
    return p;
  };
  s.train = pick(~test_mask);
  s.test = pick(test_mask);
  s.description = path + " (" + std::to_string(s.train.size()) +
      " train, every 10th of them held out: " + std::to_string(s.test.size()) +
      ")";
  return s;
}

SudokuDataSummary write_sudoku_dataset(const SudokuDataOptions& o) {
  sudoku::Shape shape = sudoku::shape_for_cells(int64_t(o.n) * o.n);
  if (shape.n == 0)
    throw UserError(
        "--size " + std::to_string(o.n) +
        ": Orchard makes 4x4, 6x6 and 9x9 "
        "Sudoku (--size 4, 6 or 9).");
  if (o.count < 2)
    throw UserError(
        "--count must be at least 2 (some to train, some held out).");
  if (o.augment < 0)
    throw UserError("--augment is a count of copies per puzzle, 0 or more.");
  if (!(o.test_fraction > 0 && o.test_fraction < 1))
    throw UserError("--test-fraction is between 0 and 1, such as 0.1.");
  sudoku::GenerateOptions g;
  g.shape = shape;
  g.max_givens = shape.cells();
  std::string difficulty = o.difficulty;
  if (difficulty == "auto")
    difficulty = shape.n == 9 ? "easy" : "minimal";
  if (difficulty == "easy") {
    g.min_givens = 26;
    g.max_givens = 36;
  } else if (difficulty == "hard") {
    g.max_givens = 25;
    g.difficulty = "hard";
  } else if (difficulty == "extreme") {
    g.minimal = true;
    g.difficulty = "extreme";
  } else if (difficulty == "minimal") {
    g.minimal = true;
  } else if (difficulty != "any") {
    throw UserError(
        "--difficulty " + difficulty +
        ": one of auto, easy (26-36 givens), hard (at most 25, not solved "
        "by singles), extreme (minimal, not by singles, long search), "
        "minimal, any.");
  }
  if (!o.givens.empty()) {
    int lo = 0, hi = 0;
    char dash = 0;
    std::istringstream in(o.givens);
    if (!(in >> lo >> dash >> hi) || dash != '-' || lo < 0 || hi < lo ||
        hi > shape.cells())
      throw UserError(
          "--givens " + o.givens + ": give MIN-MAX within 0-" +
          std::to_string(shape.cells()) + ", such as 26-36.");
    g.min_givens = std::max(g.min_givens, lo);
    g.max_givens = std::min(g.max_givens, hi);
    g.minimal = false;
    if (g.min_givens > g.max_givens)
      throw UserError(
          "--givens " + o.givens + " and --difficulty " + difficulty +
          " leave no number of givens; widen --givens.");
  }
  if (o.out.empty())
    throw UserError("--out DIR is needed: the folder to write the puzzles to.");

  // Puzzle i comes from its own generator (seed, i): the same set on any
  // number of threads. More are made until `count` distinct ones exist.
  std::vector<sudoku::Puzzle> made;
  std::atomic<bool> failed{false};
  auto make = [&](int64_t from, int64_t to) {
    made.resize(size_t(to));
    std::atomic<int64_t> next{from};
    auto work = [&] {
      for (int64_t i; (i = next++) < to && !failed;) {
        std::seed_seq seq{uint64_t(o.seed), uint64_t(i), uint64_t(0x50d0)};
        std::mt19937_64 rng(seq);
        try {
          made[size_t(i)] = sudoku::generate(g, rng);
        } catch (const std::runtime_error&) {
          failed = true;
        }
      }
    };
    const int64_t threads = o.threads > 0
        ? o.threads
        : std::max<int64_t>(1, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
      pool.emplace_back(work);
    for (auto& t : pool)
      t.join();
    if (failed)
      throw UserError(
          "no " + std::to_string(shape.n) + "x" + std::to_string(shape.n) +
          " puzzle met --difficulty " + difficulty +
          (o.givens.empty() ? "" : " --givens " + o.givens) +
          " in many tries; widen the bounds.");
  };

  // The split is by class where the shape has enough of them: a test
  // puzzle's class (every puzzle its symmetries reach) never appears in
  // training, as a puzzle or as an augmented copy, and a class appears once.
  // Small grids have few classes (4x4 minimal puzzles: 14), so when classes
  // would keep fewer than half of the first `count` puzzles the split is by
  // puzzle instead: no test puzzle appears in training, not even as an
  // augmented copy, but its class does.
  const int64_t want_test =
      std::max<int64_t>(1, int64_t(double(o.count) * o.test_fraction + 0.5));
  std::vector<std::string> classes, texts;
  std::set<std::string> distinct_classes, seen, test_texts;
  std::vector<size_t> test, train;
  int64_t repeats = 0;
  bool by_class = true;
  // Rounds of generation until `count` distinct puzzles (at most this many
  // times `count` made in all: a shape with fewer distinct puzzles stops).
  constexpr int64_t kMaxMadePerWanted = 20;
  // Puzzles made[from...] into test, then train, each class (or puzzle)
  // once.
  auto take = [&](size_t from) {
    const auto& key = by_class ? classes : texts;
    for (size_t i = from; i < made.size(); ++i) {
      if (int64_t(test.size() + train.size()) == o.count)
        return;
      if (!seen.insert(key[i]).second) {
        ++repeats;
        continue;
      }
      if (int64_t(test.size()) < want_test) {
        test.push_back(i);
        test_texts.insert(texts[i]);
      } else {
        train.push_back(i);
      }
    }
  };
  for (int64_t have = 0; int64_t(test.size() + train.size()) < o.count &&
       have < kMaxMadePerWanted * o.count;) {
    const int64_t missing = o.count - int64_t(test.size() + train.size());
    make(have, have + (have == 0 ? o.count : 2 * missing));
    for (size_t i = size_t(have); i < made.size(); ++i) {
      classes.push_back(sudoku::canonical(shape, made[i].question));
      texts.push_back(sudoku::to_text(made[i].question));
      distinct_classes.insert(classes.back());
    }
    if (have == 0)
      by_class = int64_t(distinct_classes.size()) * 2 >= o.count;
    take(size_t(have));
    have = int64_t(made.size());
    if (by_class && have >= kMaxMadePerWanted * o.count &&
        int64_t(test.size() + train.size()) < o.count) {
      // Fewer classes than the count: split by puzzle after all.
      by_class = false;
      test.clear();
      train.clear();
      seen.clear();
      test_texts.clear();
      repeats = 0;
      take(0);
    }
  }
  const int64_t distinct = int64_t(test.size() + train.size());
  if (distinct < o.count || train.empty())
    throw UserError(
        "only " + std::to_string(distinct) + " distinct " +
        std::to_string(shape.n) + "x" + std::to_string(shape.n) +
        " puzzles of --difficulty " + difficulty +
        (o.givens.empty() ? "" : " --givens " + o.givens) + " came out of " +
        std::to_string(made.size()) + " made (" + std::to_string(o.count) +
        " asked); lower --count to " +
        std::to_string(std::max<int64_t>(2, distinct)) +
        " or less, or change --difficulty or --givens.");

  fs::create_directories(o.out);
  auto row = [](const std::string& src, const sudoku::Puzzle& p) {
    return src + "," + sudoku::to_text(p.question) + "," +
        sudoku::to_text(p.answer) + "," + std::to_string(p.nodes) + "\n";
  };
  std::string train_csv = std::string(kPuzzleCsvHeader) + "\n";
  std::string test_csv = train_csv, puzzles_csv = train_csv;
  std::mt19937_64 aug_rng(uint64_t(o.seed) * 7919 + 17);
  int64_t train_rows = 0;
  for (size_t i : train) {
    train_csv += row("generated", made[i]);
    puzzles_csv += row("train", made[i]);
    ++train_rows;
    for (int64_t k = 0; k < o.augment; ++k) {
      const sudoku::Symmetry t = sudoku::random_symmetry(shape, aug_rng);
      sudoku::Puzzle a = made[i];
      a.question = sudoku::apply(shape, t, made[i].question);
      a.answer = sudoku::apply(shape, t, made[i].answer);
      if (test_texts.count(sudoku::to_text(a.question)))
        continue; // a held-out puzzle: never in training
      train_csv += row("augmented", a);
      ++train_rows;
    }
  }
  for (size_t i : test) {
    test_csv += row("generated", made[i]);
    puzzles_csv += row("test", made[i]);
  }
  atomic_write(o.out + "/train.csv", train_csv);
  atomic_write(o.out + "/test.csv", test_csv);
  atomic_write(o.out + "/puzzles.csv", puzzles_csv);

  // How hard the kept puzzles are.
  std::vector<int64_t> givens, nodes;
  int64_t singles = 0;
  std::vector<size_t> kept = test;
  kept.insert(kept.end(), train.begin(), train.end());
  for (size_t i : kept) {
    const sudoku::Puzzle& p = made[i];
    givens.push_back(p.givens);
    nodes.push_back(p.nodes);
    singles += p.singles;
  }
  std::sort(givens.begin(), givens.end());
  std::sort(nodes.begin(), nodes.end());
  const double singles_share = double(singles) / double(kept.size());
  nlohmann::json meta = {
      {"kind", "sudoku"},
      {"size", shape.n},
      {"box", {shape.box_rows, shape.box_cols}},
      {"count", o.count},
      {"train_puzzles", int64_t(train.size())},
      {"train_rows", train_rows},
      {"test_puzzles", int64_t(test.size())},
      {"repeats_dropped", repeats},
      {"symmetry_classes", int64_t(distinct_classes.size())},
      {"augment", o.augment},
      {"difficulty", difficulty},
      {"givens",
       {{"min", givens.front()},
        {"median", givens[givens.size() / 2]},
        {"max", givens.back()}}},
      {"solved_by_singles", singles_share},
      {"search_nodes",
       {{"median", nodes[nodes.size() / 2]},
        {"max", nodes.back()},
        {"what",
         "cells a backtracking solver (most-constrained cell first) tries "
         "to find the solution and prove it unique; the rating column"}}},
      {"seed", o.seed},
      {"generator_version", sudoku::kGeneratorVersion},
      {"split",
       by_class ? (shape.n > 6
                       ? "by puzzle up to digit relabelling (9x9: the "
                         "geometric symmetries are too many to canonicalise; "
                         "a repeat among random puzzles is vanishingly rare)"
                       : "by class under the Sudoku symmetries: no test "
                         "puzzle's class is in training")
                : "by puzzle: too few symmetry classes for a split by class; "
                  "no test puzzle is in training, augmented copies included"},
      {"layout", "Sudoku-Extreme: source,question,answer,rating"}};
  atomic_write(o.out + "/dataset.json", meta.dump(2) + "\n");
  SudokuDataSummary s;
  s.train = int64_t(train.size());
  s.test = int64_t(test.size());
  s.train_rows = train_rows;
  s.by_class = by_class;
  s.difficulty_text = "givens " + std::to_string(givens.front()) + "-" +
      std::to_string(givens.back()) + " (median " +
      std::to_string(givens[givens.size() / 2]) + "), " +
      fmt("%.0f", 100 * singles_share) +
      " % solved by singles alone, median search " +
      std::to_string(nodes[nodes.size() / 2]) + " nodes";
  return s;
}

} // namespace orchard::data
