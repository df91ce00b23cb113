// `orchard data text|chat|wordnet|wordle|sudoku|maze`: prepare training data.
// Thin: parse, call src/data, print the summary.
#include "cli/common.h"
#include "core/error.h"
#include "core/files.h"
#include "data/chat_prep.h"
#include "data/puzzles.h"
#include "data/text_prep.h"
#include "data/wordnet.h"
#include "stages/grpo/environment.h"

#include <nlohmann/json.hpp>
#include "text/chat_template.h"
#include "text/tokenizer_io.h"

#include <cstdio>
#include <iostream>
#include <memory>

namespace orchard::cli {

namespace {

// The options `orchard data sudoku` and `orchard data maze` share.
void add_puzzle_options(
    CLI::App* app,
    data::PuzzleDataOptions& o,
    const char* what,
    const char* copies) {
  app->add_option(
         "--count", o.count, std::string(what) + " before augmentation")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(2), int64_t(100'000'000)));
  app->add_option("--out", o.out, "the folder to write")->required();
  app->add_option("--augment", o.augment, copies)->capture_default_str();
  app->add_option("--test-fraction", o.test_fraction, "share held out")
      ->capture_default_str();
  app->add_option("--seed", o.seed, "seed")->capture_default_str();
}

} // namespace

Command register_data(CLI::App& root) {
  CLI::App* app = root.add_subcommand("data", "Prepare training data");
  app->require_subcommand(1);

  auto text_opt = std::make_shared<data::TextPrepOptions>();
  CLI::App* text = app->add_subcommand(
      "text", "Tokenize text into .bin shards (llm.c / modded-nanogpt format)");
  text->add_option(
          "--input",
          text_opt->inputs,
          "text files, .jsonl {\"text\"} files or folders")
      ->required();
  text->add_option(
          "--tokenizer", text_opt->tokenizer_path, "tokenizer folder or file")
      ->required();
  text->add_option("--out", text_opt->out, "folder for the shards")->required();
  text->add_option(
      "--name",
      text_opt->name,
      "shard name prefix (default: the first input's name)");
  text->add_option(
          "--val-fraction",
          text_opt->val_fraction,
          "share of documents for validation")
      ->capture_default_str();
  text->add_option("--shard-tokens", text_opt->shard_tokens, "tokens per shard")
      ->capture_default_str();
  text->add_option(
          "--split", text_opt->split, "auto (by --val-fraction), train or val")
      ->capture_default_str();

  auto chat_opt = std::make_shared<data::ChatPrepOptions>();
  auto chat_tok = std::make_shared<std::string>();
  auto chat_family = std::make_shared<std::string>();
  CLI::App* chat = app->add_subcommand(
      "chat", "Tokenize conversations into ids + loss masks (.chat)");
  chat->add_option(
          "--input",
          chat_opt->inputs,
          "JSONL or JSON-array chat files, or folders")
      ->required();
  *chat_tok = "gpt2";
  chat->add_option(
          "--tokenizer",
          *chat_tok,
          "tokenizer folder or file, or gpt2 (GPT-2's, built in)")
      ->capture_default_str();
  chat->add_option("--out", chat_opt->out, "output folder")->required();
  chat->add_option(
      "--name", chat_opt->name, "output name (default: the first input's)");
  chat->add_option(
          "--format",
          chat_opt->format,
          "auto|messages|sharegpt|completion|text")
      ->capture_default_str();
  chat->add_option(
      "--chat-template",
      *chat_family,
      "llama3|chatml|mistral|orchard|plain (default: the folder's own Jinja "
      "template, else the family its special tokens name)");
  chat->add_option(
          "--max-length",
          chat_opt->max_length,
          "tokens per conversation; longer ones are truncated")
      ->capture_default_str();
  chat->add_option(
      "--subsample-size",
      chat_opt->subsample,
      "keep N conversations, chosen by --seed");
  chat->add_option("--seed", chat_opt->seed, "seed for --subsample-size")
      ->capture_default_str();
  chat->add_flag(
      "--skip-bad",
      chat_opt->skip_bad,
      "count and skip bad records instead of stopping");

  auto wn_opt = std::make_shared<data::WordnetOptions>();
  CLI::App* wordnet = app->add_subcommand(
      "wordnet", "Build the default corpus (text + chat) from WordNet");
  wordnet->add_option(
      "--out", wn_opt->out, "output folder (default: <data dir>/wordnet)");
  wordnet->add_option(
      "--wordnet-dir",
      wn_opt->wordnet_dir,
      "WordNet dict folder (default: search)");
  wordnet
      ->add_option(
          "--val-fraction", wn_opt->val_fraction, "share of headwords held out")
      ->capture_default_str();

  struct WordleOptions {
    int64_t count = 100;
    uint64_t seed = 42;
    std::string out, words;
    bool held_out = false;
  };
  auto wd_opt = std::make_shared<WordleOptions>();
  CLI::App* wordle = app->add_subcommand(
      "wordle",
      "Write the Wordle turns GRPO's env=wordle trains on (JSONL: prompt, "
      "secret, guesses, feedback)");
  wordle->add_option("--count", wd_opt->count, "turns to write")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(10'000'000)));
  wordle->add_option("--seed", wd_opt->seed, "seed of the games")
      ->capture_default_str();
  wordle->add_option("--out", wd_opt->out, "the JSONL file to write")
      ->required();
  wordle->add_option(
      "--words",
      wd_opt->words,
      "word list, one word a line (default: the system's)");
  wordle->add_flag(
      "--held-out",
      wd_opt->held_out,
      "turns with the held-out secrets (a tenth of the words) instead");

  auto sd_opt = std::make_shared<data::SudokuDataOptions>();
  CLI::App* sudoku = app->add_subcommand(
      "sudoku",
      "Generate Sudoku with exactly one solution for stage=trm (train.csv, "
      "test.csv and puzzles.csv in Sudoku-Extreme's layout, dataset.json)");
  add_puzzle_options(
      sudoku,
      *sd_opt,
      "puzzles",
      "symmetric copies of each training puzzle (digits relabelled, bands, "
      "stacks, rows, columns, transpose)");
  sudoku->add_option("--size", sd_opt->n, "side: 4, 6 or 9")
      ->capture_default_str();
  sudoku->add_option(
      "--givens", sd_opt->givens, "MIN-MAX givens kept, such as 26-36");
  sudoku
      ->add_option(
          "--difficulty",
          sd_opt->difficulty,
          "auto (easy for 9x9, minimal otherwise), easy (26-36 givens), hard "
          "(<= 25, not solved by singles), extreme (minimal, not by singles, "
          "long search), minimal, any")
      ->capture_default_str();

  auto mz_opt = std::make_shared<data::MazeDataOptions>();
  CLI::App* maze = app->add_subcommand(
      "maze",
      "Generate mazes with exactly one shortest path for stage=trm "
      "(Maze-Hard's kind: 30x30, paths of 110 steps or more; train.csv, "
      "test.csv, puzzles.csv, dataset.json)");
  add_puzzle_options(
      maze,
      *mz_opt,
      "mazes",
      "turned and mirrored copies of each training maze (0-7)");
  maze->add_option("--size", mz_opt->side, "side (5-60)")
      ->capture_default_str();
  maze->add_option(
      "--min-path",
      mz_opt->min_path,
      "fewest steps from S to G (0: 110 at side 30, scaled by area)");
  maze->add_option(
          "--loops",
          mz_opt->loops,
          "share of inner walls opened (routes compete)")
      ->capture_default_str();

  return {
      app, [=] {
        if (sudoku->parsed()) {
          const auto s = data::write_sudoku_dataset(*sd_opt);
          std::printf(
              "%lld %dx%d Sudoku with one solution each: %lld train "
              "(%lld rows with augmentation), %lld held out (%s); %s.\nWrote %s "
              "(train.csv, test.csv, puzzles.csv, dataset.json)\n",
              (long long)sd_opt->count,
              sd_opt->n,
              sd_opt->n,
              (long long)s.train,
              (long long)s.train_rows,
              (long long)s.test,
              s.by_class ? "no held-out puzzle's symmetry class in training"
                         : "too few symmetry classes to keep apart: split "
                           "by puzzle, none of them in training",
              s.difficulty_text.c_str(),
              sd_opt->out.c_str());
          return 0;
        }
        if (maze->parsed()) {
          const auto s = data::write_maze_dataset(*mz_opt);
          std::printf(
              "%lld %dx%d mazes with one shortest path each: %lld train "
              "(%lld rows with augmentation), %lld held out (none of them, "
              "turned or mirrored, in training); %s.\nWrote %s (train.csv, "
              "test.csv, puzzles.csv, dataset.json)\n",
              (long long)mz_opt->count,
              mz_opt->side,
              mz_opt->side,
              (long long)s.train,
              (long long)s.train_rows,
              (long long)s.test,
              s.difficulty_text.c_str(),
              mz_opt->out.c_str());
          return 0;
        }
        if (wordle->parsed()) {
          const auto words = grpo::read_words(
              wd_opt->words.empty() ? grpo::default_word_list() : wd_opt->words,
              5);
          const auto turns = grpo::wordle::make_turns(
              words, wd_opt->count, wd_opt->seed, wd_opt->held_out);
          if (turns.empty())
            throw UserError(
                "the word list has too few words to make Wordle games; "
                "give --words FILE with more five-letter words.");
          std::string text;
          for (const auto& e : turns) {
            nlohmann::json j = e.columns;
            j["prompt"] = e.messages;
            text += j.dump() + "\n";
          }
          atomic_write(wd_opt->out, text);
          std::printf(
              "%zu Wordle turns from %zu five-letter words (seed %llu%s): "
              "wrote %s\n",
              turns.size(),
              words.size(),
              (unsigned long long)wd_opt->seed,
              wd_opt->held_out ? ", held-out secrets" : "",
              wd_opt->out.c_str());
          return 0;
        }
        if (text->parsed()) {
          auto tok = text::load_tokenizer(text_opt->tokenizer_path);
          auto st = data::prepare_text(tok, *text_opt);
          std::printf(
              "%zu document(s) from %zu file(s), %.1f MB: train %zu docs, "
              "%llu tokens in %zu shard(s); val %zu docs, %llu tokens in "
              "%zu shard(s). Wrote %s\n",
              st.documents,
              st.files,
              st.bytes / 1e6,
              st.train_documents,
              (unsigned long long)st.train_tokens,
              st.train_files.size(),
              st.val_documents,
              (unsigned long long)st.val_tokens,
              st.val_files.size(),
              text_opt->out.c_str());
        } else if (chat->parsed()) {
          auto tok = text::load_tokenizer(*chat_tok);
          auto tmpl = text::open_chat_template(*chat_tok, tok, *chat_family);
          auto st = data::prepare_chat(tok, tmpl, *chat_opt);
          std::printf(
              "%zu record(s) from %zu file(s) (template: %s): wrote %zu "
              "conversations, %llu tokens (%llu trained on), %zu truncated "
              "to %zu tokens, %zu bad record(s) skipped.\nWrote %s\n",
              st.records,
              st.files,
              tmpl.describe().c_str(),
              st.written,
              (unsigned long long)st.tokens,
              (unsigned long long)st.trained_tokens,
              st.truncated,
              chat_opt->max_length,
              st.bad,
              st.path.c_str());
          for (const auto& e : st.bad_examples)
            std::printf("  skipped: %s\n", e.c_str());
          if (st.bad > st.bad_examples.size())
            std::printf(
                "  ... and %zu more\n", st.bad - st.bad_examples.size());
        } else if (wordnet->parsed()) {
          if (wn_opt->out.empty())
            wn_opt->out = default_data_dir() + "/wordnet";
          auto st = data::build_wordnet_corpus(*wn_opt);
          std::printf(
              "WordNet (%s): %zu synsets, %zu headwords (%zu held out).\n"
              "  text: %zu train / %zu val documents\n"
              "  chat: %zu train / %zu val conversations\n"
              "Wrote %s/{text,chat}_{train,val}.jsonl\n",
              st.wordnet_dir.c_str(),
              st.synsets,
              st.headwords,
              st.val_headwords,
              st.train_documents,
              st.val_documents,
              st.train_chats,
              st.val_chats,
              wn_opt->out.c_str());
        }
        return 0;
      }};
}

} // namespace orchard::cli
