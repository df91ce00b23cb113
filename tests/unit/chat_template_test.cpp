// Chat templates: the rendered text of each family, and the loss mask
// covering exactly the assistant content and its end token.
#include "text/chat_template.h"
#include "core/error.h"
#include "test_util.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>

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
          "[/INST]"})
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
            "Hello!</s>|See you.</s>"}));

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

} // namespace
} // namespace orchard::text
