#include "stages/grpo/environment.h"

#include "core/error.h"
#include "core/strings.h"
#include "data/wordnet.h"
#include "stages/grpo/wordle.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>

namespace orchard::grpo {
namespace fs = std::filesystem;

std::string default_word_list() {
  for (const char* p :
       {"/usr/share/dict/american-english", "/usr/share/dict/words"})
    if (fs::exists(p))
      return p;
  throw UserError(
      "no word list found (/usr/share/dict/american-english or "
      "/usr/share/dict/words). Install one: `sudo apt-get install wamerican` "
      "on Debian/Ubuntu (./orchard.sh setup does this); macOS has "
      "/usr/share/dict/words. Or give words=FILE, one word a line.");
}

std::vector<std::string> read_words(const std::string& path, size_t length) {
  std::ifstream in(path);
  if (!in)
    throw UserError(
        "cannot read the word list '" + path +
        "'; give words=FILE with one word a line.");
  std::set<std::string> words;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
      line.pop_back();
    if (line.empty() || (length && line.size() != length))
      continue;
    if (std::all_of(line.begin(), line.end(), [](unsigned char c) {
          return c >= 'a' && c <= 'z';
        }))
      words.insert(line);
  }
  if (words.empty())
    throw UserError(
        "the word list '" + path + "' has no lowercase words" +
        (length ? " of " + std::to_string(length) + " letters" : "") +
        "; give words=FILE with one word a line.");
  return {words.begin(), words.end()};
}

std::string last_tagged(const std::string& text, const std::string& tag) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t end = text.rfind(close);
  if (end == std::string::npos)
    return "";
  const size_t start = text.rfind(open, end);
  if (start == std::string::npos)
    return "";
  return text.substr(start + open.size(), end - start - open.size());
}

namespace {

nlohmann::json message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// FNV-1a, for splits that are the same on every machine.
uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// --- wordle ----------------------------------------------------------------

const char* kWordleRules =
    "You are playing Wordle. Guess the secret five-letter English word in "
    "six tries. After each guess every letter gets feedback: ✓ if it is in "
    "the word and in the right place, - if it is in the word but elsewhere, "
    "x if it is not in the word. Think step by step inside <think>...</think>"
    ", then give your guess inside <guess>...</guess>, for example "
    "<think>...</think><guess>crane</guess>.";

class WordleEnv : public Environment {
 public:
  WordleEnv(std::vector<std::string> words, const EnvironmentSpec& spec)
      : words_(std::move(words)), lookup_(words_.begin(), words_.end()) {
    train_ = wordle::make_turns(words_, spec.wordle_games, spec.seed, false);
    held_out_ = wordle::make_turns(
        words_, std::max<int64_t>(64, spec.wordle_games / 10),
        spec.seed + 1, true);
    if (train_.empty() || held_out_.empty())
      throw UserError(
          "the word list has too few words to make Wordle games; give "
          "words=FILE with more five-letter words.");
  }
  std::string describe() const override {
    return "Wordle turns from " + std::to_string(words_.size()) +
        " five-letter words (" + std::to_string(train_.size()) +
        " training, " + std::to_string(held_out_.size()) +
        " held-out turns with held-out secrets)";
  }
  std::vector<std::string> reward_names() const override {
    return {"format", "valid_word", "consistent", "information", "solved"};
  }
  std::string success_label() const override {
    return "turns solved";
  }
  bool success(const std::vector<double>& scores) const override {
    return scores.at(4) > 0;
  }
  std::vector<std::vector<double>> score(
      const Example& e,
      const std::vector<std::string>& completions) const override {
    const std::string secret = e.columns.at("secret");
    std::vector<wordle::Turn> turns;
    const auto& guesses = e.columns.at("guesses");
    const auto& fb = e.columns.at("feedback");
    for (size_t i = 0; i < guesses.size(); ++i)
      turns.push_back({guesses[i], fb[i]});
    // The words still possible: computed once for the group.
    const std::vector<std::string> remaining =
        wordle::candidates(words_, turns);
    static const std::regex shape(
        R"(^\s*<think>[\s\S]*</think>\s*<guess>\s*[A-Za-z]{5}\s*</guess>\s*$)");
    std::vector<std::vector<double>> out;
    for (const auto& c : completions) {
      const std::string guess = lower(trim(last_tagged(c, "guess")));
      const bool five = guess.size() == 5 &&
          std::all_of(guess.begin(), guess.end(), [](char ch) {
                          return ch >= 'a' && ch <= 'z';
                        });
      const double format = std::regex_match(c, shape) ? 1.0
          : five                                       ? 0.5
                                                       : 0.0;
      const bool valid = five && lookup_.count(guess);
      const bool fits = valid && wordle::consistent(guess, turns);
      const double info = valid ? wordle::guess_value(guess, remaining) : 0.0;
      out.push_back(
          {format,
           valid ? 1.0 : 0.0,
           fits ? 1.0 : 0.0,
           info,
           guess == secret ? 1.0 : 0.0});
    }
    return out;
  }

 private:
  std::vector<std::string> words_;
  std::set<std::string> lookup_;
};

// --- letters ---------------------------------------------------------------

// The first word of a completion, lowercase ("" if it does not start with
// letters).
std::string first_word(const std::string& text) {
  std::string w;
  size_t i = 0;
  while (i < text.size() && text[i] == ' ')
    ++i;
  for (; i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]));
       ++i)
    w += char(std::tolower(static_cast<unsigned char>(text[i])));
  return w;
}

class LettersEnv : public Environment {
 public:
  explicit LettersEnv(std::vector<std::string> words)
      : lookup_(words.begin(), words.end()) {
    std::set<char> starts;
    for (const auto& w : words)
      starts.insert(w[0]);
    for (char c : starts) {
      Example e;
      e.raw = std::string(1, c) + ":";
      e.messages = nlohmann::json::array(
          {message("user", "A word that starts with " + std::string(1, c))});
      e.columns = {{"letter", std::string(1, c)}};
      train_.push_back(e);
      held_out_.push_back(e);
    }
    count_ = words.size();
  }
  std::string describe() const override {
    return "a letter, answered with a word from " + std::to_string(count_) +
        " five-letter words that starts with it (held-out prompts are the "
        "same letters, sampled afresh)";
  }
  std::vector<std::string> reward_names() const override {
    return {"starts_with_letter", "valid_word"};
  }
  std::vector<double> default_weights() const override {
    return {1.0, 0.1};
  }
  std::string success_label() const override {
    return "words starting with the letter";
  }
  bool success(const std::vector<double>& scores) const override {
    return scores.at(0) > 0;
  }
  std::vector<std::vector<double>> score(
      const Example& e,
      const std::vector<std::string>& completions) const override {
    const std::string letter = e.columns.at("letter");
    std::vector<std::vector<double>> out;
    for (const auto& c : completions) {
      const std::string w = first_word(c);
      const bool valid = lookup_.count(w) > 0;
      out.push_back(
          {valid && w[0] == letter[0] ? 1.0 : 0.0, valid ? 1.0 : 0.0});
    }
    return out;
  }

 private:
  std::set<std::string> lookup_;
  size_t count_ = 0;
};

// --- answers and prompts -----------------------------------------------------

// A JSONL of {prompt|messages [, answer]}; every 20th record is held out.
void read_records(
    const std::string& path,
    bool need_answer,
    std::vector<Example>& train,
    std::vector<Example>& held_out) {
  std::ifstream in(path);
  if (!in)
    throw UserError(
        "cannot read data file '" + path + "'; give data=FILE, a JSONL of "
        "{\"prompt\": ..." + (need_answer ? ", \"answer\": ..." : "") + "}.");
  std::string line;
  int64_t n = 0, records = 0;
  while (std::getline(in, line)) {
    ++n;
    if (trim(line).empty())
      continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(where + ": not a JSON object (" + e.what() + ").");
    }
    if (!j.is_object())
      throw UserError(where + ": not a JSON object.");
    Example ex;
    ex.columns = j;
    if (j.contains("messages")) {
      const auto& m = j["messages"];
      bool ok = m.is_array() && !m.empty();
      for (const auto& msg : ok ? m : nlohmann::json::array())
        ok = ok && msg.is_object() && msg.contains("role") &&
            msg["role"].is_string() && msg.contains("content") &&
            msg["content"].is_string();
      if (!ok || m.back()["role"] == "assistant")
        throw UserError(
            where +
            ": \"messages\" must be a list of {\"role\", \"content\"} "
            "strings ending with a user (or system) message.");
      ex.messages = m;
      ex.raw = m.back()["content"];
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      ex.raw = j["prompt"];
      ex.messages = nlohmann::json::array({message("user", ex.raw)});
    } else {
      throw UserError(
          where + ": the record has no \"prompt\" string or \"messages\" "
                  "list.");
    }
    if (need_answer) {
      if (!j.contains("answer"))
        throw UserError(
            where + ": the record has no \"answer\"; env=answers scores "
                    "completions against it (env=prompts with reward_cmd "
                    "needs none).");
      if (!j["answer"].is_string())
        ex.columns["answer"] = j["answer"].dump();
    }
    (records++ % 20 == 19 ? held_out : train).push_back(std::move(ex));
  }
  if (train.empty())
    throw UserError("data file '" + path + "' has no records.");
  if (held_out.empty())
    held_out.push_back(train.back()); // too few to hold any out
}

// The answer in <answer>...</answer>, else the last number.
std::string extracted_answer(const std::string& text) {
  std::string a = trim(last_tagged(text, "answer"));
  if (!a.empty())
    return a;
  static const std::regex number(R"(-?[0-9][0-9,]*(\.[0-9]+)?)");
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number);
       it != std::sregex_iterator();
       ++it)
    last = it->str();
  return last;
}

// Answers compare as numbers when both are (1,000 == 1000.0), else as
// lowercase trimmed text.
bool same_answer(const std::string& got, const std::string& want) {
  auto as_number = [](std::string s, double& v) {
    s.erase(std::remove(s.begin(), s.end(), ','), s.end());
    if (s.empty())
      return false;
    char* end = nullptr;
    v = std::strtod(s.c_str(), &end);
    return end && *end == '\0';
  };
  double a = 0, b = 0;
  if (as_number(trim(got), a) && as_number(trim(want), b))
    return std::abs(a - b) < 1e-9 * std::max(1.0, std::abs(b));
  return !trim(got).empty() && lower(trim(got)) == lower(trim(want));
}

class AnswersEnv : public Environment {
 public:
  explicit AnswersEnv(const std::string& path) : path_(path) {
    read_records(path, true, train_, held_out_);
  }
  std::string describe() const override {
    return path_ + " (" + std::to_string(train_.size()) + " training, " +
        std::to_string(held_out_.size()) + " held-out prompts)";
  }
  std::vector<std::string> reward_names() const override {
    return {"exact_answer", "format"};
  }
  std::string success_label() const override {
    return "right answers";
  }
  bool success(const std::vector<double>& scores) const override {
    return scores.at(0) > 0;
  }
  std::vector<std::vector<double>> score(
      const Example& e,
      const std::vector<std::string>& completions) const override {
    const std::string want = e.columns.at("answer").get<std::string>();
    std::vector<std::vector<double>> out;
    for (const auto& c : completions)
      out.push_back(
          {same_answer(extracted_answer(c), want) ? 1.0 : 0.0,
           last_tagged(c, "answer").empty() ? 0.0 : 1.0});
    return out;
  }

 private:
  std::string path_;
};

class PromptsEnv : public Environment {
 public:
  explicit PromptsEnv(const std::string& path) : path_(path) {
    read_records(path, false, train_, held_out_);
  }
  std::string describe() const override {
    return path_ + " (" + std::to_string(train_.size()) + " training, " +
        std::to_string(held_out_.size()) + " held-out prompts; rewards from "
        "reward_cmd)";
  }
  std::vector<std::string> reward_names() const override {
    return {};
  }
  std::vector<std::vector<double>> score(
      const Example&,
      const std::vector<std::string>& completions) const override {
    return std::vector<std::vector<double>>(completions.size());
  }

 private:
  std::string path_;
};

// --- wordnet ---------------------------------------------------------------

// Dice's coefficient over the letter pairs of the two words, each padded
// with a space at both ends so one-letter words and the first and last
// letters count: 2|A and B| / (|A| + |B|) with pairs counted with
// multiplicity; 1 for equal words, 0 when no pair is shared.
double bigram_dice(const std::string& a, const std::string& b) {
  auto pairs = [](const std::string& w) {
    std::map<std::string, int> m;
    const std::string p = " " + w + " ";
    for (size_t i = 0; i + 1 < p.size(); ++i)
      ++m[p.substr(i, 2)];
    return m;
  };
  const auto pa = pairs(a), pb = pairs(b);
  int shared = 0;
  for (const auto& [k, n] : pa)
    if (auto it = pb.find(k); it != pb.end())
      shared += std::min(n, it->second);
  return 2.0 * shared / double(a.size() + 1 + b.size() + 1);
}


class WordnetEnv : public Environment {
 public:
  explicit WordnetEnv(const std::string& data_dir) {
    const std::string corpus = data_dir + "/wordnet";
    if (!fs::exists(corpus + "/chat_train.jsonl") ||
        !fs::exists(corpus + "/chat_val.jsonl"))
      data::build_wordnet_corpus({.out = corpus});
    read(corpus + "/chat_train.jsonl", train_);
    read(corpus + "/chat_val.jsonl", held_out_);
    if (train_.empty() || held_out_.empty())
      throw UserError(
          "the WordNet corpus in " + corpus +
          " has no \"What does 'X' mean?\" questions; delete the folder to "
          "rebuild it.");
  }
  std::string describe() const override {
    return "WordNet's \"What does 'X' mean?\" (" +
        std::to_string(train_.size()) + " training, " +
        std::to_string(held_out_.size()) + " held-out words)";
  }
  // names_word: the answer opens with the asked word in quotes, as the
  // corpus's answers do ("'causal agent' (noun): ..."); word_likeness: how
  // many of the word's letter pairs the quoted name shares (Dice's
  // coefficient over letter bigrams, 1 for the word itself), the signal a
  // small model that names some other word still gets; part_of_speech:
  // the "(noun)" after the name is WordNet's.
  std::vector<std::string> reward_names() const override {
    return {"names_word", "word_likeness", "part_of_speech"};
  }
  std::vector<double> default_weights() const override {
    return {1.0, 0.5, 0.5};
  }
  std::string success_label() const override {
    return "answers naming the word and its part of speech";
  }
  bool success(const std::vector<double>& scores) const override {
    return scores.at(0) > 0 && scores.at(2) > 0;
  }
  std::vector<std::vector<double>> score(
      const Example& e,
      const std::vector<std::string>& completions) const override {
    const std::string word = e.columns.at("word");
    const std::string pos = e.columns.at("pos");
    std::vector<std::vector<double>> out;
    for (const auto& c : completions) {
      const Named n = named(c);
      out.push_back(
          {n.name == word ? 1.0 : 0.0,
           n.found ? bigram_dice(lower(n.name), lower(word)) : 0.0,
           n.found && n.pos == pos ? 1.0 : 0.0});
    }
    return out;
  }

 private:
  struct Named {
    bool found = false;
    std::string name, pos;
  };
  // "'NAME' (POS)" at the start of the answer (after spaces); the name may
  // hold quotes ("'s"), so it ends at the first "' (".
  static Named named(const std::string& c) {
    Named n;
    const size_t open = c.find_first_not_of(" \n\t");
    if (open == std::string::npos || c[open] != '\'')
      return n;
    const size_t close = c.find("' (", open + 1);
    if (close == std::string::npos)
      return n;
    const size_t end = c.find(')', close + 3);
    if (end == std::string::npos)
      return n;
    n.found = true;
    n.name = c.substr(open + 1, close - open - 1);
    n.pos = c.substr(close + 3, end - close - 3);
    return n;
  }

 private:
  static void read(const std::string& path, std::vector<Example>& out) {
    std::ifstream in(path);
    std::string line;
    static const std::regex q(R"(^What does '(.+)' mean\?$)");
    static const std::regex a(R"(^'(.+)' \(([a-z]+)\): )");
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("messages") ||
          j["messages"].size() < 2)
        continue; // the corpus Orchard wrote; other questions are skipped
      const std::string question = j["messages"][0].value("content", "");
      const std::string answer = j["messages"][1].value("content", "");
      std::smatch mq, ma;
      if (!std::regex_match(question, mq, q) ||
          !std::regex_search(answer, ma, a))
        continue;
      Example e;
      e.raw = question;
      e.messages = nlohmann::json::array({message("user", question)});
      e.columns = {
          {"word", mq[1].str()},
          {"pos", ma[2].str()},
          {"reference", answer}};
      out.push_back(std::move(e));
    }
  }
};

} // namespace

namespace wordle {

Example turn_example(
    const std::string& secret,
    const std::vector<std::string>& guesses) {
  Example e;
  std::string user;
  std::vector<std::string> fb;
  if (guesses.empty()) {
    user = "Make your first guess.";
  } else {
    user = "Your guesses so far:\n";
    for (const auto& g : guesses) {
      fb.push_back(feedback(secret, g));
      user += notation(g, fb.back()) + "\n";
    }
    user += "Make your next guess.";
  }
  e.messages = nlohmann::json::array(
      {message("system", kWordleRules), message("user", user)});
  e.raw = std::string(kWordleRules) + "\n\n" + user + "\n";
  e.columns = {{"secret", secret}, {"guesses", guesses}, {"feedback", fb}};
  return e;
}

Game play(
    const std::string& secret,
    const std::set<std::string>& lookup,
    const std::function<std::string(const Example& turn, int index)>& reply) {
  Game game;
  for (int turn = 0; turn < 6 && !game.solved; ++turn) {
    const std::string answer = reply(turn_example(secret, game.guesses), turn);
    std::string word;
    for (char c : last_tagged(answer, "guess"))
      if (!std::isspace(static_cast<unsigned char>(c)))
        word += char(std::tolower(static_cast<unsigned char>(c)));
    if (!lookup.count(word)) {
      ++game.lost_turns;
      continue;
    }
    game.guesses.push_back(word);
    game.solved = word == secret;
  }
  return game;
}

std::vector<Example> make_turns(
    const std::vector<std::string>& words,
    int64_t count,
    uint64_t seed,
    bool held_out) {
  // Secrets: a tenth of the words (by a hash) are held out.
  std::vector<std::string> secrets;
  for (const auto& w : words)
    if ((fnv(w) % 10 == 0) == held_out)
      secrets.push_back(w);
  std::vector<Example> out;
  if (secrets.empty())
    return out;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    const std::string& secret = secrets[rng() % secrets.size()];
    const int turns = int(rng() % 5); // 0-4 earlier guesses
    std::vector<std::string> guesses;
    std::vector<Turn> seen;
    for (int t = 0; t < turns; ++t) {
      // A plausible player: a word consistent with the feedback so far.
      std::vector<std::string> c = candidates(words, seen);
      c.erase(std::remove(c.begin(), c.end(), secret), c.end());
      if (c.empty())
        break;
      const std::string g = c[rng() % c.size()];
      guesses.push_back(g);
      seen.push_back({g, feedback(secret, g)});
    }
    out.push_back(turn_example(secret, guesses));
  }
  return out;
}

} // namespace wordle

std::unique_ptr<Environment> make_environment(const EnvironmentSpec& spec) {
  const bool needs_data = spec.name == "answers" || spec.name == "prompts";
  if (needs_data && spec.data.empty())
    throw UserError(
        "env=" + spec.name + " needs data=FILE, a JSONL of {\"prompt\"" +
        (spec.name == "answers" ? ", \"answer\"" : "") + "} records.");
  if (spec.name == "wordle" || spec.name == "letters") {
    const std::string list =
        spec.words.empty() ? default_word_list() : spec.words;
    auto words = read_words(list, 5);
    if (spec.name == "letters")
      return std::make_unique<LettersEnv>(std::move(words));
    return std::make_unique<WordleEnv>(std::move(words), spec);
  }
  if (spec.name == "answers")
    return std::make_unique<AnswersEnv>(spec.data);
  if (spec.name == "prompts")
    return std::make_unique<PromptsEnv>(spec.data);
  if (spec.name == "wordnet")
    return std::make_unique<WordnetEnv>(spec.data_dir);
  throw UserError(
      "env=" + spec.name +
      " is not an environment; the environments are wordle, answers, "
      "wordnet, letters and prompts.");
}

} // namespace orchard::grpo
