// Wordle's rules (stages/grpo/wordle.h): feedback on repeated letters
// (worked by hand from the game's rule), consistency, and guess_value
// against a brute force over the secrets (expected bits removed).
#include "stages/grpo/wordle.h"

#include <gtest/gtest.h>

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

} // namespace
} // namespace orchard::grpo::wordle
