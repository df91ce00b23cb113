#include "text/model_template.h"

#include "core/error.h"
#include "text/conversation.h"
#include "text/jinja_builtins.h"

#include <algorithm>
#include <ctime>

namespace orchard::text {
namespace {

// Turn-ending tokens: a template that writes one of them ends assistant
// turns with it, so the model learns to emit it and generation stops there.
const char* const kTurnEnds[] = {
    "</s>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|end|>",
    "<end_of_turn>",
    "<|assistant_end|>"};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The eos token, the turn-ending tokens the template writes, and document
// ends.
std::vector<TokenId> template_stops(
    const Tokenizer& tok,
    const std::string& source,
    const std::string& eos) {
  std::vector<TokenId> out;
  auto add = [&](const std::string& name) {
    if (auto id = tok.special_id(name))
      if (std::find(out.begin(), out.end(), *id) == out.end())
        out.push_back(*id);
  };
  if (!eos.empty())
    add(eos);
  for (const char* end : kTurnEnds)
    if (source.find(end) != std::string::npos)
      add(end);
  // Document ends stop generation whatever the template: a base model's
  // eos (</s>, <|end_of_text|>, <|endoftext|>).
  for (auto id : tok.document_ends())
    if (std::find(out.begin(), out.end(), id) == out.end())
      out.push_back(id);
  add("<|endoftext|>");
  return out;
}

// transformers passes strftime_now(format) to templates: the local time.
jinja::Value strftime_now() {
  return jinja::Value::function([](jinja::List& args, jinja::Pairs&) {
    std::string format = args.empty() ? "%d %b %Y" : args[0].str.s;
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[128];
    size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
    return jinja::Value::string(std::string(buf, n));
  });
}

} // namespace

ModelTemplate::ModelTemplate(
    const std::string& source,
    std::string origin,
    std::string bos,
    std::string eos,
    const Tokenizer& tok)
    : source_(source),
      origin_(std::move(origin)),
      bos_(std::move(bos)),
      eos_(std::move(eos)),
      tmpl_(source, origin_),
      tok_(tok),
      stops_(template_stops(tok, source, eos_)) {
  for (const auto& [text, id] : tok.special_tokens())
    if (!text.empty())
      specials_[static_cast<unsigned char>(text[0])].emplace_back(text, id);
  for (auto& list : specials_)
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first.size() > b.first.size();
    });
  // How many blanks the generation prompt ends with ("\n\n" after Llama
  // 3's assistant header): those blanks are the prompt's, not the reply's.
  // Found by rendering a one-message conversation with and without it.
  try {
    jinja::Pairs with = context({{"user", "x"}}, true);
    jinja::Pairs without = context({{"user", "x"}}, false);
    std::string a = tmpl_.render(with).text, b = tmpl_.render(without).text;
    if (a.size() >= b.size() && a.compare(0, b.size(), b) == 0)
      while (prompt_blanks_ < a.size() - b.size() &&
             is_space(a[a.size() - 1 - prompt_blanks_]))
        ++prompt_blanks_;
  } catch (const UserError&) {
    // A template that refuses a lone user message: assume no blanks.
  }
}

jinja::Pairs ModelTemplate::context(
    const std::vector<Message>& messages,
    bool add_generation_prompt) const {
  jinja::List list;
  for (size_t k = 0; k < messages.size(); ++k)
    list.push_back(jinja::Value::object(
        {{"role", jinja::Value::string(messages[k].role)},
         {"content", jinja::Value::string(messages[k].content, int(k))}}));
  jinja::Pairs ctx = {
      {"messages", jinja::Value::array(std::move(list))},
      {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
      {"strftime_now", strftime_now()}};
  if (!bos_.empty())
    ctx.emplace_back("bos_token", jinja::Value::string(bos_));
  if (!eos_.empty())
    ctx.emplace_back("eos_token", jinja::Value::string(eos_));
  for (const auto& [k, v] : defined_)
    jinja::set_item(ctx, k, v);
  return ctx;
}

void ModelTemplate::define(const std::string& name, const std::string& value) {
  jinja::set_item(defined_, name, jinja::Value::string(value));
}

const std::pair<std::string, TokenId>* ModelTemplate::special_at(
    const std::string& text,
    size_t pos) const {
  for (const auto& s : specials_[static_cast<unsigned char>(text[pos])])
    if (text.compare(pos, s.first.size(), s.first) == 0)
      return &s;
  return nullptr;
}

Rendered ModelTemplate::render(
    const std::vector<Message>& messages,
    bool add_generation_prompt) const {
  const jinja::Output out =
      tmpl_.render(context(messages, add_generation_prompt));
  const std::string& text = out.text;

  std::vector<uint8_t> content(text.size()), trained(text.size());
  std::vector<bool> written(messages.size());
  for (const auto& sp : out.spans) {
    std::fill(content.begin() + sp.begin, content.begin() + sp.end, 1);
    written[sp.tag] = written[sp.tag] || sp.end > sp.begin;
  }
  const auto& ends = stops_;
  for (const auto& sp : out.spans) {
    if (messages[sp.tag].role != "assistant")
      continue;
    // Blanks between the prompt's end and the text (Mistral v0.3's and
    // Llama 2's " " before a reply) are the model's to write.
    size_t start = sp.begin;
    while (start > 0 && !content[start - 1] && is_space(text[start - 1]))
      --start;
    start = std::min(sp.begin, start + prompt_blanks_);
    std::fill(trained.begin() + start, trained.begin() + sp.end, 1);
    // The turn's end: blanks, then a turn-ending special token.
    size_t p = sp.end;
    while (p < text.size() && !content[p] && is_space(text[p]))
      ++p;
    const auto* s =
        p < text.size() && !content[p] ? special_at(text, p) : nullptr;
    if (s && std::find(ends.begin(), ends.end(), s->second) != ends.end())
      std::fill(
          trained.begin() + sp.end, trained.begin() + p + s->first.size(), 1);
  }
  if (!add_generation_prompt)
    for (size_t k = 0; k < messages.size(); ++k)
      if (messages[k].role == "assistant" && !messages[k].content.empty() &&
          !written[k])
        throw UserError(
            origin_ + ": the chat template leaves out the text of message " +
            std::to_string(k + 1) +
            " (assistant), so there is nothing to train on in it.");

  Rendered r;
  size_t a = 0; // start of the current stretch of ordinary text
  bool after_special = false;
  for (size_t p = 0; p <= text.size(); ++p) {
    const auto* s =
        p < text.size() && !content[p] ? special_at(text, p) : nullptr;
    if (p < text.size() && !s)
      continue;
    if (p > a)
      encode_stretch(
          text,
          a,
          p,
          after_special ? TextStart::AfterSpecial : TextStart::Input,
          trained,
          r);
    if (!s)
      break;
    r.ids.push_back(s->second);
    r.mask.push_back(trained[p]);
    after_special = true;
    p += s->first.size() - 1;
    a = p + 1;
  }
  return r;
}

// Encodes text[a, b) whole, as transformers does, then masks each token by
// the bytes it covers. When the tokens' bytes do not spell the text (an
// unknown-token id), the stretch is encoded in pieces split where the mask
// changes instead.
void ModelTemplate::encode_stretch(
    const std::string& text,
    size_t a,
    size_t b,
    TextStart at,
    const std::vector<uint8_t>& trained,
    Rendered& out) const {
  const std::string_view piece(text.data() + a, b - a);
  const size_t first = out.ids.size();
  tok_.encode_ordinary(piece, out.ids, at);
  std::string spelled, bytes;
  std::vector<size_t> ends;
  bool known = true;
  for (size_t k = first; k < out.ids.size() && known; ++k) {
    known = tok_.token_bytes(out.ids[k], bytes);
    spelled += bytes;
    ends.push_back(spelled.size());
  }
  // SentencePiece-style tokenizers may add a word-start space in front.
  size_t shift = 0;
  if (known && spelled.size() == piece.size() + 1 && spelled[0] == ' ')
    shift = 1;
  if (known && spelled.compare(shift, std::string::npos, piece) == 0) {
    size_t begin = 0;
    for (size_t e : ends) {
      size_t x = a + (begin > shift ? begin - shift : 0);
      size_t y = a + (e > shift ? e - shift : 0);
      bool m = std::any_of(
          trained.begin() + x, trained.begin() + std::max(x, y), [](uint8_t v) {
            return v != 0;
          });
      out.mask.push_back(m);
      begin = e;
    }
    return;
  }
  out.ids.resize(first);
  for (size_t x = a; x < b;) {
    size_t y = x;
    while (y < b && trained[y] == trained[x])
      ++y;
    tok_.encode_ordinary(
        std::string_view(text.data() + x, y - x),
        out.ids,
        x == a ? at : TextStart::Continued);
    out.mask.resize(out.ids.size(), trained[x]);
    x = y;
  }
}

} // namespace orchard::text
