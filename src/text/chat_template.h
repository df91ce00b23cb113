// Chat templates: messages -> token ids + loss mask.
//
// The mask is 1 on the tokens a model should learn to produce: each
// assistant message's content and the token that ends it; 0 on everything
// else (system and user turns, role headers, BOS).
//
// A Hugging Face model folder's own Jinja template is rendered as
// transformers renders it (text/model_template.h). The four built-in
// families below, written out token by token, serve Orchard's own
// tokenizers and folders without a template, and can be chosen by name.
//
//   orchard
//   <|bos|><|user_start|>hi<|user_end|><|assistant_start|>yo<|assistant_end|>
//   llama3
//   <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>...
//   chatml
//   <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n
//   mistral  <s>[INST] hi [/INST]yo</s>
//   plain    User: hi\nAssistant: yo<|endoftext|>\n
//            (tokenizers whose only special token ends a text: GPT-2's)
#pragma once

#include "text/conversation.h"
#include "text/tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace orchard::text {

enum class ChatFamily { Orchard, Llama3, ChatML, Mistral, Plain };

class ModelTemplate;

// "orchard", "llama3", "chatml", "mistral", "plain" (the chat_template=
// values).
ChatFamily parse_chat_family(const std::string& name);
std::string chat_family_name(ChatFamily f);

// The built-in family of a tokenizer folder: the one tokenizer_config.json's
// chat_template spells, else the one its special tokens name (plain when
// the only one is <|endoftext|>). UserError naming the families and the
// chat_template= key when neither tells.
ChatFamily detect_chat_family(
    const std::string& tokenizer_dir,
    const Tokenizer& tok);

struct TemplateFile {
  std::string text;
  std::string file; // where it was read from
  // tokenizer_config.json's bos_token / eos_token ("" when it has none).
  std::string bos, eos;
};
// The Jinja chat template of a tokenizer folder (tokenizer_config.json's
// chat_template, or chat_template.jinja), nullopt when it has none.
// UserError when the file is not valid JSON.
std::optional<TemplateFile> read_chat_template(const std::string& dir);

class ChatTemplate {
 public:
  // UserError when `tok` lacks a special token the family needs.
  ChatTemplate(ChatFamily family, const Tokenizer& tok);
  // The model folder's own template.
  ChatTemplate(std::shared_ptr<ModelTemplate> model, const Tokenizer& tok);
  // UserError for an unknown role or an empty conversation.
  Rendered render(const std::vector<Message>& messages) const;
  // The ids a model continues to write the assistant's reply: the
  // conversation (ending with a user or system message) and the opening of
  // an assistant turn. UserError when the last message is the assistant's.
  std::vector<TokenId> generation_prompt(
      const std::vector<Message>& messages) const;
  // Tokens that end the assistant's turn (generation stops at them).
  std::vector<TokenId> stop_tokens() const;
  // The built-in family; meaningless when own_template().
  ChatFamily family() const {
    return family_;
  }
  // Rendering the model folder's own Jinja template.
  bool own_template() const {
    return model_ != nullptr;
  }
  // "llama3", ..., or "<folder>/tokenizer_config.json's chat_template".
  std::string describe() const;
  // A variable the model's template reads, as apply_chat_template's kwargs
  // (date_string for Llama 3.x). Ignored by the built-in families.
  void define(const std::string& name, const std::string& value);

 private:
  TokenId special(const std::string& text) const;
  ChatFamily family_;
  const Tokenizer& tok_;
  std::shared_ptr<ModelTemplate> model_;
};

// The template a tokenizer folder's conversations are rendered with:
// `family` when given (a chat_template= value), else the folder's own Jinja
// template, else the built-in family its special tokens name. UserError for
// a template outside Orchard's Jinja subset, naming the construct and line.
ChatTemplate open_chat_template(
    const std::string& tokenizer_dir,
    const Tokenizer& tok,
    const std::string& family = "");
// What open_chat_template would render with, as a cache key: `family`, or
// the folder's template text, without loading the tokenizer.
std::string chat_template_fingerprint(
    const std::string& tokenizer_dir,
    const std::string& family = "");

// What conversations of a tokenizer folder are rendered with, for `orchard
// tokenizer info`: the folder's own Jinja template, a built-in family, or
// why neither works.
std::string describe_chat_template(
    const std::string& tokenizer_dir,
    const Tokenizer& tok);

} // namespace orchard::text
