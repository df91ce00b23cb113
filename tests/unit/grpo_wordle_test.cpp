// Wordle's rules (stages/grpo/wordle.h): feedback on repeated letters
// (worked by hand from the game's rule), consistency, and guess_value
// against a brute force over the secrets (expected bits removed); whole
// games as `orchard eval env=wordle` plays them, by scripted players that
// see only the prompts.
#include "stages/grpo/wordle.h"
#include "stages/grpo/environment.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include <cmath>
#include <stdexcept>

namespace orchard::grpo::wordle {
namespace {

TEST(Wordle, FeedbackGivesGreensFirstThenYellowsWhileCopiesRemain) {
  EXPECT_EQ(feedback("crane", "eerie"), "--Y-G"); // the case
  EXPECT_EQ(feedback("abbey", "babes"), "YYGG-");
  EXPECT_EQ(feedback("speed", "eerie"), "YY---");
  EXPECT_EQ(feedback("speed", "steep"), "G-GGY");
  EXPECT_EQ(feedback("llama", "hello"), "--YY-");
  EXPECT_EQ(feedback("crane", "crane"), "GGGGG");
  EXPECT_EQ(feedback("frost", "brine"), "-G---");
  EXPECT_THROW(feedback("crane", "Crane"), std::invalid_argument);
  EXPECT_THROW(feedback("cranes", "crane"), std::invalid_argument);
}

TEST(Wordle, ConsistentWordsReproduceEveryTurn) {
  const std::vector<Turn> turns = {{"eerie", "--Y-G"}};
  EXPECT_TRUE(consistent("crane", turns));
  EXPECT_FALSE(consistent("eerie", turns));
  const std::vector<std::string> words = {"crane", "frame", "grade", "bring", "raise"};
  // An R but not third, E last and no other E, no I: bring has an I,
  // raise an I too.
  EXPECT_EQ(candidates(words, turns),
            (std::vector<std::string>{"crane", "frame", "grade"}));
}

TEST(Wordle, GuessValueIsTheExpectedInformationOverTheRemainingWords) {
  const std::vector<std::string> words = {
      "crane", "frame", "grade", "brave", "crate", "trace", "grace", "drape"};
  for (const std::string guess : {"crane", "brave", "eerie", "tramp"}) {
    // Brute force: for each possible secret, the bits learned are log2 of
    // how many words the feedback leaves out of all of them.
    double bits = 0;
    for (const auto& secret : words) {
      const auto left = candidates(words, {{guess, feedback(secret, guess)}});
      bits += std::log2(double(words.size()) / double(left.size()));
    }
    bits /= double(words.size());
    EXPECT_NEAR(guess_value(guess, words), bits / std::log2(double(words.size())), 1e-12)
        << guess;
  }
  // A guess that separates nothing is worth 0; one that separates all, 1.
  EXPECT_EQ(guess_value("zzzzz", {"crane", "crate"}), 0.0);
  EXPECT_NEAR(guess_value("crane", {"crane", "crate"}), 1.0, 1e-12);
  EXPECT_EQ(guess_value("crane", {"crane"}), 0.0);
}

TEST(Wordle, NotationIsTheGuides) {
  EXPECT_EQ(notation("frost", feedback("brine", "frost")),
            "F(x) R(\u2713) O(x) S(x) T(x)");
  EXPECT_EQ(notation("eerie", "--Y-G"), "E(x) E(x) R(-) I(x) E(\u2713)");
}

// The turns a prompt shows, read back from the guide's notation.
std::vector<Turn> turns_in(const std::string& prompt) {
  std::vector<Turn> out;
  std::istringstream lines(prompt);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() < 5 * 4 || line[1] != '(')
      continue;
    std::string word, fb;
    for (size_t i = 0; i < line.size();) {
      word += char(std::tolower(static_cast<unsigned char>(line[i])));
      const size_t close = line.find(')', i);
      const std::string mark = line.substr(i + 2, close - i - 2);
      fb += mark == "\u2713" ? 'G' : mark == "-" ? 'Y' : '-';
      i = close + 2;
    }
    out.push_back({word, fb});
  }
  return out;
}

// A player that reads the feedback off each prompt and guesses the first
// word consistent with it wins every game, in the number of guesses the
// same strategy takes with the feedback computed directly.
TEST(Wordle, GamesArePlayedTurnByTurnFromThePromptsFeedback) {
  const std::vector<std::string> words = {
      "crane", "slate", "brine", "frost", "eerie", "abbey", "babes", "speed"};
  const std::set<std::string> lookup(words.begin(), words.end());
  for (const auto& secret : words) {
    int asked = 0;
    const Game game = play(secret, lookup, [&](const Example& e, int turn) {
      EXPECT_EQ(turn, asked++);
      const auto seen = turns_in(e.messages.back()["content"].get<std::string>());
      EXPECT_EQ(seen.size(), size_t(turn));
      return "<think>" + std::to_string(seen.size()) + " so far</think><guess> " +
          candidates(words, seen).front() + " </guess>";
    });
    std::vector<Turn> direct;
    std::string g;
    do {
      g = candidates(words, direct).front();
      direct.push_back({g, feedback(secret, g)});
    } while (g != secret);
    EXPECT_TRUE(game.solved) << secret;
    EXPECT_EQ(game.lost_turns, 0);
    ASSERT_EQ(game.guesses.size(), direct.size()) << secret;
    for (size_t i = 0; i < direct.size(); ++i)
      EXPECT_EQ(game.guesses[i], direct[i].first);
    EXPECT_EQ(asked, int(direct.size()));
  }
}

TEST(Wordle, AnswersThatAreNotWordsLoseTheirTurnAndSixTurnsEndTheGame) {
  const std::set<std::string> lookup = {"crane", "slate", "brine"};
  // Not a word, no tags, upper case with spaces (counts), then the secret.
  const std::vector<std::string> answers = {
      "<guess>zzzzz</guess>", "crane", "<guess> S L A T E </guess>",
      "<guess>brine</guess>"};
  Game game = play("brine", lookup, [&](const Example&, int turn) {
    return answers.at(size_t(turn));
  });
  EXPECT_TRUE(game.solved);
  EXPECT_EQ(game.lost_turns, 2);
  EXPECT_EQ(game.guesses, (std::vector<std::string>{"slate", "brine"}));
  // A player that never finds it: six guesses, not solved.
  int turns = 0;
  game = play("brine", lookup, [&](const Example&, int) {
    ++turns;
    return std::string("<guess>crane</guess>");
  });
  EXPECT_FALSE(game.solved);
  EXPECT_EQ(turns, 6);
  EXPECT_EQ(game.guesses.size(), 6u);
}

} // namespace
} // namespace orchard::grpo::wordle
