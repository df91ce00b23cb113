#include "text/chat_template.h"

#include "core/error.h"
#include "text/model_template.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace orchard::text {
namespace {

const char* const kFamilies = "llama3|chatml|mistral|orchard|plain";
// The plain family's end of a turn.
const char* const kEndOfText = "<|endoftext|>";

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  size_t b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Accumulates ids and mask. Consecutive text with the same mask is encoded
// as one string, as transformers encodes the rendered template: for
// SentencePiece-style tokenizers where a text starts decides its leading
// "▁", and merges may cross the pieces the template is written in.
struct Builder {
  const Tokenizer& tok;
  Rendered out;
  std::string pending;
  uint8_t pending_mask = 0;
  bool after_special = false; // what precedes `pending`
  bool after_text = false;

  void text(const std::string& s, uint8_t m) {
    if (!pending.empty() && m != pending_mask)
      flush();
    pending += s;
    pending_mask = m;
  }
  void token(TokenId id, uint8_t m) {
    flush();
    out.ids.push_back(id);
    out.mask.push_back(m);
    after_special = true;
    after_text = false;
  }
  void flush() {
    if (pending.empty())
      return;
    TextStart at = after_text ? TextStart::Continued
        : after_special       ? TextStart::AfterSpecial
                              : TextStart::Input;
    tok.encode_ordinary(pending, out.ids, at);
    out.mask.resize(out.ids.size(), pending_mask);
    pending.clear();
    after_text = true;
    after_special = false;
  }
  Rendered done() {
    flush();
    return std::move(out);
  }
};

nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + file.string() + "' is not a valid JSON object.");
  return j;
}

// tokenizer_config's bos_token / eos_token: a string, {"content": ...} or
// null.
std::string token_text(const nlohmann::json& j, const char* key) {
  if (!j.contains(key))
    return "";
  const auto& v = j[key];
  if (v.is_string())
    return v;
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"];
  return "";
}

} // namespace

ChatFamily parse_chat_family(const std::string& name) {
  if (name == "orchard")
    return ChatFamily::Orchard;
  if (name == "llama3")
    return ChatFamily::Llama3;
  if (name == "chatml")
    return ChatFamily::ChatML;
  if (name == "mistral")
    return ChatFamily::Mistral;
  if (name == "plain")
    return ChatFamily::Plain;
  throw UserError(
      "chat_template='" + name + "' is not a template family; use one of " +
      kFamilies + ".");
}

std::string chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::Orchard:
      return "orchard";
    case ChatFamily::Llama3:
      return "llama3";
    case ChatFamily::ChatML:
      return "chatml";
    case ChatFamily::Mistral:
      return "mistral";
    case ChatFamily::Plain:
      return "plain";
  }
  return "?";
}

std::optional<TemplateFile> read_chat_template(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir))
    return std::nullopt;
  fs::path config = fs::path(dir) / "tokenizer_config.json";
  std::string tmpl, file = config.string(), bos, eos;
  if (fs::exists(config)) {
    auto j = read_json(config);
    bos = token_text(j, "bos_token");
    eos = token_text(j, "eos_token");
    if (j.contains("chat_template") && j["chat_template"].is_string())
      tmpl = j["chat_template"];
    else if (j.contains("chat_template") && j["chat_template"].is_array())
      for (const auto& t : j["chat_template"]) // [{name, template}, ...]
        if (t.is_object() && t.contains("name") && t["name"] == "default" &&
            t.contains("template") && t["template"].is_string())
          tmpl = t["template"];
  }
  // transformers 5 writes the template to chat_template.jinja instead.
  fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (tmpl.empty() && fs::exists(jinja)) {
    std::ifstream t(jinja);
    tmpl.assign(std::istreambuf_iterator<char>(t), {});
    file = jinja.string();
  }
  if (tmpl.empty())
    return std::nullopt;
  return TemplateFile{tmpl, file, bos, eos};
}

ChatFamily detect_chat_family(const std::string& dir, const Tokenizer& tok) {
  if (auto file = read_chat_template(dir)) {
    const std::string* tmpl = &file->text;
    if (tmpl->find("<|start_header_id|>") != std::string::npos)
      return ChatFamily::Llama3;
    if (tmpl->find("<|im_start|>") != std::string::npos)
      return ChatFamily::ChatML;
    if (tmpl->find("[INST]") != std::string::npos)
      return ChatFamily::Mistral;
    if (tmpl->find("<|user_start|>") != std::string::npos)
      return ChatFamily::Orchard;
    throw UserError(
        "the chat_template in '" + dir +
        "' is not one Orchard knows (families: llama3, chatml, mistral, "
        "orchard); choose one with chat_template=" +
        kFamilies + ".");
  }
  if (tok.special_id("<|user_start|>"))
    return ChatFamily::Orchard;
  if (tok.special_id("<|start_header_id|>"))
    return ChatFamily::Llama3;
  if (tok.special_id("<|im_start|>"))
    return ChatFamily::ChatML;
  if (tok.special_id("[INST]"))
    return ChatFamily::Mistral;
  if (tok.special_id(kEndOfText))
    return ChatFamily::Plain;
  throw UserError(
      "cannot tell the chat template of tokenizer '" + dir +
      "' (no tokenizer_config.json chat_template, no known chat tokens); "
      "choose one with chat_template=" +
      kFamilies + ".");
}

ChatTemplate::ChatTemplate(ChatFamily family, const Tokenizer& tok)
    : family_(family), tok_(tok) {
  std::vector<std::string> needed;
  switch (family) {
    case ChatFamily::Orchard:
      needed = {
          "<|bos|>",
          "<|user_start|>",
          "<|user_end|>",
          "<|assistant_start|>",
          "<|assistant_end|>"};
      break;
    case ChatFamily::Llama3:
      needed = {
          "<|begin_of_text|>",
          "<|start_header_id|>",
          "<|end_header_id|>",
          "<|eot_id|>"};
      break;
    case ChatFamily::ChatML:
      needed = {"<|im_start|>", "<|im_end|>"};
      break;
    case ChatFamily::Mistral:
      needed = {"<s>", "</s>"};
      break;
    case ChatFamily::Plain:
      needed = {kEndOfText};
      break;
  }
  for (const auto& s : needed)
    if (!tok.special_id(s))
      throw UserError(
          "the " + chat_family_name(family) +
          " chat template needs the "
          "special token " +
          s +
          ", which this tokenizer lacks; pick the "
          "template that matches the tokenizer (chat_template=" +
          kFamilies + ").");
}

ChatTemplate::ChatTemplate(
    std::shared_ptr<ModelTemplate> model,
    const Tokenizer& tok)
    : family_(ChatFamily::Orchard), tok_(tok), model_(std::move(model)) {}

std::string ChatTemplate::describe() const {
  return model_ ? model_->origin() : chat_family_name(family_);
}

std::string chat_template_fingerprint(
    const std::string& dir,
    const std::string& family) {
  if (!family.empty())
    return "family:" + family;
  if (auto file = read_chat_template(dir))
    return "model:" + file->text;
  return "detected"; // from the tokenizer's special tokens: the dir decides
}

void ChatTemplate::define(const std::string& name, const std::string& value) {
  if (model_)
    model_->define(name, value);
}

ChatTemplate open_chat_template(
    const std::string& dir,
    const Tokenizer& tok,
    const std::string& family) {
  if (!family.empty())
    return ChatTemplate(parse_chat_family(family), tok);
  auto source = read_chat_template(dir);
  if (!source)
    return ChatTemplate(detect_chat_family(dir, tok), tok);
  return ChatTemplate(
      std::make_shared<ModelTemplate>(
          source->text, source->file, source->bos, source->eos, tok),
      tok);
}

TokenId ChatTemplate::special(const std::string& text) const {
  return *tok_.special_id(text);
}

Rendered ChatTemplate::render(const std::vector<Message>& messages) const {
  if (messages.empty())
    throw UserError("the conversation has no messages.");
  for (const auto& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw UserError(
          "unknown role '" + m.role +
          "' (expected system, user or assistant).");
  if (model_)
    return model_->render(messages, false);
  Builder b{tok_, {}};
  switch (family_) {
    case ChatFamily::Orchard: {
      b.token(special("<|bos|>"), 0);
      for (const auto& m : messages) {
        bool assistant = m.role == "assistant";
        if (m.role == "system" && !tok_.special_id("<|system_start|>")) {
          // Older Orchard tokenizers: the system text opens the first turn.
          b.token(special("<|user_start|>"), 0);
          b.text(m.content, 0);
          b.token(special("<|user_end|>"), 0);
          continue;
        }
        b.token(special("<|" + m.role + "_start|>"), 0);
        b.text(m.content, assistant);
        b.token(special("<|" + m.role + "_end|>"), assistant);
      }
      break;
    }
    case ChatFamily::Llama3: {
      b.token(special("<|begin_of_text|>"), 0);
      for (const auto& m : messages) {
        bool assistant = m.role == "assistant";
        b.token(special("<|start_header_id|>"), 0);
        b.text(m.role, 0);
        b.token(special("<|end_header_id|>"), 0);
        b.text("\n\n", 0);
        b.text(trim(m.content), assistant); // the official template trims
        b.token(special("<|eot_id|>"), assistant);
      }
      break;
    }
    case ChatFamily::ChatML: {
      for (const auto& m : messages) {
        bool assistant = m.role == "assistant";
        b.token(special("<|im_start|>"), 0);
        b.text(m.role + "\n", 0);
        b.text(m.content, assistant);
        b.token(special("<|im_end|>"), assistant);
        b.text("\n", 0);
      }
      break;
    }
    case ChatFamily::Mistral: {
      // No system role: it opens the first user message, as Mistral's
      // template does.
      b.token(special("<s>"), 0);
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += m.content + "\n\n";
        } else if (m.role == "user") {
          if (auto inst = tok_.special_id("[INST]"))
            b.token(*inst, 0);
          else
            b.text("[INST]", 0);
          b.text(" " + system + m.content + " ", 0);
          system.clear();
          if (auto inst = tok_.special_id("[/INST]"))
            b.token(*inst, 0);
          else
            b.text("[/INST]", 0);
        } else {
          b.text(m.content, 1);
          b.token(special("</s>"), 1);
        }
      }
      break;
    }
    case ChatFamily::Plain: {
      for (const auto& m : messages) {
        const bool assistant = m.role == "assistant";
        b.text(
            assistant              ? "Assistant: "
                : m.role == "user" ? "User: "
                                   : "System: ",
            0);
        b.text(m.content, assistant);
        if (assistant)
          b.token(special(kEndOfText), 1);
        b.text("\n", 0);
      }
      break;
    }
  }
  return b.done();
}

std::vector<TokenId> ChatTemplate::generation_prompt(
    const std::vector<Message>& messages) const {
  if (messages.empty() || messages.back().role == "assistant")
    throw UserError(
        "a reply needs a conversation that ends with a user (or system) "
        "message.");
  if (model_)
    return model_->render(messages, true).ids;
  Builder b{tok_, render(messages)}; // each family goes on with a token
  switch (family_) {
    case ChatFamily::Orchard:
      b.token(special("<|assistant_start|>"), 0);
      break;
    case ChatFamily::Llama3:
      b.token(special("<|start_header_id|>"), 0);
      b.text("assistant", 0);
      b.token(special("<|end_header_id|>"), 0);
      b.text("\n\n", 0);
      break;
    case ChatFamily::ChatML:
      b.token(special("<|im_start|>"), 0);
      b.text("assistant\n", 0);
      break;
    case ChatFamily::Mistral:
      break; // the prompt ends with [/INST]
    case ChatFamily::Plain:
      b.text("Assistant: ", 0);
      break;
  }
  return b.done().ids;
}

std::vector<TokenId> ChatTemplate::stop_tokens() const {
  if (model_)
    return model_->stop_tokens();
  std::vector<std::string> names;
  switch (family_) {
    case ChatFamily::Orchard:
      names = {"<|assistant_end|>", "<|bos|>"};
      break;
    case ChatFamily::Llama3:
      names = {"<|eot_id|>", "<|end_of_text|>"};
      break;
    case ChatFamily::ChatML:
      names = {"<|im_end|>", "<|endoftext|>"};
      break;
    case ChatFamily::Mistral:
      names = {"</s>"};
      break;
    case ChatFamily::Plain:
      names = {kEndOfText};
      break;
  }
  std::vector<TokenId> out;
  for (const auto& n : names)
    if (auto id = tok_.special_id(n))
      out.push_back(*id);
  return out;
}

std::string describe_chat_template(
    const std::string& tokenizer_dir,
    const Tokenizer& tok) {
  try {
    auto t = open_chat_template(tokenizer_dir, tok);
    return t.own_template() ? t.describe() + " (the model's Jinja template)"
                            : chat_family_name(t.family()) + " (built-in)";
  } catch (const UserError& e) {
    return std::string("none usable: ") + e.what();
  }
}

} // namespace orchard::text
