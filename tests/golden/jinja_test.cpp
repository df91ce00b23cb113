// Orchard's Jinja subset against Jinja2 itself: ten real chat templates
// (Llama 3.2, Llama 3.1/3.3, Qwen2.5, Mistral v0.1 / v0.3 / Nemo, Llama 2,
// DeepSeek-R1 distills, TinyLlama, Gemma 2) over nine conversations with and
// without a generation prompt and with tools, plus single expressions. The
// expected text and errors come from tests/reference/make_jinja_reference.py
// (jinja2 3.1.6, set up as transformers sets it up).
#include "text/jinja.h"
#include "core/error.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace orchard::text::jinja {
namespace {

const std::string kTemplateDir =
    std::string(ORCHARD_FIXTURES) + "/chat_templates";

using Json = nlohmann::ordered_json; // key order matters to tojson

Json reference() {
  std::ifstream in(kTemplateDir + "/reference.json");
  return Json::parse(in);
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

Value from_json(const Json& j) {
  if (j.is_null())
    return Value::none();
  if (j.is_boolean())
    return Value::boolean(j.get<bool>());
  if (j.is_number_integer())
    return Value::integer(j.get<int64_t>());
  if (j.is_number()) {
    Value v;
    v.kind = Value::Kind::Float;
    v.f = j.get<double>();
    return v;
  }
  if (j.is_string())
    return Value::string(j.get<std::string>());
  if (j.is_array()) {
    List items;
    for (const auto& x : j)
      items.push_back(from_json(x));
    return Value::array(std::move(items));
  }
  Pairs items;
  for (auto it = j.begin(); it != j.end(); ++it)
    items.emplace_back(it.key(), from_json(it.value()));
  return Value::object(std::move(items));
}

TEST(Jinja, RealChatTemplatesRenderAsJinja2Does) {
  const Json ref = reference();
  std::map<std::string, std::unique_ptr<Template>> templates;
  size_t rendered = 0, refused = 0;
  for (const auto& c : ref["cases"]) {
    const std::string name = c["template"];
    auto& t = templates[name];
    if (!t)
      t = std::make_unique<Template>(read(kTemplateDir + "/" + name), name);
    const int conv = c["conversation"];
    Pairs ctx = {
        {"messages", from_json(ref["conversations"][conv])},
        {"add_generation_prompt", Value::boolean(c["add_generation_prompt"])},
        {"bos_token", Value::string("<s>")},
        {"eos_token", Value::string("</s>")}};
    if (c.contains("tools"))
      ctx.emplace_back("tools", from_json(ref["tools"]));
    const std::string label = name + " conversation " + std::to_string(conv) +
        (c["add_generation_prompt"].get<bool>() ? " +prompt" : "") +
        (c.contains("tools") ? " +tools" : "");
    if (c.contains("error")) {
      try {
        t->render(ctx);
        ADD_FAILURE() << label << ": rendered, Jinja2 refused: " << c["error"];
      } catch (const UserError& e) {
        EXPECT_NE(
            std::string(e.what()).find(c["error"].get<std::string>()),
            std::string::npos)
            << label << ": " << e.what();
        ++refused;
      }
      continue;
    }
    EXPECT_EQ(t->render(ctx).text, c["expected"].get<std::string>()) << label;
    ++rendered;
  }
  EXPECT_EQ(templates.size(), 10u);
  EXPECT_GT(rendered, 100u);
  EXPECT_GT(refused, 10u);
}

TEST(Jinja, ExpressionsMatchJinja2) {
  const Json ref = reference();
  const Pairs ctx = *from_json(ref["expression_context"]).dict;
  for (const auto& e : ref["expressions"]) {
    const std::string src = e["source"];
    Template t(src, "expression");
    EXPECT_EQ(t.render(ctx).text, e["expected"].get<std::string>()) << src;
  }
}

TEST(Jinja, TaggedTextIsFoundThroughConcatenationTrimSlicesAndSplit) {
  // DeepSeek-R1's template keeps what follows the last </think>.
  Template t(
      "{{ '[' + m.content | trim + ']' }}{{ m.content[2:5] }}{{ other }}"
      "{{ r.content.split('</think>')[-1] }}",
      "spans");
  Pairs msg = {{"content", Value::string("  hello  ", 7)}};
  Pairs reply = {{"content", Value::string("<think>hm</think>It is 4.", 9)}};
  Output out = t.render(
      {{"m", Value::object(msg)},
       {"other", Value::string("x")},
       {"r", Value::object(reply)}});
  ASSERT_EQ(out.text, "[hello]helxIt is 4.");
  auto text_of = [&](const Span& s) {
    return out.text.substr(s.begin, s.end - s.begin);
  };
  ASSERT_EQ(out.spans.size(), 3u);
  EXPECT_EQ(text_of(out.spans[0]), "hello");
  EXPECT_EQ(out.spans[0].tag, 7);
  EXPECT_EQ(text_of(out.spans[1]), "hel");
  EXPECT_EQ(text_of(out.spans[2]), "It is 4.");
  EXPECT_EQ(out.spans[2].tag, 9);
}

TEST(Jinja, SyntaxOutsideTheSubsetIsAnErrorWithItsLine) {
  auto message = [](const std::string& src) {
    try {
      Template t(src, "t.jinja");
      t.render({});
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message("a\n{% macro f() %}x{% endmacro %}")
          .find("t.jinja:2: '{% macro %}' is not supported"),
      std::string::npos);
  EXPECT_NE(
      message("{% if x %}never closed").find("never closed"),
      std::string::npos);
  EXPECT_NE(
      message("{{ x | nosuchfilter }}").find("the filter 'nosuchfilter'"),
      std::string::npos);
  EXPECT_NE(message("{{ 'unclosed }}").find("never closed"), std::string::npos);
  EXPECT_NE(
      message("{% endfor %}").find("without a matching opening tag"),
      std::string::npos);
  EXPECT_NE(
      message("{{ nope.attr }}").find("'nope' is undefined"),
      std::string::npos);
  EXPECT_NE(
      message("{{ raise_exception('no system role') }}")
          .find("refused the conversation: no system role"),
      std::string::npos);
  EXPECT_NE(
      message("{{ 1 + 'a' }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(
      message("{{ range(10 ** 12) | length }}").find("more than 1,000,000"),
      std::string::npos);
}

} // namespace
} // namespace orchard::text::jinja
