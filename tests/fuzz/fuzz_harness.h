// A seeded, structure-aware mutation harness for Orchard's readers.
//
// Each reader's test starts from valid seeds (fixtures, or files built in the
// test) and feeds it mutated copies: bytes flipped, inserted, deleted or
// duplicated, files truncated, JSON values swapped for other types, huge and
// negative numbers, deep nesting, duplicated keys, invalid UTF-8. Every input
// must end in success or orchard::UserError; anything else (another
// exception, std::bad_alloc, a crash, an input running past its time limit)
// fails the test, prints the input and saves it under fuzz-failures/ for a
// regression case.
//
// Not libFuzzer: no coverage feedback, so the mutations carry the knowledge
// of each format instead. Input k of a reader is the same on every run for a
// given seed (ORCHARD_FUZZ_SEED); how many inputs run depends on the time
// budget (ORCHARD_FUZZ_SECONDS per reader).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::fuzz {

// splitmix64: small, fast, and the same sequence on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n) {
    return next() % n;
  }
  bool chance(double p) {
    return double(next() >> 11) * 0x1.0p-53 < p;
  }
  template <class T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }

 private:
  uint64_t state_;
};

// Integers at the edges readers get wrong: 0, -1, powers of two around the
// 16/32/64-bit limits, INT64_MIN.
const std::vector<uint64_t>& interesting_integers();

// One random byte-level mutation: flip a bit, set a byte to an edge value,
// insert or delete a run, duplicate a run, truncate, splice in invalid
// UTF-8, or overwrite 4 or 8 bytes with an edge integer.
std::string mutate_bytes(std::string s, Rng& rng);

// 1 to 3 structural mutations of a JSON document (a random node replaced by
// another type, an edge number, a long string, deep nesting or invalid
// UTF-8; a key deleted, renamed or duplicated; an array grown), sometimes
// followed by byte mutations. Falls back to bytes when `text` is not JSON.
std::string mutate_json(const std::string& text, Rng& rng);

// Splices 1 to 4 snippets from `dictionary` in at random places (or replaces
// a run with one), sometimes followed by byte mutations: for text formats
// whose structure is a token grammar (templates, YAML, key=value).
std::string mutate_with(
    const std::string& text,
    const std::vector<std::string>& dictionary,
    Rng& rng);

// Little-endian integer writes for binary headers.
void put_le(std::string& s, size_t at, uint64_t v, size_t bytes);

// A fuzzing campaign for one reader: runs inputs until the time budget is
// spent, counts outcomes, and reports failures.
class Campaign {
 public:
  explicit Campaign(std::string reader);
  ~Campaign();
  Campaign(const Campaign&) = delete;
  Campaign& operator=(const Campaign&) = delete;

  // Whether to try another input: fewer failures than the cap, and fewer
  // inputs tried than `seeds` (which always run; the time budget starts
  // after them) or budget left.
  bool more(size_t seeds = 1);
  // The generator for the next input, seeded from (seed, input index).
  Rng next_rng();
  // Runs one input: `input` is what gets printed and saved if `read` fails
  // (several files are joined with a header line each).
  void run(const std::string& input, const std::function<void()>& read);

  size_t tried() const {
    return tried_;
  }
  size_t failures() const {
    return failures_;
  }

 private:
  std::string reader_;
  uint64_t seed_;
  double seconds_;
  double start_, budget_start_ = 0;
  size_t tried_ = 0, ok_ = 0, user_errors_ = 0, failures_ = 0;
};

// Runs `read` once on a fixed input and returns "" for success or a
// UserError, or a description of what else escaped: for regression cases.
std::string outcome_of(const std::function<void()>& read);

// A readable excerpt of an input: printable ASCII kept, the rest escaped,
// cut to `limit` bytes.
std::string printable(const std::string& input, size_t limit = 1500);

} // namespace orchard::fuzz
