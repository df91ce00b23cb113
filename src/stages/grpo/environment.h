// GRPO's environments: the prompts a run trains on, the prompts it holds
// out, and the built-in reward functions that score completions.
//
//   wordle   a turn of Wordle: the secret, earlier guesses with feedback in
//            the guide's notation; answers <think>...</think><guess>W</guess>
//   answers  data=FILE of {prompt|messages, answer}: the answer in
//            <answer>...</answer> or, GSM8K style, the last number
//   wordnet  the default corpus's "What does 'X' mean?": the answer names
//            the word and its part of speech as WordNet has it
//   letters  a letter; a dictionary word that starts with it (the small
//            task that shows learning on a CPU)
//   prompts  data=FILE of {prompt|messages}; rewards from reward_cmd only
//
// Rewards are numbers per completion, one per named function; the stage
// adds reward_cmd's after them and weighs them with reward_weights.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace orchard::grpo {

// One prompt: the conversation to continue (a system and user message, or
// a record's messages), the text itself for prompt_format=raw, and the
// record's columns (what reward_cmd sees besides the completion).
struct Example {
  nlohmann::json messages = nlohmann::json::array(); // [{role, content}]
  std::string raw;
  nlohmann::json columns = nlohmann::json::object();
};

class Environment {
 public:
  virtual ~Environment() = default;
  // "Wordle turns from 4,512 words (...)".
  virtual std::string describe() const = 0;
  virtual std::vector<std::string> reward_names() const = 0;
  // The weights used when reward_weights is not set (1 for each).
  virtual std::vector<double> default_weights() const {
    return std::vector<double>(reward_names().size(), 1.0);
  }
  // What counts as answered right, for reports ("solved", "the word and
  // its part of speech named"); "" when the environment has no such
  // notion. `success` reads it from one completion's scores.
  virtual std::string success_label() const {
    return "";
  }
  virtual bool success(const std::vector<double>& scores) const {
    (void)scores;
    return false;
  }
  // Scores of each completion of `example`, in reward_names() order.
  virtual std::vector<std::vector<double>> score(
      const Example& example,
      const std::vector<std::string>& completions) const = 0;
  const std::vector<Example>& train() const {
    return train_;
  }
  const std::vector<Example>& held_out() const {
    return held_out_;
  }

 protected:
  std::vector<Example> train_, held_out_;
};

struct EnvironmentSpec {
  std::string name;     // wordle | answers | wordnet | letters | prompts
  std::string data;     // answers, prompts: the JSONL file
  std::string words;    // wordle, letters: the word list ("": the system's)
  std::string data_dir; // wordnet: where the default corpus is built
  uint64_t seed = 42;   // wordle's generated games
  int64_t wordle_games = 2000; // training turns generated for wordle
};

// UserError naming the file and line for a bad record, a missing word list
// (and the package that has one), or an environment without prompts.
std::unique_ptr<Environment> make_environment(const EnvironmentSpec& spec);

// The system's word list: Debian's wamerican, else /usr/share/dict/words.
std::string default_word_list();
// The lowercase words of `length` letters a-z in `path`, sorted and unique
// (length 0: every such word). UserError when the file is missing or holds
// none.
std::vector<std::string> read_words(const std::string& path, size_t length);

// The text inside the last <tag>...</tag> of `text`; "" when there is none.
std::string last_tagged(const std::string& text, const std::string& tag);

namespace wordle {
// `count` Wordle turns as training prompts: a secret, 0-4 earlier guesses
// consistent with the feedback before them, from `words`, seeded. Columns:
// secret, guesses, feedback (five characters each: G, Y, -).
std::vector<Example> make_turns(
    const std::vector<std::string>& words,
    int64_t count,
    uint64_t seed,
    bool held_out);
// The prompt for a turn (the rules, then the guesses so far in the guide's
// notation).
Example turn_example(
    const std::string& secret,
    const std::vector<std::string>& guesses);

// One whole game as `orchard eval env=wordle` plays it: up to six turns,
// each asking `reply` for an answer to the turn's prompt (turn_example with
// the valid guesses so far); the word in its last <guess>...</guess>,
// spaces dropped and lower-cased, counts when it is in `lookup`, and a turn
// whose answer is not a word is lost (no feedback). Ends when solved.
struct Game {
  std::vector<std::string> guesses; // the valid ones, in order
  int64_t lost_turns = 0;           // answers that were not a word
  bool solved = false;
};
Game play(
    const std::string& secret,
    const std::set<std::string>& lookup,
    const std::function<std::string(const Example& turn, int index)>& reply);
} // namespace wordle

} // namespace orchard::grpo
