#include "stages/grpo/wordle.h"

#include <array>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>

namespace orchard::grpo::wordle {

namespace {

void check_word(const std::string& w, const char* what) {
  bool ok = w.size() == size_t(kLetters);
  for (char c : w)
    ok = ok && c >= 'a' && c <= 'z';
  if (!ok)
    throw std::invalid_argument(
        std::string("[wordle] ") + what + " '" + w +
        "' is not five lowercase letters");
}

} // namespace

std::string feedback(const std::string& secret, const std::string& guess) {
  check_word(secret, "secret");
  check_word(guess, "guess");
  std::string out(size_t(kLetters), '-');
  std::array<int, 26> unused{}; // the secret's letters not matched green
  for (int i = 0; i < kLetters; ++i) {
    if (guess[size_t(i)] == secret[size_t(i)])
      out[size_t(i)] = 'G';
    else
      ++unused[size_t(secret[size_t(i)] - 'a')];
  }
  for (int i = 0; i < kLetters; ++i) {
    if (out[size_t(i)] == 'G')
      continue;
    int& left = unused[size_t(guess[size_t(i)] - 'a')];
    if (left > 0) {
      out[size_t(i)] = 'Y';
      --left;
    }
  }
  return out;
}

bool consistent(const std::string& word, const std::vector<Turn>& turns) {
  for (const auto& [guess, fb] : turns)
    if (feedback(word, guess) != fb)
      return false;
  return true;
}

std::vector<std::string> candidates(
    const std::vector<std::string>& words,
    const std::vector<Turn>& turns) {
  std::vector<std::string> out;
  for (const auto& w : words)
    if (consistent(w, turns))
      out.push_back(w);
  return out;
}

double guess_value(
    const std::string& guess,
    const std::vector<std::string>& remaining) {
  if (remaining.size() <= 1)
    return 0.0;
  std::map<std::string, int> outcomes;
  for (const auto& w : remaining)
    ++outcomes[feedback(w, guess)];
  const double n = double(remaining.size());
  double bits = 0;
  for (const auto& [pattern, count] : outcomes) {
    const double p = double(count) / n;
    bits -= p * std::log2(p);
  }
  return bits / std::log2(n);
}

std::string notation(const std::string& guess, const std::string& fb) {
  if (guess.size() != fb.size())
    throw std::invalid_argument("[wordle] guess and feedback differ in length");
  std::string out;
  for (size_t i = 0; i < guess.size(); ++i) {
    if (i > 0)
      out += ' ';
    out += char(std::toupper(static_cast<unsigned char>(guess[i])));
    out += fb[i] == 'G' ? "(\u2713)" : fb[i] == 'Y' ? "(-)" : "(x)";
  }
  return out;
}

} // namespace orchard::grpo::wordle
