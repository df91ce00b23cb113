// Wordle's rules for the GRPO environment (env=wordle): the feedback a
// guess gets, whether a word agrees with all feedback so far, and how much
// a guess is expected to tell (the guide's guess_value). Word-list
// arithmetic only: prompts, parsing completions and rewards build on it.
//
// Feedback is five characters: 'G' right place, 'Y' elsewhere in the word,
// '-' absent. Repeated letters follow the game: greens first, then yellows
// left to right while the secret still has unused copies of the letter;
// further copies are absent (secret CRANE, guess EERIE: "--Y-G"). A rule
// of set membership, as in the guide's script, marks both E's yellow.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace orchard::grpo::wordle {

constexpr int kLetters = 5;

// Feedback for `guess` against `secret`, both five lowercase letters.
std::string feedback(const std::string& secret, const std::string& guess);

// One earlier turn: the guess and the feedback it got.
using Turn = std::pair<std::string, std::string>;

// Whether `word` as the secret would have given every turn's feedback.
bool consistent(const std::string& word, const std::vector<Turn>& turns);

// The words of `words` consistent with `turns`.
std::vector<std::string> candidates(
    const std::vector<std::string>& words,
    const std::vector<Turn>& turns);

// The expected information of `guess` over `remaining` (each equally likely
// the secret): the entropy in bits of the feedback it would get, divided by
// log2 of their count, so 1 when every outcome is a different pattern and 0
// when all give the same (or at most one word remains).
double guess_value(
    const std::string& guess,
    const std::vector<std::string>& remaining);

// The guide's notation for a turn: each letter in upper case with ✓ (right
// place), - (elsewhere) or x (absent): "F(x) R(✓) O(-) S(x) T(x)".
std::string notation(const std::string& guess, const std::string& feedback);

} // namespace orchard::grpo::wordle
