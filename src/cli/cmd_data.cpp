// `orchard data text|wordnet`: prepare training data. Thin: parse, call
// src/data, print the summary.
#include "cli/common.h"
#include "core/error.h"
#include "data/text_prep.h"
#include "data/wordnet.h"
#include "text/tokenizer_io.h"

#include <cstdio>
#include <iostream>
#include <memory>

namespace orchard::cli {

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

  return {app, [=] {
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
