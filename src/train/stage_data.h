// The data of the chat stages, prepared once and cached under data_dir like
// the pretraining shards (train/data_cache.h).
//
// Conversations come from `chat_data` (chat JSONL files or folders, any
// format `orchard data chat` reads; every 20th conversation is held out for
// validation) or, by default, from WordNet's chats (chat_train.jsonl,
// chat_val.jsonl: questions about words, split by headword so validation
// asks about words never seen in training). They are rendered with the
// model's chat template into .chat files (ids + loss mask).
//
// mid trains on a token stream that mixes those conversations (all tokens)
// with plain-text documents from the pretraining data: after each
// conversation, documents are added until `mid_text_ratio` of the tokens so
// far are text. The stream is written as token shards, so mid reads it
// exactly as base reads its shards.
#pragma once

#include "train/data_cache.h"
#include "train/pretrain_config.h"

#include <functional>
#include <string>
#include <vector>

namespace orchard::train {

struct ChatData {
  std::string train, val; // .chat files
  std::string description;
};

// What chat data a stage asks for (mid and sft from PretrainConfig, lora
// and full from FinetuneConfig).
struct ChatDataSpec {
  std::vector<std::string> files; // chat JSONL files or folders; []: WordNet
  std::string data_dir;           // the cache ("": the default)
  int64_t max_seq_len = 0;        // conversations are cut at this + 1
  std::string tokenizer_dir;
  // "auto" for the tokenizer folder's own template (else the family its
  // special tokens name), or a built-in family's name.
  std::string chat_template = "auto";
};

ChatData prepare_chat_data(
    const ChatDataSpec& spec,
    const std::function<void(const std::string&)>& say);

struct MidData {
  std::vector<std::string> train_shards, val_shards;
  uint64_t chat_tokens = 0, text_tokens = 0; // of the training split
};

MidData prepare_mid_data(
    const PretrainConfig& cfg,
    const ChatData& chats,
    const PreparedData& text,
    const std::function<void(const std::string&)>& say);

} // namespace orchard::train
