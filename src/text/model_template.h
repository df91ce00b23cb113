// A model's own chat template: the Jinja text in its tokenizer_config.json
// (or chat_template.jinja), rendered as transformers' apply_chat_template
// renders it, then encoded and masked for training.
//
// Encoding follows transformers too: the rendered text is split at special
// tokens and each stretch between them is encoded whole. Two differences,
// both on purpose: special-token text inside a message's content stays
// ordinary text (a user cannot inject "<|eot_id|>"), and each token gets a
// loss-mask bit. A token is trained on when its bytes overlap an assistant
// message's content, or the whitespace and turn-ending special token
// ("</s>", "<|eot_id|>", "<|im_end|>", ...) right after it. The rendered
// strings carry where each message's content went (text/jinja.h), so the
// mask does not depend on how a template spells its turns.
#pragma once

#include "text/jinja.h"
#include "text/tokenizer.h"

#include <array>
#include <string>
#include <vector>

namespace orchard::text {

struct Message;
struct Rendered;

class ModelTemplate {
 public:
  // `origin` names the file in messages. `bos` / `eos`: tokenizer_config's
  // bos_token / eos_token ("" when it has none). UserError for a template
  // outside Orchard's Jinja subset.
  ModelTemplate(
      const std::string& source,
      std::string origin,
      std::string bos,
      std::string eos,
      const Tokenizer& tok);

  // A variable apply_chat_template(**kwargs) would pass, e.g. date_string.
  void define(const std::string& name, const std::string& value);
  // UserError when the template refuses the conversation (its
  // raise_exception) or, when training (`add_generation_prompt` false),
  // leaves out an assistant message's text.
  Rendered render(
      const std::vector<Message>& messages,
      bool add_generation_prompt) const;
  const std::vector<TokenId>& stop_tokens() const {
    return stops_;
  }
  const std::string& source() const {
    return source_;
  }
  const std::string& origin() const {
    return origin_;
  }

 private:
  // The longest special token starting at text[pos], or nullptr.
  const std::pair<std::string, TokenId>* special_at(
      const std::string& text,
      size_t pos) const;
  // The Jinja variables apply_chat_template passes.
  jinja::Pairs context(
      const std::vector<Message>& messages,
      bool add_generation_prompt) const;
  void encode_stretch(
      const std::string& text,
      size_t a,
      size_t b,
      TextStart at,
      const std::vector<uint8_t>& trained,
      Rendered& out) const;

  std::string source_, origin_, bos_, eos_;
  jinja::Template tmpl_;
  const Tokenizer& tok_;
  std::vector<TokenId> stops_;
  jinja::Pairs defined_;
  size_t prompt_blanks_ = 0;
  // Special tokens by their first byte, longest first.
  std::array<std::vector<std::pair<std::string, TokenId>>, 256> specials_;
};

} // namespace orchard::text
