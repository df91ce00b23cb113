// The str and dict methods chat templates call (`message.content.strip()`,
// `messages[0]['role'].startswith(...)`, `tools.items()`), with Python's
// semantics; the rest of the values' behaviour is in jinja_builtins.cpp.
#include "text/jinja_builtins.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace orchard::text::jinja {
namespace {
using VK = Value::Kind;
} // namespace

bool is_method(const Value& obj, const std::string& name) {
  static const char* const str_methods[] = {
      "strip",
      "lstrip",
      "rstrip",
      "split",
      "startswith",
      "endswith",
      "upper",
      "lower",
      "replace",
      "title",
      "capitalize",
      "find"};
  static const char* const dict_methods[] = {"items", "keys", "values", "get"};
  if (obj.kind == VK::String)
    for (const char* m : str_methods)
      if (name == m)
        return true;
  if (obj.kind == VK::Dict && !obj.is_namespace)
    for (const char* m : dict_methods)
      if (name == m)
        return true;
  return false;
}

Value call_method(
    const Value& obj,
    const std::string& name,
    List& args,
    Pairs& kwargs,
    const std::string& where) {
  if (obj.kind == VK::Dict) {
    if (name == "get") {
      if (args.empty())
        fail(where, "get() needs a key.");
      const Value* v = find_item(*obj.dict, str_of(args[0]).s);
      return v ? *v : args.size() > 1 ? args[1] : Value::none();
    }
    List out;
    for (const auto& [k, v] : *obj.dict) {
      if (name == "items")
        out.push_back(Value::array({Value::string(k), v}));
      else if (name == "keys")
        out.push_back(Value::string(k));
      else
        out.push_back(v);
    }
    return Value::array(std::move(out));
  }
  const Text& t = obj.str;
  const std::string& s = t.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return text_value(strip(
        t, arg(args, 0, kwargs, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "upper" || name == "lower") {
    std::string r = s;
    for (char& c : r)
      c = char(
          name == "upper" ? std::toupper((unsigned char)c)
                          : std::tolower((unsigned char)c));
    return Value::string(r);
  }
  if (name == "title" || name == "capitalize") {
    std::string r = s;
    bool start = true;
    for (char& c : r) {
      bool alpha = std::isalpha((unsigned char)c);
      c = char(
          start && alpha ? std::toupper((unsigned char)c)
                         : std::tolower((unsigned char)c));
      if (name == "title")
        start = !alpha;
      else if (alpha || !start)
        start = false;
    }
    return Value::string(r);
  }
  auto string_arg = [&](size_t k, const char* what) -> const std::string& {
    if (k >= args.size() || args[k].kind != VK::String)
      fail(where, name + "() needs " + what + ".");
    return args[k].str.s;
  };
  if (name == "startswith" || name == "endswith") {
    if (args.empty())
      fail(where, name + "() needs a prefix.");
    List options = args[0].kind == VK::List ? *args[0].list : List{args[0]};
    for (const auto& o : options) {
      const std::string& p = o.str.s;
      bool hit = p.size() <= s.size() &&
          (name == "startswith"
               ? s.compare(0, p.size(), p) == 0
               : s.compare(s.size() - p.size(), p.size(), p) == 0);
      if (hit)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "find") {
    size_t at = s.find(string_arg(0, "a string to find"));
    return Value::integer(at == std::string::npos ? -1 : int64_t(at));
  }
  if (name == "replace") {
    const std::string& from = string_arg(0, "the text to replace");
    const std::string& to = string_arg(1, "the replacement");
    std::string r;
    if (from.empty())
      return Value::string(s);
    size_t p = 0, q;
    while ((q = s.find(from, p)) != std::string::npos) {
      r += s.substr(p, q - p) + to;
      check_size(r.size());
      p = q + from.size();
    }
    return Value::string(r + s.substr(p));
  }
  // split(sep=None, maxsplit=-1)
  const Value* sep = arg(args, 0, kwargs, "sep");
  const Value* maxv = arg(args, 1, kwargs, "maxsplit");
  int64_t max = maxv ? as_int(*maxv, where) : -1;
  List parts;
  if (!sep || sep->kind == VK::None) {
    size_t p = 0;
    while (p < s.size()) {
      while (p < s.size() && is_ws(s[p]))
        ++p;
      if (p >= s.size())
        break;
      size_t q = p;
      if (max >= 0 && int64_t(parts.size()) == max) {
        size_t e = s.size();
        while (e > p && is_ws(s[e - 1]))
          --e;
        parts.push_back(text_value(sub(t, p, e)));
        break;
      }
      while (q < s.size() && !is_ws(s[q]))
        ++q;
      parts.push_back(text_value(sub(t, p, q)));
      p = q;
    }
    return Value::array(std::move(parts));
  }
  const std::string& d = sep->str.s;
  if (d.empty())
    fail(where, "split() got an empty separator.");
  size_t p = 0, q;
  while ((max < 0 || int64_t(parts.size()) < max) &&
         (q = s.find(d, p)) != std::string::npos) {
    parts.push_back(text_value(sub(t, p, q)));
    p = q + d.size();
  }
  parts.push_back(text_value(sub(t, p, s.size())));
  return Value::array(std::move(parts));
}

} // namespace orchard::text::jinja
