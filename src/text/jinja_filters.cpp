// Jinja2's built-in filters and tests that chat templates use, with
// transformers' tojson. Names and behaviour follow
// jinja.palletsprojects.com/en/stable/templates/#builtin-filters.
#include "text/jinja_builtins.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace orchard::text::jinja {
namespace {
using VK = Value::Kind;
} // namespace

Value Builtins::filter(const std::string& name, List& args, Pairs& kwargs)
    const {
  const Value& v = args[0];
  List rest(args.begin() + 1, args.end());
  if (name == "trim")
    return text_value(
        strip(str_of(v), arg(rest, 0, kwargs, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (v.kind == VK::String)
      return Value::integer(int64_t(code_points(v.str.s).size()) - 1);
    if (v.kind == VK::List)
      return Value::integer(int64_t(v.list->size()));
    if (v.kind == VK::Dict)
      return Value::integer(int64_t(v.dict->size()));
    if (v.kind == VK::Undefined)
      return Value::integer(0);
    fail(where, describe(v) + " has no length.");
  }
  if (name == "tojson") {
    const Value* ind = arg(rest, 0, kwargs, "indent");
    const int64_t width =
        ind && ind->kind != VK::None ? as_int(*ind, where) : -1;
    constexpr int64_t kMaxIndent = 1000;
    if (width > kMaxIndent)
      fail(where, "tojson indent above " + std::to_string(kMaxIndent) + ".");
    const int indent = int(std::max<int64_t>(width, -1));
    try {
      return Value::string(to_json(v, indent));
    } catch (const UserError& e) {
      fail(where, e.what());
    }
  }
  if (name == "string")
    return text_value(str_of(v));
  if (name == "list")
    return Value::array(iterate(v, where));
  if (name == "safe")
    return v;
  if (name == "first" || name == "last") {
    List items = iterate(v, where);
    if (items.empty())
      return Value{};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    List items = iterate(v, where);
    std::reverse(items.begin(), items.end());
    if (v.kind == VK::String) {
      Text t;
      for (const auto& c : items)
        append(t, c.str);
      return text_value(std::move(t));
    }
    return Value::array(std::move(items));
  }
  if (name == "join") {
    const Value* sep = arg(rest, 0, kwargs, "d");
    const Value* attr = arg(rest, 1, kwargs, "attribute");
    Text out;
    bool first = true;
    for (const auto& item : iterate(v, where)) {
      if (!first && sep)
        append(out, str_of(*sep));
      first = false;
      append(out, str_of(attr ? attribute(item, str_of(*attr).s) : item));
    }
    return text_value(std::move(out));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" ||
      name == "title" || name == "replace") {
    if (v.kind != VK::String)
      fail(
          where,
          "the " + name + " filter needs a string, not " + describe(v) + ".");
    return call_method(v, name, rest, kwargs, where);
  }
  if (name == "default" || name == "d") {
    const Value* dflt = arg(rest, 0, kwargs, "default_value");
    const Value* boolean = arg(rest, 1, kwargs, "boolean");
    bool use =
        v.kind == VK::Undefined || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dflt ? *dflt : Value::string("")) : v;
  }
  if (name == "items") {
    if (v.kind != VK::Dict)
      fail(where, "the items filter needs a mapping, not " + describe(v) + ".");
    return call_method(v, "items", rest, kwargs, where);
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" ||
      name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "selectattr" || name == "select";
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (rest.empty())
        fail(where, name + " needs an attribute name.");
      attr = str_of(rest[k++]).s;
    }
    std::string test_name = k < rest.size() ? str_of(rest[k++]).s : "";
    List test_args(rest.begin() + std::min(k, rest.size()), rest.end());
    List out;
    for (const auto& item : iterate(v, where)) {
      Value x = by_attr ? attribute(item, attr) : item;
      bool pass = test_name.empty() ? truthy(x) : test(test_name, x, test_args);
      if (pass == keep)
        out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (name == "map") {
    List out;
    if (const Value* attr = kwarg(kwargs, "attribute")) {
      const Value* dflt = kwarg(kwargs, "default");
      for (const auto& item : iterate(v, where)) {
        Value x = attribute(item, str_of(*attr).s);
        out.push_back(x.kind == VK::Undefined && dflt ? *dflt : x);
      }
      return Value::array(std::move(out));
    }
    if (rest.empty())
      fail(where, "map needs a filter name or attribute=.");
    std::string f = str_of(rest[0]).s;
    for (const auto& item : iterate(v, where)) {
      List a{item};
      a.insert(a.end(), rest.begin() + 1, rest.end());
      Pairs none;
      out.push_back(filter(f, a, none));
    }
    return Value::array(std::move(out));
  }
  if (name == "int") {
    if (v.kind == VK::Int || v.kind == VK::Bool)
      return Value::integer(v.kind == VK::Bool ? v.b : v.i);
    if (v.kind == VK::Float)
      return Value::integer(int64_t(v.f));
    char* end = nullptr;
    std::string s = str_of(v).s;
    long long x = std::strtoll(s.c_str(), &end, 10);
    return Value::integer(end && *end == 0 && !s.empty() ? x : 0);
  }
  if (name == "abs") {
    if (v.kind == VK::Int)
      return Value::integer(v.i < 0 ? checked('-', 0, v.i, where) : v.i);
    if (v.kind == VK::Float) {
      Value r = v;
      r.f = std::fabs(v.f);
      return r;
    }
    fail(where, "abs needs a number, not " + describe(v) + ".");
  }
  fail(
      where,
      "the filter '" + name +
          "' is not one Orchard's template engine has (it has trim, length, "
          "count, tojson, string, list, safe, first, last, reverse, join, upper, "
          "lower, capitalize, title, replace, default, items, selectattr, "
          "rejectattr, select, reject, map, int, abs).");
}

bool Builtins::test(const std::string& name, const Value& v, const List& args)
    const {
  auto need = [&]() -> const Value& {
    if (args.empty())
      fail(where, "the test '" + name + "' needs a value to compare with.");
    return args[0];
  };
  if (name == "defined")
    return v.kind != VK::Undefined;
  if (name == "undefined")
    return v.kind == VK::Undefined;
  if (name == "none")
    return v.kind == VK::None;
  if (name == "boolean")
    return v.kind == VK::Bool;
  if (name == "true")
    return v.kind == VK::Bool && v.b;
  if (name == "false")
    return v.kind == VK::Bool && !v.b;
  if (name == "string")
    return v.kind == VK::String;
  if (name == "number")
    return v.kind == VK::Int || v.kind == VK::Float;
  if (name == "integer")
    return v.kind == VK::Int;
  if (name == "float")
    return v.kind == VK::Float;
  if (name == "mapping")
    return v.kind == VK::Dict;
  if (name == "iterable")
    return v.kind == VK::String || v.kind == VK::List || v.kind == VK::Dict;
  if (name == "sequence")
    return v.kind == VK::String || v.kind == VK::List || v.kind == VK::Dict;
  if (name == "callable")
    return v.kind == VK::Func;
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas")
    return equal(v, need());
  if (name == "ne" || name == "!=")
    return !equal(v, need());
  if (name == "in")
    return contains(need(), v, where);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    int64_t x = as_int(v, where);
    if (name == "divisibleby") {
      int64_t d = as_int(need(), where);
      return d != 0 && (d == -1 || x % d == 0); // INT64_MIN % -1 traps
    }
    return (x % 2 != 0) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    if (v.kind != VK::String)
      return false;
    for (char c : v.str.s)
      if (std::isalpha((unsigned char)c) &&
          (name == "lower" ? std::isupper((unsigned char)c)
                           : std::islower((unsigned char)c)))
        return false;
    return true;
  }
  if (name == "gt" || name == "ge" || name == "lt" || name == "le" ||
      name == ">" || name == ">=" || name == "<" || name == "<=") {
    const Value& w = need();
    auto num = [&](const Value& x) {
      if (x.kind == VK::Float)
        return x.f;
      return double(as_int(x, where));
    };
    double a = num(v), b = num(w);
    if (name == "gt" || name == ">")
      return a > b;
    if (name == "ge" || name == ">=")
      return a >= b;
    if (name == "lt" || name == "<")
      return a < b;
    return a <= b;
  }
  fail(
      where,
      "the test '" + name + "' is not one Orchard's template engine has.");
}

} // namespace orchard::text::jinja
