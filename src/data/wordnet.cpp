#include "data/wordnet.h"

#include "core/error.h"
#include "core/files.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace orchard::data {
namespace {
namespace fs = std::filesystem;

struct Synset {
  std::string pos;                // noun, verb, adjective, adverb
  std::vector<std::string> words; // spaces, not underscores
  std::string definition;
  std::vector<std::string> examples;
};

// "laying_waste" -> "laying waste"; adjectives may carry "(a)", "(p)", "(ip)".
std::string clean_word(std::string w) {
  auto paren = w.find('(');
  if (paren != std::string::npos)
    w = w.substr(0, paren);
  for (auto& c : w)
    if (c == '_')
      c = ' ';
  return w;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" ;\t\r\n");
  size_t b = s.find_last_not_of(" ;\t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string sentence(std::string s) {
  s = trim(s);
  if (!s.empty() && std::islower(static_cast<unsigned char>(s[0])))
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  if (!s.empty() && !std::strchr(".!?", s.back()))
    s += '.';
  return s;
}

// One data.* line: offset lex_filenum ss_type w_cnt (word lex_id)* ... | gloss
bool parse_line(const std::string& line, const std::string& pos, Synset& out) {
  if (line.empty() || line[0] == ' ')
    return false; // the license header
  auto bar = line.find(" | ");
  if (bar == std::string::npos)
    return false;
  std::istringstream in(line.substr(0, bar));
  std::string offset, lexfile, type, count_hex;
  if (!(in >> offset >> lexfile >> type >> count_hex))
    return false;
  int count = std::stoi(count_hex, nullptr, 16);
  out = Synset{};
  out.pos = pos;
  for (int i = 0; i < count; ++i) {
    std::string word, lex_id;
    if (!(in >> word >> lex_id))
      return false;
    out.words.push_back(clean_word(word));
  }
  // The gloss: a definition, then examples in double quotes.
  std::string gloss = line.substr(bar + 3);
  size_t quote = gloss.find('"');
  out.definition = trim(gloss.substr(0, quote));
  while (quote != std::string::npos) {
    size_t end = gloss.find('"', quote + 1);
    if (end == std::string::npos)
      break;
    std::string ex = trim(gloss.substr(quote + 1, end - quote - 1));
    if (!ex.empty())
      out.examples.push_back(ex);
    quote = gloss.find('"', end + 1);
  }
  return !out.words.empty() && !out.definition.empty();
}

nlohmann::json chat(const std::string& question, const std::string& answer) {
  return {
      {"messages",
       {{{"role", "user"}, {"content", question}},
        {{"role", "assistant"}, {"content", answer}}}}};
}

} // namespace

const std::vector<std::string>& wordnet_default_dirs() {
  static const std::vector<std::string> dirs = {
      "/usr/share/wordnet",
      "/opt/homebrew/opt/wordnet/dict",
      "/usr/local/opt/wordnet/dict",
      "/opt/homebrew/share/wordnet/dict",
      "/usr/local/share/wordnet/dict"};
  return dirs;
}

std::string find_wordnet_dir(
    const std::string& given,
    const EnvLookup& env,
    const std::vector<std::string>& search) {
  auto has_data = [](const std::string& d) {
    return fs::exists(fs::path(d) / "data.noun");
  };
  if (!given.empty()) {
    if (!has_data(given))
      throw UserError(
          "--wordnet-dir '" + given + "' has no WordNet data (data.noun).");
    return given;
  }
  if (auto v = env("WNSEARCHDIR"); v && has_data(*v))
    return *v;
  for (const auto& d : search)
    if (has_data(d))
      return d;
  throw UserError(
      "WordNet was not found (looked for data.noun in /usr/share/wordnet and "
      "Homebrew's folders). Install it: `sudo apt-get install wordnet-base` "
      "on Debian/Ubuntu, `brew install wordnet` on macOS (./orchard.sh setup "
      "does this), or pass --wordnet-dir.");
}

bool wordnet_is_val(const std::string& headword, double val_fraction) {
  uint64_t h = 1469598103934665603ull; // FNV-1a 64
  for (unsigned char c : headword) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return double(h % 1'000'000) < val_fraction * 1'000'000;
}

WordnetStats build_wordnet_corpus(const WordnetOptions& opt) {
  WordnetStats st;
  st.wordnet_dir = find_wordnet_dir(opt.wordnet_dir);
  fs::create_directories(opt.out);
  std::ostringstream text[2], chats[2]; // [0] train, [1] val
  std::set<std::string> heads, val_heads, asked_meaning, asked_example;
  const std::pair<const char*, const char*> files[] = {
      {"data.noun", "noun"},
      {"data.verb", "verb"},
      {"data.adj", "adjective"},
      {"data.adv", "adverb"}};
  for (const auto& [file, pos] : files) {
    std::string path = st.wordnet_dir + "/" + file;
    std::ifstream in(path);
    if (!in)
      throw UserError("cannot read WordNet file '" + path + "'.", kExitFailure);
    std::string line;
    Synset s;
    while (std::getline(in, line)) {
      if (!parse_line(line, pos, s))
        continue;
      ++st.synsets;
      const std::string& head = s.words.front();
      bool val = wordnet_is_val(head, opt.val_fraction);
      heads.insert(head);
      if (val)
        val_heads.insert(head);
      std::string doc = s.words.front();
      for (size_t i = 1; i < s.words.size(); ++i)
        doc += ", " + s.words[i];
      doc += " (" + s.pos + "): " + sentence(s.definition);
      for (const auto& ex : s.examples)
        doc += " Example: " + sentence(ex);
      text[val] << nlohmann::json{{"text", doc}}.dump() << "\n";
      ++(val ? st.val_documents : st.train_documents);
      if (asked_meaning.insert(head).second) {
        chats[val] << chat(
                          "What does '" + head + "' mean?",
                          "'" + head + "' (" + s.pos +
                              "): " + sentence(s.definition))
                          .dump()
                   << "\n";
        ++(val ? st.val_chats : st.train_chats);
      }
      if (!s.examples.empty() && asked_example.insert(head).second) {
        chats[val] << chat(
                          "Use '" + head + "' in a sentence.",
                          sentence(s.examples.front()))
                          .dump()
                   << "\n";
        ++(val ? st.val_chats : st.train_chats);
      }
    }
  }
  if (st.synsets == 0)
    throw UserError(
        "no synsets found in '" + st.wordnet_dir +
            "': the WordNet files are empty or damaged; reinstall wordnet-base.",
        kExitFailure);
  st.headwords = heads.size();
  st.val_headwords = val_heads.size();
  const char* names[2] = {"train", "val"};
  for (int v = 0; v < 2; ++v) {
    atomic_write(opt.out + "/text_" + names[v] + ".jsonl", text[v].str());
    atomic_write(opt.out + "/chat_" + names[v] + ".jsonl", chats[v].str());
  }
  return st;
}

} // namespace orchard::data
