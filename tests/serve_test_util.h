// A chat model with an Orchard tokenizer (a tiny random GPT, every weight
// random), served by `orchard serve`'s Server on a free loopback port: the
// serve tests and the HTTP fuzz campaign talk to it.
#pragma once

#include "gpt_test_util.h"
#include "infer/chat.h"
#include "runs/load.h"
#include "serve/server.h"
#include "test_util.h"
#include "text/bpe_train.h"
#include "text/hf_tokenizer.h"

#include <filesystem>
#include <memory>
#include <thread>

namespace orchard::test {

struct ServedModel {
  TempDir dir;
  std::unique_ptr<infer::ChatModel> chat;
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  int port = 0;
  // `o.port` is replaced by a free one; `o.model_name` defaults to
  // "sft/test".
  explicit ServedModel(serve::ServeOptions o = {}, int64_t max_seq = 128) {
    text::BpeTrainer trainer({.vocab_size = 300});
    trainer.add_text(
        "What does tree mean? A tall woody plant. The quick brown fox jumps "
        "over the lazy dog. Orchard trains language models on your machine.");
    std::filesystem::create_directories(dir.file("tok"));
    text::save_hf_tokenizer(trainer.train(), dir.file("tok/tokenizer.json"));
    runs::LoadedModel loaded = runs::loaded_from(
        random_gpt(300, max_seq, 2, 7, 0.3).ptr(), dir.file("tok"));
    chat = std::make_unique<infer::ChatModel>(loaded, torch::kCPU);
    o.port = 0;
    if (o.model_name.empty())
      o.model_name = "sft/test";
    server = std::make_unique<serve::Server>(*chat, o);
    port = server->bind();
    thread = std::thread([this] { server->run(); });
  }
  ~ServedModel() {
    server->stop();
    thread.join();
  }
  ServedModel(const ServedModel&) = delete;
  ServedModel& operator=(const ServedModel&) = delete;
};

} // namespace orchard::test
