// Evaluation of parsed Jinja templates (text/jinja_ast.h). Values behave as
// the Python objects Jinja2 would see: str() and truthiness follow Python,
// an undefined name prints as "" and is falsy, attribute access on a
// mapping falls back to its items, `and`/`or` return an operand.
#include "text/jinja.h"

#include "core/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

namespace orchard::text::jinja {

Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::string(std::string s, int tag) {
  Value v;
  v.kind = Kind::String;
  if (tag >= 0)
    v.str.spans.push_back({0, s.size(), tag});
  v.str.s = std::move(s);
  return v;
}
Value Value::array(List items) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::object(Pairs items) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Pairs>(std::move(items));
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::Func;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

namespace {

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  explicit Renderer(const std::string& name) : name_(name) {}

  Flow exec(const Body& body, Text& out) {
    for (const auto& n : body) {
      Flow f = exec(*n, out);
      if (f != Flow::Normal)
        return f;
    }
    return Flow::Normal;
  }

  std::vector<std::map<std::string, Value>> scopes;

 private:
  std::string at(int line) const {
    return name_ + ":" + std::to_string(line);
  }
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw UserError(name_ + ":" + std::to_string(line) + ": " + what);
  }

  Value lookup(const std::string& n) const {
    for (auto s = scopes.rbegin(); s != scopes.rend(); ++s) {
      auto it = s->find(n);
      if (it != s->end())
        return it->second;
    }
    Value u; // undefined; remembers its name for messages
    u.str.s = n;
    return u;
  }

  Flow exec(const Node& n, Text& out) {
    charge(1, at(n.line));
    switch (n.kind) {
      case Node::Kind::Text:
        if (out.s.size() + n.text.size() > kMaxTextBytes)
          fail(n.line, "the output passes 64 MB.");
        out.s += n.text;
        return Flow::Normal;
      case Node::Kind::Emit:
        append(out, str_of(eval(*n.expr)));
        return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond)))
            return exec(body, out);
        return Flow::Normal;
      case Node::Kind::For:
        return exec_for(n, out);
      case Node::Kind::Set: {
        Value v;
        if (n.expr) {
          v = eval(*n.expr);
        } else {
          Text body;
          exec(n.body, body);
          v.kind = Value::Kind::String;
          v.str = std::move(body);
        }
        if (n.targets.size() == 1) {
          scopes.back()[n.targets[0]] = v;
        } else {
          List items = iterate(v, at(n.line));
          if (items.size() != n.targets.size())
            fail(
                n.line,
                "cannot unpack " + std::to_string(items.size()) +
                    " values into " + std::to_string(n.targets.size()) +
                    " names.");
          for (size_t k = 0; k < items.size(); ++k)
            scopes.back()[n.targets[k]] = items[k];
        }
        return Flow::Normal;
      }
      case Node::Kind::SetAttr: {
        Value ns = lookup(n.targets[0]);
        if (ns.kind != Value::Kind::Dict || !ns.is_namespace)
          fail(
              n.line,
              "'" + n.targets[0] +
                  "' is not a namespace(); only a namespace's attributes can be set.");
        set_item(*ns.dict, n.targets[1], eval(*n.expr));
        return Flow::Normal;
      }
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
      case Node::Kind::Block:
        return exec(n.body, out);
    }
    return Flow::Normal;
  }

  Flow exec_for(const Node& n, Text& out) {
    List items = iterate(eval(*n.expr), at(n.line));
    scopes.emplace_back();
    if (n.filter) { // `for x in xs if cond`: loop.* counts what passes
      List kept;
      for (auto& item : items) {
        bind(n, item);
        if (truthy(eval(*n.filter)))
          kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (size_t k = 0; k < items.size(); ++k) {
      charge(1, at(n.line));
      scopes.back().clear();
      bind(n, items[k]);
      const int64_t len = int64_t(items.size()), idx = int64_t(k);
      Pairs loop = {
          {"index", Value::integer(idx + 1)},
          {"index0", Value::integer(idx)},
          {"revindex", Value::integer(len - idx)},
          {"revindex0", Value::integer(len - idx - 1)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k + 1 == items.size())},
          {"length", Value::integer(len)},
          {"previtem", k > 0 ? items[k - 1] : Value{}},
          {"nextitem", k + 1 < items.size() ? items[k + 1] : Value{}},
      };
      scopes.back()["loop"] = Value::object(std::move(loop));
      if (exec(n.body, out) == Flow::Break)
        break;
    }
    scopes.pop_back();
    if (items.empty())
      exec(n.otherwise, out);
    return Flow::Normal;
  }

  void bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes.back()[n.targets[0]] = item;
      return;
    }
    List parts = iterate(item, at(n.line));
    if (parts.size() != n.targets.size())
      fail(
          n.line,
          "cannot unpack " + std::to_string(parts.size()) + " values into " +
              std::to_string(n.targets.size()) + " loop names.");
    for (size_t k = 0; k < parts.size(); ++k)
      scopes.back()[n.targets[k]] = parts[k];
  }

  Value eval(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::Literal:
        return e.value;
      case K::Name:
        return lookup(e.name);
      case K::Attr: {
        Value obj = eval(*e.a);
        if (obj.kind == Value::Kind::Undefined)
          fail(
              e.line,
              "'" + obj.str.s + "' is undefined (reading ." + e.name + ").");
        if (obj.kind == Value::Kind::Dict) {
          if (const Value* v = find_item(*obj.dict, e.name))
            return *v;
          if (!obj.is_namespace && is_method(obj, e.name))
            return bound_method(obj, e.name, e.line);
          return Value{};
        }
        if (is_method(obj, e.name))
          return bound_method(obj, e.name, e.line);
        Value u;
        u.str.s = e.name;
        return u;
      }
      case K::Item: {
        Value obj = eval(*e.a);
        if (obj.kind == Value::Kind::Undefined)
          fail(
              e.line,
              "'" + obj.str.s + "' is undefined (reading an item of it).");
        return item(obj, eval(*e.b), at(e.line));
      }
      case K::Slice: {
        Value obj = eval(*e.a);
        std::optional<int64_t> part[3];
        for (int k = 0; k < 3; ++k)
          if (e.args[k]) {
            Value v = eval(*e.args[k]);
            if (v.kind != Value::Kind::None)
              part[k] = as_int(v, at(e.line));
          }
        return slice(obj, part[0], part[1], part[2], at(e.line));
      }
      case K::Call: {
        Value f = eval(*e.a);
        if (f.kind != Value::Kind::Func)
          fail(e.line, "cannot call " + describe(f) + ".");
        List args;
        Pairs kwargs;
        for (const auto& a : e.args)
          args.push_back(eval(*a));
        for (const auto& [k, v] : e.kwargs)
          kwargs.emplace_back(k, eval(*v));
        return (*f.fn)(args, kwargs);
      }
      case K::Filter: {
        List args{eval(*e.a)};
        Pairs kwargs;
        for (const auto& a : e.args)
          args.push_back(eval(*a));
        for (const auto& [k, v] : e.kwargs)
          kwargs.emplace_back(k, eval(*v));
        Builtins b{name_ + ":" + std::to_string(e.line)};
        return b.filter(e.name, args, kwargs);
      }
      case K::Test: {
        List args;
        for (const auto& a : e.args)
          args.push_back(eval(*a));
        Builtins b{name_ + ":" + std::to_string(e.line)};
        bool r = b.test(e.name, eval(*e.a), args);
        return Value::boolean(r != e.negated);
      }
      case K::Not:
        return Value::boolean(!truthy(eval(*e.a)));
      case K::Negate: {
        Value v = eval(*e.a);
        if (v.kind == Value::Kind::Int)
          return Value::integer(checked('-', 0, v.i, at(e.line)));
        if (v.kind == Value::Kind::Float) {
          v.f = -v.f;
          return v;
        }
        fail(e.line, "cannot negate " + describe(v) + ".");
      }
      case K::And: {
        Value a = eval(*e.a);
        return truthy(a) ? eval(*e.b) : a;
      }
      case K::Or: {
        Value a = eval(*e.a);
        return truthy(a) ? a : eval(*e.b);
      }
      case K::Conditional:
        if (truthy(eval(*e.a)))
          return eval(*e.b);
        return e.c ? eval(*e.c) : Value{};
      case K::ListLit: {
        List items;
        for (const auto& a : e.args)
          items.push_back(eval(*a));
        return Value::array(std::move(items));
      }
      case K::DictLit: {
        Pairs items;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          set_item(items, str_of(key).s, eval(*e.args[k + 1]));
        }
        return Value::object(std::move(items));
      }
      case K::Binary:
        return binary(e.name, eval(*e.a), eval(*e.b), e.line);
    }
    return Value{};
  }

  Value binary(
      const std::string& op,
      const Value& a,
      const Value& b,
      int line) {
    using VK = Value::Kind;
    if (op == "==")
      return Value::boolean(equal(a, b));
    if (op == "!=")
      return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in")
      return Value::boolean(contains(b, a, at(line)) == (op == "in"));
    if (op == "~") {
      Text t = str_of(a);
      append(t, str_of(b));
      Value v;
      v.kind = VK::String;
      v.str = std::move(t);
      return v;
    }
    if (op == "+" && a.kind == VK::String && b.kind == VK::String) {
      Value v = a;
      append(v.str, b.str);
      return v;
    }
    if (op == "+" && a.kind == VK::List && b.kind == VK::List) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::array(std::move(items));
    }
    const bool numbers =
        (a.kind == VK::Int || a.kind == VK::Float || a.kind == VK::Bool) &&
        (b.kind == VK::Int || b.kind == VK::Float || b.kind == VK::Bool);
    if (!numbers) {
      if (op == "*" && a.kind == VK::String && b.kind == VK::Int) {
        constexpr int64_t kMaxBytes = 1 << 26; // 64 MB: no template needs more
        if (b.i > 0 && int64_t(a.str.s.size()) > kMaxBytes / b.i)
          fail(
              line, "string * " + std::to_string(b.i) + " would exceed 64 MB.");
        Value v = Value::string("");
        for (int64_t k = 0; k < b.i; ++k)
          v.str.s += a.str.s;
        return v;
      }
      fail(
          line,
          "unsupported operand types for " + op + ": " + describe(a) + " and " +
              describe(b) + ".");
    }
    const bool ints = a.kind != VK::Float && b.kind != VK::Float;
    const int64_t ai = a.kind == VK::Bool ? a.b : a.i,
                  bi = b.kind == VK::Bool ? b.b : b.i;
    const double af = a.kind == VK::Float ? a.f : double(ai);
    const double bf = b.kind == VK::Float ? b.f : double(bi);
    auto real = [](double x) {
      Value v;
      v.kind = VK::Float;
      v.f = x;
      return v;
    };
    if (op == "<")
      return Value::boolean(af < bf);
    if (op == ">")
      return Value::boolean(af > bf);
    if (op == "<=")
      return Value::boolean(af <= bf);
    if (op == ">=")
      return Value::boolean(af >= bf);
    if (op == "+" || op == "-" || op == "*")
      return ints     ? Value::integer(checked(op[0], ai, bi, at(line)))
          : op == "+" ? real(af + bf)
          : op == "-" ? real(af - bf)
                      : real(af * bf);
    if (ints && (op == "//" || op == "%") && bi == -1) // INT64_MIN / -1 traps
      return Value::integer(op == "%" ? 0 : checked('-', 0, ai, at(line)));
    if ((op == "/" || op == "//" || op == "%") && bf == 0)
      fail(line, "division by zero.");
    if (op == "/")
      return real(af / bf);
    if (op == "//") { // Python floors
      if (!ints)
        return real(std::floor(af / bf));
      int64_t q = ai / bi;
      return Value::integer(
          (ai % bi != 0 && ((ai < 0) != (bi < 0))) ? q - 1 : q);
    }
    if (op == "%") {
      if (!ints)
        return real(af - bf * std::floor(af / bf));
      int64_t r = ai % bi;
      return Value::integer((r != 0 && ((r < 0) != (bi < 0))) ? r + bi : r);
    }
    if (op == "**") {
      const double p = std::pow(af, bf);
      if (!ints || bi < 0)
        return real(p);
      // 2^63 is exact in a double; anything at or past it overflows.
      if (!(std::fabs(p) < 9223372036854775808.0))
        fail(
            line,
            std::to_string(ai) + " ** " + std::to_string(bi) +
                " does not fit in a 64-bit integer.");
      return Value::integer(int64_t(std::llround(p)));
    }
    fail(line, "unknown operator " + op + ".");
  }

  Value bound_method(const Value& obj, const std::string& name, int line) {
    std::string where = name_ + ":" + std::to_string(line);
    return Value::function([obj, name, where](List& args, Pairs& kwargs) {
      return call_method(obj, name, args, kwargs, where);
    });
  }

  const std::string& name_;
};

} // namespace

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(const std::string& source, std::string name)
    : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->body = parse_template(source, impl_->name);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

Output Template::render(const Pairs& context) const {
  reset_work();
  Renderer r(impl_->name);
  r.scopes.emplace_back(globals(impl_->name));
  r.scopes.emplace_back();
  for (const auto& [k, v] : context)
    r.scopes.back()[k] = v;
  Text out;
  r.exec(impl_->body, out);
  return {std::move(out.s), std::move(out.spans)};
}

} // namespace orchard::text::jinja
