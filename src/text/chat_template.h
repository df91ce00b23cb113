// Chat templates: messages -> token ids + loss mask.
//
// The mask is 1 on the tokens a model should learn to produce: each
// assistant message's content and the token that ends it; 0 on everything
// else (system and user turns, role headers, BOS). Templates are written
// out token by token rather than through a Jinja engine: the four families
// below cover Orchard's own models and the Hugging Face ones Orchard
// fine-tunes, and a template Orchard does not know is an error, never a
// guess.
//
//   orchard
//   <|bos|><|user_start|>hi<|user_end|><|assistant_start|>yo<|assistant_end|>
//   llama3
//   <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>...
//   chatml
//   <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n
//   mistral  <s>[INST] hi [/INST]yo</s>
#pragma once

#include "text/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::text {

struct Message {
  std::string role; // system, user or assistant
  std::string content;
};

enum class ChatFamily { Orchard, Llama3, ChatML, Mistral };

struct Rendered {
  std::vector<TokenId> ids;
  std::vector<uint8_t> mask; // same length as ids
};

// "orchard", "llama3", "chatml", "mistral" (the chat_template= values).
ChatFamily parse_chat_family(const std::string& name);
std::string chat_family_name(ChatFamily f);

// The family of a tokenizer folder: tokenizer_config.json's chat_template
// when present, else the special tokens the tokenizer has. UserError naming
// the families and the chat_template= key when neither tells.
ChatFamily detect_chat_family(
    const std::string& tokenizer_dir,
    const Tokenizer& tok);

class ChatTemplate {
 public:
  // UserError when `tok` lacks a special token the family needs.
  ChatTemplate(ChatFamily family, const Tokenizer& tok);
  // UserError for an unknown role or an empty conversation.
  Rendered render(const std::vector<Message>& messages) const;
  // The ids a model continues to write the assistant's reply: the
  // conversation (ending with a user or system message) and the opening of
  // an assistant turn. UserError when the last message is the assistant's.
  std::vector<TokenId> generation_prompt(
      const std::vector<Message>& messages) const;
  // Tokens that end the assistant's turn (generation stops at them).
  std::vector<TokenId> stop_tokens() const;
  ChatFamily family() const {
    return family_;
  }

 private:
  TokenId special(const std::string& text) const;
  ChatFamily family_;
  const Tokenizer& tok_;
};

} // namespace orchard::text
