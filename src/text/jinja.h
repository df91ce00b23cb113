// A Jinja2 subset for Hugging Face chat templates.
//
// A model folder's tokenizer_config.json (or chat_template.jinja) holds the
// Jinja template transformers renders conversations with. Orchard renders
// the same template, so fine-tuning data and chat prompts match
// apply_chat_template's text exactly: Llama 3.2's system header with its
// dates, Qwen2.5's default system message, each Mistral release's spacing.
//
// Environment as transformers sets it up: trim_blocks and lstrip_blocks on,
// loop controls (break, continue) on, `{% generation %}` blocks render their
// body. Supported: if/elif/else, for (with `if` filter, else, loop.*), set
// (names and namespace attributes), literals, arithmetic, comparisons, `in`,
// `is` tests, filters and string/dict methods a chat template uses. A
// construct outside the subset is a UserError naming it and its line.
//
// Strings carry where their text came from: a string built from a value
// tagged by the caller (a message's content) keeps the tag on those bytes
// through concatenation, trim and slicing, so the caller finds each
// message's text in the rendered output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orchard::text::jinja {

// Bytes [begin, end) of a string came from the value tagged `tag`.
struct Span {
  size_t begin = 0;
  size_t end = 0;
  int tag = 0;
};

struct Text {
  std::string s;
  std::vector<Span> spans;
};

struct Value;
using List = std::vector<Value>;
using Pairs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(List& args, Pairs& kwargs)>;

struct Value {
  enum class Kind {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Dict,
    Func
  };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  Text str;
  std::shared_ptr<List> list;
  std::shared_ptr<Pairs> dict; // insertion order, as Python's dict
  std::shared_ptr<Function> fn;
  bool is_namespace = false;

  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value string(std::string s, int tag = -1); // tag < 0: untagged
  static Value array(List items);
  static Value object(Pairs items);
  static Value function(Function f);
};

struct Output {
  std::string text;
  std::vector<Span> spans; // tagged bytes, in output order
};

class Template {
 public:
  // `name` says where the template came from in error messages. UserError
  // for syntax outside the subset.
  Template(const std::string& source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // UserError for a runtime error (an unknown filter, raise_exception()).
  Output render(const Pairs& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace orchard::text::jinja
