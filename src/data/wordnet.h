// The default corpus: WordNet's glosses and example sentences, which Debian
// (wordnet-base) and Homebrew (wordnet) package, so Orchard's main job runs
// on a fresh machine without any data from the user.
//
// Reads the data.{noun,verb,adj,adv} files (format: wndb(5)) and writes
//   text_train.jsonl, text_val.jsonl  one {"text"} document per synset
//   chat_train.jsonl, chat_val.jsonl  {"messages"}: "What does 'X' mean?" ->
//                                     the gloss; "Use 'X' in a sentence." ->
//                                     an example
// split by headword (a hash of it): a held-out headword has no training
// document or conversation of its own (it may still appear inside another
// word's gloss), so validation measures generalisation to unseen words.
#pragma once

#include "core/machine.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::data {

struct WordnetOptions {
  std::string wordnet_dir; // "": search the usual places
  std::string out;
  double val_fraction = 0.05; // of headwords
};

struct WordnetStats {
  size_t synsets = 0, headwords = 0, val_headwords = 0;
  size_t train_documents = 0, val_documents = 0;
  size_t train_chats = 0, val_chats = 0;
  std::string wordnet_dir;
};

// The standard places: Debian's, then Homebrew's (Apple Silicon, Intel).
const std::vector<std::string>& wordnet_default_dirs();

// --wordnet-dir when given (and then only it), else $WNSEARCHDIR, else the
// first of `search` holding data.noun; UserError naming the package to
// install when none does.
std::string find_wordnet_dir(
    const std::string& given,
    const EnvLookup& env = process_env(),
    const std::vector<std::string>& search = wordnet_default_dirs());

// Whether `headword` is held out for validation (stable across runs and
// machines: FNV-1a of the word).
bool wordnet_is_val(const std::string& headword, double val_fraction);

WordnetStats build_wordnet_corpus(const WordnetOptions& opt);

} // namespace orchard::data
