// Single-core encoding throughput: orchard's tokenizer on a text file.
//   orchard_bench_tokenizer TOKENIZER_DIR TEXT_FILE [REPEATS]
// Prints MB/s, tokens and a checksum of the ids (compare with the peer's).
#include "text/tokenizer_io.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr, "usage: %s TOKENIZER_DIR TEXT_FILE [REPEATS]\n", argv[0]);
    return 2;
  }
  auto tok = orchard::text::load_tokenizer(argv[1]);
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  double best = 1e30;
  uint64_t tokens = 0, checksum = 0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<orchard::text::TokenId> ids;
    auto t0 = std::chrono::steady_clock::now();
    tok.encode_ordinary(text, ids);
    double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    best = std::min(best, s);
    tokens = ids.size();
    checksum = 0;
    for (auto id : ids)
      checksum = checksum * 31 + id;
  }
  std::printf(
      "orchard  %8.2f MB/s  %zu bytes  %llu tokens  checksum %llu\n",
      text.size() / best / 1e6,
      text.size(),
      (unsigned long long)tokens,
      (unsigned long long)checksum);
  return 0;
}
