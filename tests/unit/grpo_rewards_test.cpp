// GRPO's built-in rewards on hand-written completions, and reward_cmd's
// protocol with its failures (a child that exits, hangs, or writes
// something other than named scores).
#include "core/error.h"
#include "stages/grpo/environment.h"
#include "stages/grpo/reward_process.h"
#include "stages/grpo/wordle.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

namespace orchard {
namespace {

using grpo::Example;

TEST(GrpoRewards, WordleScoresFormatValidityConsistencyInformationAndTheWin) {
  test::TempDir dir;
  const std::string words =
      dir.write("words.txt", "crane\ncrate\ntrace\nslate\nabbey\nbabes\nxx\nCAPS\n");
  auto env = grpo::make_environment({.name = "wordle", .words = words, .wordle_games = 20});
  // Secret crate, one earlier guess: slate.
  const Example e = grpo::wordle::turn_example("crate", {"slate"});
  EXPECT_EQ(e.columns["feedback"][0], "--GGG");
  const auto s = env->score(
      e,
      {"<think>t, e fit</think><guess>crate</guess>",
       "<think>hm</think><guess>CRANE</guess>",
       "<guess>zzzzz</guess>",
       "no tags at all"});
  ASSERT_EQ(s.size(), 4u);
  // format, valid_word, consistent, information, solved
  EXPECT_EQ(s[0][0], 1.0);
  EXPECT_EQ(s[0][1], 1.0);
  EXPECT_EQ(s[0][2], 1.0);
  EXPECT_EQ(s[0][4], 1.0);
  EXPECT_EQ(s[1][0], 1.0); // upper case is read as the word
  EXPECT_EQ(s[1][1], 1.0);
  EXPECT_EQ(s[1][2], 0.0); // slate's green T rules crane out
  EXPECT_EQ(s[1][4], 0.0);
  EXPECT_EQ(s[2][0], 0.5); // a five-letter guess without the <think> part
  EXPECT_EQ(s[2][1], 0.0);
  EXPECT_EQ(s[2][3], 0.0);
  EXPECT_EQ(s[3], (std::vector<double>{0, 0, 0, 0, 0}));
  // The information term is guess_value over the words still possible.
  const auto remaining = grpo::wordle::candidates(
      grpo::read_words(words, 5), {{"slate", grpo::wordle::feedback("crate", "slate")}});
  EXPECT_DOUBLE_EQ(s[0][3], grpo::wordle::guess_value("crate", remaining));
  EXPECT_EQ(env->reward_names().size(), 5u);
}

TEST(GrpoRewards, WordleTurnsShowFeedbackInTheGuidesNotation) {
  const Example e = grpo::wordle::turn_example("crane", {"eerie"});
  EXPECT_EQ(e.columns["feedback"][0], "--Y-G");
  const std::string user = e.messages[1]["content"];
  EXPECT_NE(user.find("E(x) E(x) R(-) I(x) E(✓)"), std::string::npos) << user;
  EXPECT_EQ(e.messages[0]["role"], "system");
}

TEST(GrpoRewards, AnswersReadTheTagOrTheLastNumber) {
  test::TempDir dir;
  std::string lines;
  for (int i = 0; i < 21; ++i)
    lines += "{\"prompt\": \"2+" + std::to_string(i) + "?\", \"answer\": \"" +
        std::to_string(2 + i) + "\"}\n";
  auto env = grpo::make_environment({.name = "answers", .data = dir.write("a.jsonl", lines)});
  EXPECT_EQ(env->train().size(), 20u);
  EXPECT_EQ(env->held_out().size(), 1u);
  const Example& e = env->train()[3]; // 2+3
  const auto s = env->score(
      e, {"<answer>5</answer>", "so it is 4, no, 5.0", "<answer>6</answer> 5", "five"});
  EXPECT_EQ(s[0], (std::vector<double>{1, 1}));
  EXPECT_EQ(s[1], (std::vector<double>{1, 0}));
  EXPECT_EQ(s[2], (std::vector<double>{0, 1})); // the tag wins over numbers
  EXPECT_EQ(s[3], (std::vector<double>{0, 0}));
}

TEST(GrpoRewards, BadRecordsNameTheFileAndLine) {
  test::TempDir dir;
  auto expect_error = [&](const std::string& text, const std::string& part) {
    const std::string f = dir.write("bad.jsonl", text);
    try {
      grpo::make_environment({.name = "answers", .data = f});
      FAIL() << "no error for " << text;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error("{\"prompt\": \"x\", \"answer\": \"1\"}\nnot json\n", "bad.jsonl:2");
  expect_error("{\"prompt\": \"x\"}\n", "no \"answer\"");
  expect_error("{\"question\": \"x\", \"answer\": 1}\n", "no \"prompt\"");
  expect_error(
      "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}], \"answer\": 1}\n",
      "ending with a user");
  EXPECT_THROW(grpo::make_environment({.name = "answers"}), UserError);
  EXPECT_THROW(grpo::make_environment({.name = "wordle", .words = dir.file("none")}), UserError);
}

TEST(GrpoRewards, LettersRewardAWordStartingWithTheLetter) {
  test::TempDir dir;
  auto env = grpo::make_environment(
      {.name = "letters", .words = dir.write("w.txt", "crane\nslate\n")});
  ASSERT_EQ(env->train().size(), 2u); // c and s
  const Example& c = env->train()[0];
  EXPECT_EQ(c.raw, "c:");
  const auto s = env->score(c, {" crane", " slate", " cranes", ""});
  EXPECT_EQ(s[0], (std::vector<double>{1, 1}));
  EXPECT_EQ(s[1], (std::vector<double>{0, 1}));
  EXPECT_EQ(s[2], (std::vector<double>{0, 0}));
  EXPECT_EQ(s[3], (std::vector<double>{0, 0}));
  EXPECT_EQ(env->default_weights(), (std::vector<double>{1.0, 0.1}));
}

TEST(GrpoRewards, WordnetRewardsNamingTheWordItsLikenessAndPartOfSpeech) {
  test::TempDir dir;
  auto q = [](const std::string& w, const std::string& pos) {
    return "{\"messages\": [{\"role\": \"user\", \"content\": \"What does '" +
        w + "' mean?\"}, {\"role\": \"assistant\", \"content\": \"'" + w +
        "' (" + pos + "): A gloss.\"}]}\n";
  };
  dir.write("wordnet/chat_train.jsonl", q("night", "noun") + q("run", "verb"));
  dir.write(
      "wordnet/chat_val.jsonl",
      q("causal agent", "noun") +
          "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n");
  auto env = grpo::make_environment(
      {.name = "wordnet", .data_dir = dir.path().string()});
  ASSERT_EQ(env->train().size(), 2u);
  ASSERT_EQ(env->held_out().size(), 1u); // the other question is not one
  const Example& night = env->train()[0];
  EXPECT_EQ(night.columns.at("word"), "night");
  EXPECT_EQ(night.columns.at("pos"), "noun");
  const auto s = env->score(
      night,
      {"'night' (noun): The dark.",
       "  'nacht' (noun): Dark.", // pairs " n" "ht" "t " of 6 and 6: 6/12
       "'night' (verb): To fall dark.",
       "The 'night' (noun) is dark.", // not how the answer opens
       "'night's end' (noun): Dawn.", // a quote inside the name
       "'night' noun",
       ""});
  EXPECT_EQ(s[0], (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(s[1], (std::vector<double>{0, 0.5, 1}));
  EXPECT_EQ(s[2], (std::vector<double>{1, 1, 0}));
  EXPECT_EQ(s[3], (std::vector<double>{0, 0, 0}));
  // "night's end" against "night": of 12 and 6 pairs, 5 shared: 10/18.
  EXPECT_EQ(s[4][0], 0);
  EXPECT_NEAR(s[4][1], 10.0 / 18.0, 1e-12);
  EXPECT_EQ(s[4][2], 1);
  EXPECT_EQ(s[5], (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(s[6], (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(env->default_weights(), (std::vector<double>{1.0, 0.5, 0.5}));
  // Right: the word and its part of speech, both.
  EXPECT_TRUE(env->success(s[0]));
  EXPECT_FALSE(env->success(s[1]));
  EXPECT_FALSE(env->success(s[2]));
  EXPECT_FALSE(env->success_label().empty());
}

std::string reward_error(const std::string& cmd, double timeout = 5) {
  try {
    grpo::RewardProcess p(cmd, timeout);
    p.score({{{"prompt", "p"}, {"completion", "c"}}, {{"prompt", "q"}, {"completion", "d"}}});
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(GrpoRewards, RewardProcessScoresEveryLineInOrder) {
  // A reward of 1 when the completion is "yes", and the length of the prompt.
  grpo::RewardProcess p(
      "while read -r line; do case \"$line\" in *'\"completion\":\"yes\"'*) "
      "echo '{\"yes\": 1, \"n\": 2}';; *) echo '{\"yes\": 0, \"n\": 3}';; esac; done",
      5);
  std::vector<nlohmann::json> req;
  for (int i = 0; i < 500; ++i) // more than a pipe's buffer holds
    req.push_back({{"prompt", std::string(300, 'x')}, {"completion", i % 3 ? "no" : "yes"}});
  auto s = p.score(req);
  ASSERT_EQ(s.size(), 500u);
  EXPECT_EQ(p.names(), (std::vector<std::string>{"n", "yes"}));
  for (int i = 0; i < 500; ++i)
    EXPECT_EQ(s[size_t(i)], (std::vector<double>{i % 3 ? 3.0 : 2.0, i % 3 ? 0.0 : 1.0}));
  // A second batch keeps the process.
  EXPECT_EQ(p.score({req[0]}).size(), 1u);
}

TEST(GrpoRewards, RewardProcessFailuresSayWhatWentWrong) {
  EXPECT_NE(reward_error("exit 3").find("exited"), std::string::npos);
  EXPECT_NE(reward_error("read x; echo '{\"a\": 1}'; exit 0").find("exited after answering 1 of 2"), std::string::npos);
  EXPECT_NE(reward_error("while read x; do echo hello; done").find("not a JSON object"), std::string::npos);
  EXPECT_NE(reward_error("while read x; do echo '{\"a\": \"high\"}'; done").find("not a number"), std::string::npos);
  EXPECT_NE(reward_error("sleep 30", 0.3).find("reward_timeout"), std::string::npos);
  EXPECT_NE(reward_error("read x; echo '{\"a\": 1}'; read y; echo '{\"b\": 1}'").find("\"a\" is missing"), std::string::npos);
}

// A reward command's own children go with it: a script that hangs in a
// child (here `sleep`, which the shell waits for) leaves nothing running
// once Orchard has given up on it.
TEST(GrpoRewards, AStoppedRewardProcessTakesItsChildrenWithIt) {
  test::TempDir t;
  const std::string pid_file = t.file("child.pid");
  const std::string err =
      reward_error("sleep 30 & echo $! > " + pid_file + "; wait", 0.3);
  EXPECT_NE(err.find("reward_timeout"), std::string::npos) << err;
  std::ifstream in(pid_file);
  pid_t child = 0;
  ASSERT_TRUE(in >> child) << "the command did not write its child's pid";
  // Gone, or a zombie waiting for its new parent to reap it.
  auto running = [&] {
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string pid, name, state;
    return stat >> pid >> name >> state && state != "Z";
  };
  for (int i = 0; i < 40 && running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(running()) << "sleep 30 (pid " << child << ") still runs";
  if (running())
    ::kill(child, SIGKILL);
}

} // namespace
} // namespace orchard
