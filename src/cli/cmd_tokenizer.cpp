// `orchard tokenizer encode|decode|info`: inspect a tokenizer from scripts.
// encode prints the ids of a text separated by spaces; decode turns such ids
// back into the exact bytes; info describes the tokenizer.
#include "cli/common.h"
#include "core/error.h"
#include "core/progress.h"
#include "data/text_prep.h"
#include "text/bpe_train.h"
#include "text/chat_template.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer_io.h"

#include <algorithm>
#include <filesystem>

#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

namespace orchard::cli {
namespace {

std::string read_input(const std::string& path) {
  if (path.empty() || path == "-") {
    std::ios::sync_with_stdio(false);
    return std::string(
        std::istreambuf_iterator<char>(std::cin),
        std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UserError("cannot read input file '" + path + "'.");
  return std::string(
      std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct TrainArgs {
  std::vector<std::string> inputs;
  size_t vocab_size = 32768;
  std::string out;
};

void run_train(const TrainArgs& a) {
  namespace fs = std::filesystem;
  auto files = data::list_input_files(a.inputs);
  text::BpeTrainer trainer({.vocab_size = a.vocab_size});
  std::cout << "Counting pieces in " << files.size() << " file(s)...\n"
            << std::flush;
  for (const auto& f : files)
    trainer.add_text(read_input(f));
  text::BpeTrainStats stats;
  std::cout << "Learning merges...\n" << std::flush;
  text::Tokenizer tok = [&] {
    ProgressLine progress;
    return trainer.train(&stats, [&](size_t done, size_t wanted) {
      progress.update({.step = int64_t(done), .total = int64_t(wanted)});
    });
  }();
  fs::create_directories(a.out);
  std::string path = (fs::path(a.out) / "tokenizer.json").string();
  text::save_hf_tokenizer(tok, path);
  std::cout << stats.summary() << "\n";
  if (tok.vocab_size() < a.vocab_size)
    std::cout << "Note: the text allowed only " << stats.merges
              << " merges, so the vocabulary has " << tok.vocab_size()
              << " tokens, not " << a.vocab_size
              << "; give more text for more.\n";
  std::cout << "Wrote " << path << " (vocab_size " << tok.vocab_size() << ", "
            << tok.special_tokens().size() << " special tokens).\n";
}

} // namespace

Command register_tokenizer(CLI::App& root) {
  struct State {
    std::string tokenizer, input;
    bool allow_special = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "tokenizer", "Encode, decode and describe tokenizers");
  app->require_subcommand(1);
  auto common = [&](CLI::App* sub, bool input) {
    sub->add_option(
           "--tokenizer",
           st->tokenizer,
           "folder with a *.tiktoken rank file (or the file itself)")
        ->required();
    if (input)
      sub->add_option(
          "--input", st->input, "file to read (default: standard input)");
  };
  CLI::App* enc = app->add_subcommand(
      "encode", "Print the token ids of a text, separated by spaces");
  common(enc, true);
  enc->add_flag(
      "--allow-special",
      st->allow_special,
      "turn special-token text such as <|endoftext|> into its id (off: "
      "encoded as plain text)");
  CLI::App* dec = app->add_subcommand(
      "decode", "Write the exact bytes of token ids read as text");
  common(dec, true);
  CLI::App* info =
      app->add_subcommand("info", "Vocabulary size, special tokens and format");
  common(info, false);

  auto train_opts = std::make_shared<TrainArgs>();
  CLI::App* train = app->add_subcommand(
      "train", "Learn a byte-level BPE tokenizer from text files");
  train->add_option("--input", train_opts->inputs, "text files or folders")
      ->required();
  train
      ->add_option(
          "--vocab-size", train_opts->vocab_size, "tokens, specials included")
      ->capture_default_str();
  train->add_option("--out", train_opts->out, "folder for tokenizer.json")
      ->required();
  train->callback([train_opts] { run_train(*train_opts); });

  return {
      app, [st, enc, dec, info, train] {
        if (train->parsed())
          return 0; // ran in its callback
        text::Tokenizer tok = text::load_tokenizer(st->tokenizer);
        if (enc->parsed()) {
          auto ids = tok.encode(
              read_input(st->input),
              st->allow_special ? text::Allowed::every()
                                : text::Allowed::none());
          std::string out;
          for (size_t i = 0; i < ids.size(); ++i)
            out += (i ? " " : "") + std::to_string(ids[i]);
          std::cout << out << "\n";
        } else if (dec->parsed()) {
          auto ids = text::parse_token_ids(read_input(st->input));
          std::string bytes = tok.decode(ids);
          std::cout.write(bytes.data(), bytes.size());
        } else if (info->parsed()) {
          std::cout << "format: " << tok.format()
                    << (tok.sentencepiece() ? " (SentencePiece-style BPE)" : "")
                    << "\n"
                    << "vocab_size: " << tok.vocab_size() << "\n"
                    << "pattern: "
                    << (tok.sentencepiece() ? "(none: \"\xE2\x96\x81\" marks "
                                              "word starts)"
                                            : tok.pattern())
                    << "\n"
                    << "chat_template: "
                    << text::describe_chat_template(st->tokenizer, tok) << "\n"
                    << "special_tokens: " << tok.special_tokens().size()
                    << "\n";
          for (const auto& [text, id] : tok.special_tokens())
            std::cout << "  " << id << " " << text::printable(text) << "\n";
        }
        return 0;
      }};
}

} // namespace orchard::cli
