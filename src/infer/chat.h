// Chat with a trained model: the conversation rendered by the model's chat
// template, the reply generated until the template's end-of-turn token and
// streamed as text. Used by `orchard chat`, `orchard serve` and the samples
// the chat stages print.
#pragma once

#include "infer/engine.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace orchard::infer {

// Bytes in, whole UTF-8 characters out: a token may end inside a
// multi-byte character; the rest waits for the next token. Bytes that are
// not UTF-8 come out as U+FFFD, so the text is always valid UTF-8 (JSON
// needs it). `drop_first_space`: a reply from a SentencePiece-style model,
// whose first word's token spells a leading space that is not text (as
// transformers' decoder strips it); the first text loses that one space.
class Utf8Stream {
 public:
  explicit Utf8Stream(bool drop_first_space = false)
      : drop_first_space_(drop_first_space) {}
  // The complete characters so far not yet returned.
  std::string push(const std::string& bytes);
  // U+FFFD when a character was left unfinished at the end, else "".
  std::string flush();

 private:
  std::string pending_;
  bool drop_first_space_;
};

class ChatModel {
 public:
  ChatModel(runs::LoadedModel model, torch::Device device);

  // The reply to `messages` (ending with a user or system message).
  // `on_text` gets the reply as it is made, in whole characters, and may
  // return false to stop. The end-of-turn token is not part of the reply.
  std::string reply(
      const std::vector<text::Message>& messages,
      const SamplingOptions& options,
      const std::function<bool(const std::string&)>& on_text = {},
      GenerationStats* stats = nullptr);

  // Tokens `messages` render to as a prompt (for limits and usage counts).
  std::vector<int64_t> prompt_ids(
      const std::vector<text::Message>& messages) const;

  const text::Tokenizer& tokenizer() const {
    return *tok_;
  }
  const runs::LoadedModel& loaded() const {
    return loaded_;
  }
  int64_t max_seq_len() const {
    return loaded_.model->max_seq_len();
  }
  Engine& engine() {
    return engine_;
  }
  // The template's end-of-turn tokens.
  const std::vector<int64_t>& stop_tokens() const {
    return stop_;
  }
  // The text of generated ids (special tokens left out).
  std::string text_of(const std::vector<int64_t>& ids) const;

 private:
  runs::LoadedModel loaded_;
  std::shared_ptr<const text::Tokenizer> tok_;
  std::unique_ptr<text::ChatTemplate> tmpl_;
  Engine engine_;
  std::vector<int64_t> stop_;
};

struct ChatSample {
  std::string question, answer, reference;
};

// Answers to `count` held-out conversations of a .chat file (spread over
// the file): the prompt is each conversation up to its first answer, the
// reference that answer.
std::vector<ChatSample> sample_chat_answers(
    const runs::LoadedModel& model,
    const std::string& chat_path,
    int count,
    const SamplingOptions& options);

} // namespace orchard::infer
