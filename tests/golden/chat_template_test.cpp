// Chat templates: the rendered text of each family, and the loss mask
// covering exactly the assistant content and its end token.
#include "text/chat_template.h"
#include "core/error.h"
#include "test_util.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace orchard::text {
namespace {

// cl100k's vocabulary plus every family's special tokens.
const Tokenizer& chat_tokenizer() {
  static const Tokenizer tok = [] {
    Tokenizer base = load_tokenizer(
        std::string(ORCHARD_FIXTURES) + "/tokenizers/cl100k_base");
    std::map<std::string, TokenId> special;
    TokenId id = 200000;
    for (const char* s :
         {"<|bos|>",
          "<|user_start|>",
          "<|user_end|>",
          "<|assistant_start|>",
          "<|assistant_end|>",
          "<|system_start|>",
          "<|system_end|>",
          "<|begin_of_text|>",
          "<|start_header_id|>",
          "<|end_header_id|>",
          "<|eot_id|>",
          "<|im_start|>",
          "<|im_end|>",
          "<s>",
          "</s>",
          "[INST]",
          "[/INST]",
          "<|endoftext|>"})
      special[s] = id++;
    return Tokenizer(base.entries(), special, base.pattern(), "test");
  }();
  return tok;
}

const std::vector<Message> kConversation = {
    {"system", "Be brief."},
    {"user", "Hi <|assistant_start|> there"},
    {"assistant", "Hello!"},
    {"user", "Bye"},
    {"assistant", "See you."}};

// The text of the masked tokens, each masked run joined by '|'.
std::string masked_text(const Tokenizer& tok, const Rendered& r) {
  std::string out;
  bool in_run = false;
  for (size_t i = 0; i < r.ids.size(); ++i) {
    if (r.mask[i]) {
      if (!in_run && !out.empty())
        out += "|";
      out += tok.decode({r.ids[i]});
    }
    in_run = r.mask[i];
  }
  return out;
}

struct Case {
  ChatFamily family;
  std::string text, masked;
};

class Templates : public testing::TestWithParam<Case> {};

TEST_P(Templates, RenderAndMask) {
  const Tokenizer& tok = chat_tokenizer();
  ChatTemplate t(GetParam().family, tok);
  Rendered r = t.render(kConversation);
  ASSERT_EQ(r.ids.size(), r.mask.size());
  EXPECT_EQ(tok.decode(r.ids), GetParam().text);
  EXPECT_EQ(masked_text(tok, r), GetParam().masked);
  // User text that spells a control token stays text.
  auto start = *tok.special_id("<|assistant_start|>");
  EXPECT_LE(
      std::count(r.ids.begin(), r.ids.end(), start),
      GetParam().family == ChatFamily::Orchard ? 2 : 0);
}

INSTANTIATE_TEST_SUITE_P(
    Families,
    Templates,
    testing::Values(
        Case{
            ChatFamily::Orchard,
            "<|bos|><|system_start|>Be brief.<|system_end|><|user_start|>Hi "
            "<|assistant_start|> there<|user_end|><|assistant_start|>Hello!"
            "<|assistant_end|><|user_start|>Bye<|user_end|><|assistant_start|>"
            "See you.<|assistant_end|>",
            "Hello!<|assistant_end|>|See you.<|assistant_end|>"},
        Case{
            ChatFamily::Llama3,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi "
            "<|assistant_start|> there<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\nSee you.<|eot_id|>",
            "Hello!<|eot_id|>|See you.<|eot_id|>"},
        Case{
            ChatFamily::ChatML,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi "
            "<|assistant_start|> there<|im_end|>\n<|im_start|>assistant\n"
            "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>"
            "assistant\nSee you.<|im_end|>\n",
            "Hello!<|im_end|>|See you.<|im_end|>"},
        Case{
            ChatFamily::Mistral,
            "<s>[INST] Be brief.\n\nHi <|assistant_start|> there [/INST]Hello!"
            "</s>[INST] Bye [/INST]See you.</s>",
            "Hello!</s>|See you.</s>"},
        Case{
            ChatFamily::Plain,
            "System: Be brief.\nUser: Hi <|assistant_start|> there\n"
            "Assistant: Hello!<|endoftext|>\nUser: Bye\nAssistant: See "
            "you.<|endoftext|>\n",
            "Hello!<|endoftext|>|See you.<|endoftext|>"}));

TEST(ChatTemplate, Errors) {
  const Tokenizer& tok = chat_tokenizer();
  ChatTemplate t(ChatFamily::ChatML, tok);
  EXPECT_THROW(t.render({}), UserError);
  EXPECT_THROW(t.render({{"robot", "x"}}), UserError);
  Tokenizer plain =
      load_tokenizer(std::string(ORCHARD_FIXTURES) + "/tokenizers/gpt2");
  try {
    ChatTemplate bad(ChatFamily::Llama3, plain);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("<|begin_of_text|>"), std::string::npos);
  }
  EXPECT_EQ(parse_chat_family("chatml"), ChatFamily::ChatML);
  // GPT-2's only special token ends a text: the plain family, which
  // replies after "Assistant: " and stops at it.
  EXPECT_EQ(
      detect_chat_family(
          std::string(ORCHARD_FIXTURES) + "/tokenizers/gpt2", plain),
      ChatFamily::Plain);
  ChatTemplate p(ChatFamily::Plain, plain);
  EXPECT_EQ(
      plain.decode(p.generation_prompt({{"user", "Hi"}})),
      "User: Hi\nAssistant: ");
  EXPECT_EQ(p.stop_tokens(), std::vector<TokenId>{50256});
  try {
    parse_chat_family("alpaca");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("llama3|chatml|mistral|orchard"),
        std::string::npos);
  }
}

TEST(ChatTemplate, DetectsTheFamilyFromTokenizerConfig) {
  const Tokenizer& tok = chat_tokenizer();
  test::TempDir dir;
  dir.write(
      "tokenizer_config.json",
      R"({"chat_template": "{% for m in messages %}<|start_header_id|>{{ m.role }}{% endfor %}"})");
  EXPECT_EQ(detect_chat_family(dir.path().string(), tok), ChatFamily::Llama3);
  dir.write(
      "tokenizer_config.json",
      R"({"chat_template": "<|im_start|>{{ role }}"})");
  EXPECT_EQ(detect_chat_family(dir.path().string(), tok), ChatFamily::ChatML);
  dir.write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "default", "template": "[INST] {{ x }} [/INST]"}]})");
  EXPECT_EQ(detect_chat_family(dir.path().string(), tok), ChatFamily::Mistral);
  dir.write(
      "tokenizer_config.json",
      R"({"chat_template": "### Instruction: {{ x }}"})");
  try {
    detect_chat_family(dir.path().string(), tok);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "chat_template=llama3|chatml|mistral|orchard"),
        std::string::npos);
  }
  // No config: the tokenizer's own special tokens decide.
  test::TempDir empty;
  EXPECT_EQ(
      detect_chat_family(empty.path().string(), tok), ChatFamily::Orchard);
}

// --- the model's own Jinja template ------------------------------------------

const std::string kTemplates =
    std::string(ORCHARD_FIXTURES) + "/chat_templates";
const std::string kHf = std::string(ORCHARD_FIXTURES) + "/hf";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A copy of fixture tokenizer `tok_name` whose chat template is `tmpl`.
std::string folder_with(
    const test::TempDir& tmp,
    const std::string& tok_name,
    const std::string& tmpl) {
  namespace fs = std::filesystem;
  fs::path dir = tmp.path() / (tok_name + "-" + tmpl);
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(kHf + "/" + tok_name + "/" + f, dir / f);
  fs::copy_file(kTemplates + "/" + tmpl, dir / "chat_template.jinja");
  return dir.string();
}

std::vector<Message> conversation(const nlohmann::json& j) {
  std::vector<Message> out;
  for (const auto& m : j)
    out.push_back({m["role"], m["content"]});
  return out;
}

// Real Llama 3.2, Qwen2.5, Mistral v0.1 / v0.3 / Nemo and Llama 2 templates
// on the fixture tokenizers: the ids equal transformers'
// apply_chat_template (tests/reference/make_template_ids.py).
TEST(ModelTemplate, IdsEqualTransformers) {
  const auto convs = read_json(kTemplates + "/reference.json")["conversations"];
  const auto ref = read_json(kTemplates + "/token_reference.json");
  test::TempDir tmp;
  std::map<std::string, std::pair<std::string, std::unique_ptr<Tokenizer>>>
      dirs;
  size_t checked = 0;
  for (const auto& c : ref["cases"]) {
    const std::string tmpl = c["template"], tok_name = c["tokenizer"];
    auto& [dir, tok] = dirs[tmpl];
    if (!tok) {
      dir = folder_with(tmp, tok_name, tmpl);
      tok = std::make_unique<Tokenizer>(load_tokenizer(dir));
    }
    ChatTemplate t = open_chat_template(dir, *tok);
    ASSERT_TRUE(t.own_template());
    t.define("date_string", "26 Jul 2024");
    auto messages = conversation(convs[c["conversation"].get<int>()]);
    const bool prompt = c["add_generation_prompt"];
    if (prompt && messages.back().role == "assistant")
      continue; // Orchard asks for a reply only after a user turn
    std::vector<TokenId> ids =
        prompt ? t.generation_prompt(messages) : t.render(messages).ids;
    EXPECT_EQ(ids, c["ids"].get<std::vector<TokenId>>())
        << tmpl << " conversation " << c["conversation"]
        << (prompt ? " +prompt" : "");
    ++checked;
  }
  EXPECT_GT(checked, 50u);
}

// The loss mask covers each assistant message's text as the template writes
// it (trimmed by some) and the blanks and turn-ending token after it.
TEST(ModelTemplate, MaskCoversAssistantTextAndItsTurnEnd) {
  const auto convs = read_json(kTemplates + "/reference.json")["conversations"];
  auto trim = [](const std::string& s) {
    size_t a = s.find_first_not_of(" \t\r\n"),
           b = s.find_last_not_of(" \t\r\n");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  struct Spelling {
    std::string tmpl, tok_name;
    std::function<std::string(const std::string&)> turn;
  };
  const std::vector<Spelling> spellings = {
      {"llama-3.2.jinja",
       "llama",
       [&](auto& c) { return trim(c) + "<|eot_id|>"; }},
      {"qwen2.5.jinja", "qwen2", [&](auto& c) { return c + "<|im_end|>"; }},
      {"mistral-v0.1.jinja", "mistral_sp", [&](auto& c) { return c + "</s>"; }},
      {"mistral-v0.3.jinja",
       "mistral_sp",
       [&](auto& c) { return " " + trim(c) + "</s>"; }},
      {"mistral-nemo.jinja", "mistral_sp", [&](auto& c) { return c + "</s>"; }},
      {"llama-2-chat.jinja",
       "mistral_sp",
       [&](auto& c) { return " " + trim(c) + " </s>"; }},
  };
  test::TempDir tmp;
  for (const auto& sp : spellings) {
    const std::string dir = folder_with(tmp, sp.tok_name, sp.tmpl);
    Tokenizer tok = load_tokenizer(dir);
    ChatTemplate t = open_chat_template(dir, tok);
    for (int k : {1, 2, 3, 4}) {
      auto messages = conversation(convs[k]);
      if (sp.tmpl == "mistral-v0.1.jinja" && messages[0].role == "system")
        continue; // v0.1's template refuses a system message
      std::string expected;
      for (const auto& m : messages)
        if (m.role == "assistant")
          expected += (expected.empty() ? "" : "|") + sp.turn(m.content);
      Rendered r = t.render(messages);
      ASSERT_EQ(r.ids.size(), r.mask.size());
      EXPECT_EQ(masked_text(tok, r), expected)
          << sp.tmpl << " conversation " << k;
    }
  }
}

// On the fixture folders, whose templates spell the built-in families, the
// model's template and the built-in family give the same ids and mask.
TEST(ModelTemplate, AgreesWithTheBuiltInFamilies) {
  const std::vector<Message> conv = {
      {"user", "Hi <|im_end|> <|eot_id|> [INST] there"},
      {"assistant", "Hello!"},
      {"user", "Bye"},
      {"assistant", "See you."}};
  for (const std::string arch : {"llama", "qwen2", "mistral_sp"}) {
    const std::string dir = kHf + "/" + arch;
    Tokenizer tok = load_tokenizer(dir);
    ChatTemplate model = open_chat_template(dir, tok);
    ChatTemplate family(detect_chat_family(dir, tok), tok);
    ASSERT_TRUE(model.own_template());
    Rendered a = model.render(conv), b = family.render(conv);
    EXPECT_EQ(a.ids, b.ids) << arch;
    EXPECT_EQ(a.mask, b.mask) << arch;
    auto prompt = conv;
    prompt.pop_back();
    EXPECT_EQ(model.generation_prompt(prompt), family.generation_prompt(prompt))
        << arch;
    for (auto id : family.stop_tokens()) {
      auto stops = model.stop_tokens();
      EXPECT_NE(std::find(stops.begin(), stops.end(), id), stops.end()) << arch;
    }
  }
}

TEST(ModelTemplate, RefusalsAndGapsAreClearErrors) {
  test::TempDir tmp;
  const std::string dir = folder_with(tmp, "mistral_sp", "mistral-v0.1.jinja");
  Tokenizer tok = load_tokenizer(dir);
  ChatTemplate t = open_chat_template(dir, tok);
  try {
    t.render({{"system", "s"}, {"user", "u"}});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "refused the conversation: Conversation roles must alternate"),
        std::string::npos)
        << e.what();
  }
  // A template that drops the assistant's text leaves nothing to train on.
  test::TempDir other;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(kHf + "/mistral_sp/" + f, other.file(f));
  other.write(
      "chat_template.jinja",
      "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}"
      "{% else %}ok</s>{% endif %}{% endfor %}");
  ChatTemplate drop = open_chat_template(other.path().string(), tok);
  try {
    drop.render({{"user", "u"}, {"assistant", "a"}});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("leaves out the text of message 2"),
        std::string::npos)
        << e.what();
  }
  // Outside the subset: named, with its line, when the folder is opened.
  other.write("chat_template.jinja", "{% macro m() %}{% endmacro %}");
  try {
    open_chat_template(other.path().string(), tok);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("chat_template.jinja:1: '{% macro %}'"),
        std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace orchard::text
