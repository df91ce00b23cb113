// Python semantics of Jinja values, and the globals chat templates use:
// str() and repr(), truthiness, equality, items and slices, transformers'
// raise_exception and tojson (no key sorting, no HTML escaping). The
// str/dict methods are in jinja_methods.cpp.
#include "text/jinja_builtins.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace orchard::text::jinja {
namespace {

using VK = Value::Kind;

thread_local uint64_t work_done = 0;
thread_local int value_depth = 0;

// Counts one level of a value being printed or compared.
class DepthGuard {
 public:
  DepthGuard() {
    if (++value_depth > kMaxValueDepth) {
      value_depth = 0; // the UserError unwinds every guard's level
      throw UserError(
          "a value nests deeper than " + std::to_string(kMaxValueDepth) +
          " levels (a namespace or list that holds itself?).");
    }
  }
  ~DepthGuard() {
    if (value_depth > 0)
      --value_depth;
  }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

std::string py_float(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x < 0 ? "-inf" : "inf";
  char buf[40];
  for (int p = 1; p <= 17; ++p) { // shortest text that reads back, as repr()
    std::snprintf(buf, sizeof buf, "%.*g", p, x);
    if (std::strtod(buf, nullptr) == x)
      break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s;
}

std::string py_repr(const Value& v) {
  if (v.kind != VK::String)
    return str_of(v).s;
  const std::string& s = v.str.s;
  char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos
      ? '"'
      : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\')
      out += std::string("\\") + c;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else
      out += c;
  }
  return out + q;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json(const Value& v, int indent, int level, std::string& out) {
  DepthGuard guard;
  auto newline = [&](int lvl) {
    if (indent >= 0) {
      check_size(out.size() + size_t(indent) * size_t(lvl));
      out += "\n" + std::string(size_t(indent) * size_t(lvl), ' ');
    }
  };
  const char* comma = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case VK::None:
      out += "null";
      return;
    case VK::Bool:
      out += v.b ? "true" : "false";
      return;
    case VK::Int:
      out += std::to_string(v.i);
      return;
    case VK::Float:
      out += std::isnan(v.f) ? "NaN" : py_float(v.f);
      return;
    case VK::String:
      json_string(v.str.s, out);
      return;
    case VK::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k)
          out += comma;
        newline(level + 1);
        json((*v.list)[k], indent, level + 1, out);
      }
      newline(level);
      out += "]";
      return;
    case VK::Dict:
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      out += "{";
      for (size_t k = 0; k < v.dict->size(); ++k) {
        if (k)
          out += comma;
        newline(level + 1);
        json_string((*v.dict)[k].first, out);
        out += ": ";
        json((*v.dict)[k].second, indent, level + 1, out);
      }
      newline(level);
      out += "}";
      return;
    default:
      throw UserError("tojson: " + describe(v) + " is not JSON serializable.");
  }
}

} // namespace

void fail(const std::string& where, const std::string& what) {
  throw UserError(where + ": " + what);
}

void check_size(size_t bytes) {
  if (bytes > kMaxTextBytes)
    throw UserError(
        "the template builds a string over " +
        std::to_string(kMaxTextBytes >> 20) + " MB.");
}

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
      c == '\v';
}

std::vector<size_t> code_points(const std::string& s) {
  std::vector<size_t> at;
  for (size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80)
      at.push_back(k);
  at.push_back(s.size());
  return at;
}

Text sub(const Text& t, size_t a, size_t b) {
  Text out;
  out.s = t.s.substr(a, b - a);
  for (const auto& sp : t.spans) {
    size_t x = std::max(sp.begin, a), y = std::min(sp.end, b);
    if (x < y || (sp.begin == sp.end && sp.begin >= a && sp.begin <= b))
      out.spans.push_back({x - a, std::max(x, y) - a, sp.tag});
  }
  return out;
}

Text strip(const Text& t, const Value* chars, bool left, bool right) {
  auto strip_it = [&](char c) {
    if (!chars || chars->kind == VK::None)
      return is_ws(c);
    return chars->str.s.find(c) != std::string::npos;
  };
  size_t a = 0, b = t.s.size();
  while (left && a < b && strip_it(t.s[a]))
    ++a;
  while (right && b > a && strip_it(t.s[b - 1]))
    --b;
  return sub(t, a, b);
}

Value text_value(Text t) {
  Value v;
  v.kind = VK::String;
  v.str = std::move(t);
  return v;
}

const Value* kwarg(const Pairs& kwargs, const std::string& name) {
  return find_item(kwargs, name);
}

const Value* arg(
    const List& args,
    size_t k,
    const Pairs& kwargs,
    const std::string& name) {
  if (k < args.size())
    return &args[k];
  return kwarg(kwargs, name);
}

Value attribute(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t from = 0;
  while (from <= path.size()) {
    size_t dot = path.find('.', from);
    std::string part = path.substr(
        from, dot == std::string::npos ? std::string::npos : dot - from);
    const Value* next =
        cur.kind == VK::Dict ? find_item(*cur.dict, part) : nullptr;
    if (!next)
      return Value{};
    cur = *next;
    if (dot == std::string::npos)
      break;
    from = dot + 1;
  }
  return cur;
}

void reset_work() {
  work_done = 0;
  value_depth = 0;
}

void charge(uint64_t units, const std::string& where) {
  work_done += units;
  if (work_done > kMaxWork)
    fail(
        where,
        "the template does more than " + std::to_string(kMaxWork) +
            " steps of work for one conversation; no chat template needs "
            "that many (a loop that never ends?).");
}

int64_t checked(char op, int64_t a, int64_t b, const std::string& where) {
  int64_t r = 0;
  bool overflow = op == '+' ? __builtin_add_overflow(a, b, &r)
      : op == '-'           ? __builtin_sub_overflow(a, b, &r)
                            : __builtin_mul_overflow(a, b, &r);
  if (overflow)
    fail(
        where,
        std::to_string(a) + " " + op + " " + std::to_string(b) +
            " does not fit in a 64-bit integer.");
  return r;
}

void append(Text& out, const Text& t) {
  check_size(out.s.size() + t.s.size());
  const size_t base = out.s.size();
  for (const auto& sp : t.spans)
    out.spans.push_back({sp.begin + base, sp.end + base, sp.tag});
  out.s += t.s;
}

Text str_of(const Value& v) {
  DepthGuard guard;
  Text t;
  switch (v.kind) {
    case VK::Undefined:
      break;
    case VK::None:
      t.s = "None";
      break;
    case VK::Bool:
      t.s = v.b ? "True" : "False";
      break;
    case VK::Int:
      t.s = std::to_string(v.i);
      break;
    case VK::Float:
      t.s = py_float(v.f);
      break;
    case VK::String:
      return v.str;
    case VK::List: {
      t.s = "[";
      for (size_t k = 0; k < v.list->size(); ++k)
        t.s += (k ? ", " : "") + py_repr((*v.list)[k]);
      t.s += "]";
      break;
    }
    case VK::Dict: {
      t.s = v.is_namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        t.s += (k ? ", '" : "'") + (*v.dict)[k].first +
            "': " + py_repr((*v.dict)[k].second);
      t.s += v.is_namespace ? "}>" : "}";
      break;
    }
    case VK::Func:
      t.s = "<function>";
      break;
  }
  return t;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case VK::Undefined:
    case VK::None:
      return false;
    case VK::Bool:
      return v.b;
    case VK::Int:
      return v.i != 0;
    case VK::Float:
      return v.f != 0;
    case VK::String:
      return !v.str.s.empty();
    case VK::List:
      return !v.list->empty();
    case VK::Dict:
      return v.is_namespace || !v.dict->empty();
    case VK::Func:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  DepthGuard guard;
  auto number = [](const Value& v) {
    return v.kind == VK::Int || v.kind == VK::Float || v.kind == VK::Bool;
  };
  if (number(a) && number(b)) {
    auto d = [](const Value& v) {
      return v.kind == VK::Float ? v.f
          : v.kind == VK::Bool   ? double(v.b)
                                 : double(v.i);
    };
    return d(a) == d(b);
  }
  if (a.kind != b.kind)
    return false;
  switch (a.kind) {
    case VK::Undefined:
    case VK::None:
      return true;
    case VK::String:
      return a.str.s == b.str.s;
    case VK::List:
      if (a.list->size() != b.list->size())
        return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k]))
          return false;
      return true;
    case VK::Dict:
      if (a.is_namespace || b.is_namespace)
        return a.dict == b.dict;
      if (a.dict->size() != b.dict->size())
        return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* w = find_item(*b.dict, k);
        if (!w || !equal(v, *w))
          return false;
      }
      return true;
    case VK::Func:
      return a.fn == b.fn;
    default:
      return false;
  }
}

std::string describe(const Value& v) {
  switch (v.kind) {
    case VK::Undefined:
      return "undefined '" + v.str.s + "'";
    case VK::None:
      return "none";
    case VK::Bool:
      return "a boolean";
    case VK::Int:
      return "an integer";
    case VK::Float:
      return "a float";
    case VK::String:
      return "a string";
    case VK::List:
      return "a list";
    case VK::Dict:
      return v.is_namespace ? "a namespace" : "a mapping";
    case VK::Func:
      return "a function";
  }
  return "a value";
}

bool contains(const Value& hay, const Value& needle, const std::string& where) {
  switch (hay.kind) {
    case VK::String:
      if (needle.kind != VK::String)
        fail(
            where,
            "'in <string>' needs a string on the left, not " +
                describe(needle) + ".");
      return hay.str.s.find(needle.str.s) != std::string::npos;
    case VK::List:
      for (const auto& v : *hay.list)
        if (equal(v, needle))
          return true;
      return false;
    case VK::Dict:
      return needle.kind == VK::String && find_item(*hay.dict, needle.str.s);
    default:
      fail(
          where,
          "'in' needs a string, list or mapping on the right, not " +
              describe(hay) + ".");
  }
}

List iterate(const Value& v, const std::string& where) {
  switch (v.kind) {
    case VK::Undefined:
      return {};
    case VK::List:
      charge(v.list->size(), where);
      return *v.list;
    case VK::Dict: {
      List keys;
      for (const auto& [k, _] : *v.dict)
        keys.push_back(Value::string(k));
      return keys;
    }
    case VK::String: {
      List chars;
      auto at = code_points(v.str.s);
      charge(at.size(), where);
      for (size_t k = 0; k + 1 < at.size(); ++k)
        chars.push_back(text_value(sub(v.str, at[k], at[k + 1])));
      return chars;
    }
    default:
      fail(where, "cannot loop over " + describe(v) + ".");
  }
}

int64_t as_int(const Value& v, const std::string& where) {
  if (v.kind == VK::Int)
    return v.i;
  if (v.kind == VK::Bool)
    return v.b;
  fail(where, "expected an integer, got " + describe(v) + ".");
}

Value item(const Value& obj, const Value& key, const std::string& where) {
  if (obj.kind == VK::Dict) {
    const Value* v = find_item(*obj.dict, str_of(key).s);
    if (v)
      return *v;
    if (key.kind == VK::String && is_method(obj, key.str.s))
      return Value{}; // d['items'] is the item, never the method
    Value u;
    u.str.s = str_of(key).s;
    return u;
  }
  if (obj.kind == VK::List || obj.kind == VK::String) {
    if (key.kind != VK::Int && key.kind != VK::Bool)
      return Value{};
    if (obj.kind == VK::List) {
      int64_t n = int64_t(obj.list->size()), k = as_int(key, where);
      if (k < 0)
        k += n;
      return k >= 0 && k < n ? (*obj.list)[size_t(k)] : Value{};
    }
    auto at = code_points(obj.str.s);
    int64_t n = int64_t(at.size()) - 1, k = as_int(key, where);
    if (k < 0)
      k += n;
    if (k < 0 || k >= n)
      return Value{};
    return text_value(sub(obj.str, at[size_t(k)], at[size_t(k) + 1]));
  }
  if (obj.kind == VK::None)
    fail(where, "none has no items (reading [" + str_of(key).s + "]).");
  return Value{};
}

Value slice(
    const Value& obj,
    std::optional<int64_t> start,
    std::optional<int64_t> stop,
    std::optional<int64_t> step,
    const std::string& where) {
  if (obj.kind != VK::List && obj.kind != VK::String)
    fail(where, "cannot slice " + describe(obj) + ".");
  const int64_t s = step.value_or(1);
  if (s == 0)
    fail(where, "a slice step cannot be zero.");
  std::vector<size_t> at;
  int64_t n;
  if (obj.kind == VK::String) {
    at = code_points(obj.str.s);
    n = int64_t(at.size()) - 1;
  } else {
    n = int64_t(obj.list->size());
  }
  auto norm =
      [&](std::optional<int64_t> x, int64_t dflt, int64_t lo, int64_t hi) {
        if (!x)
          return dflt;
        int64_t v = *x < 0 ? *x + n : *x;
        return std::clamp(v, lo, hi);
      };
  int64_t a, b;
  if (s > 0) {
    a = norm(start, 0, 0, n);
    b = norm(stop, n, 0, n);
  } else {
    a = norm(start, n - 1, -1, n - 1);
    b = norm(stop, -1, -1, n - 1);
  }
  if (obj.kind == VK::String && s == 1)
    return text_value(sub(obj.str, at[size_t(a)], at[size_t(std::max(a, b))]));
  List items;
  Text t;
  for (int64_t k = a; s > 0 ? k < b : k > b;) {
    if (obj.kind == VK::List)
      items.push_back((*obj.list)[size_t(k)]);
    else
      append(t, sub(obj.str, at[size_t(k)], at[size_t(k) + 1]));
    if (__builtin_add_overflow(k, s, &k)) // a step past either end
      break;
  }
  return obj.kind == VK::List ? Value::array(std::move(items))
                              : text_value(std::move(t));
}

const Value* find_item(const Pairs& d, const std::string& key) {
  for (const auto& [k, v] : d)
    if (k == key)
      return &v;
  return nullptr;
}

void set_item(Pairs& d, const std::string& key, Value v) {
  for (auto& [k, old] : d)
    if (k == key) {
      old = std::move(v);
      return;
    }
  d.emplace_back(key, std::move(v));
}

std::map<std::string, Value> globals(const std::string& template_name) {
  std::map<std::string, Value> g;
  g["raise_exception"] =
      Value::function([template_name](List& args, Pairs&) -> Value {
        throw UserError(
            template_name + ": the chat template refused the conversation: " +
            (args.empty() ? std::string("(no message)") : str_of(args[0]).s));
      });
  g["namespace"] = Value::function([](List& args, Pairs& kwargs) {
    Value ns = Value::object(
        !args.empty() && args[0].kind == VK::Dict ? *args[0].dict : Pairs{});
    for (auto& [k, v] : kwargs)
      set_item(*ns.dict, k, v);
    ns.is_namespace = true;
    return ns;
  });
  g["dict"] = Value::function(
      [](List&, Pairs& kwargs) { return Value::object(kwargs); });
  g["range"] = Value::function([template_name](List& args, Pairs&) {
    std::string where = template_name + ": range()";
    if (args.empty() || args.size() > 3)
      fail(where, "takes 1 to 3 integers.");
    int64_t a = 0, b, s = 1;
    if (args.size() == 1) {
      b = as_int(args[0], where);
    } else {
      a = as_int(args[0], where);
      b = as_int(args[1], where);
      if (args.size() == 3)
        s = as_int(args[2], where);
    }
    if (s == 0)
      fail(where, "step cannot be zero.");
    // A template is a file anyone can edit; no chat template loops this far.
    // (In 128 bits: b - a overflows 64 for the widest ranges.)
    constexpr int64_t kMaxRange = 1'000'000;
    const __int128 span = __int128(b) - a;
    const __int128 count = s > 0 ? (span + s - 1) / s : (span + s + 1) / s;
    if (count > kMaxRange)
      fail(where, "gives more than 1,000,000 numbers.");
    charge(count > 0 ? uint64_t(count) : 0, where);
    List out;
    for (__int128 k = 0; k < count; ++k)
      out.push_back(Value::integer(int64_t(a + k * s)));
    return Value::array(std::move(out));
  });
  return g;
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json(v, indent, 0, out);
  return out;
}

} // namespace orchard::text::jinja
