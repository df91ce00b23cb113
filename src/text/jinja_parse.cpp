// Jinja source -> Nodes. Grammar and precedence follow Jinja2's parser
// (jinja.palletsprojects.com/en/stable/templates): conditional expressions,
// or, and, not, comparisons, + -, ~, * / // %, **, unary minus, then
// postfix (attribute, subscript, call), filters and tests.
#include "text/jinja_ast.h"

#include "core/error.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace orchard::text::jinja {
namespace {

const char* const kSubset =
    "; Orchard renders a subset of Jinja (if, for, set, filters and tests "
    "chat templates use). Pick a built-in template with chat_template="
    "llama3|chatml|mistral|orchard|plain, or simplify the template.";

// ---- source -> text and tag pieces ----------------------------------------

struct Piece {
  enum class Kind { Text, Expr, Stmt };
  Kind kind;
  std::string body;
  int line;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
      c == '\v';
}

// Where the tag opened at `from` closes (the index of `close`), skipping
// string literals; npos when it never closes.
size_t tag_end(const std::string& src, size_t from, const char* close) {
  char quote = 0;
  for (size_t i = from; i + 1 < src.size(); ++i) {
    char c = src[i];
    if (quote) {
      if (c == '\\')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if ((c == '\'' || c == '"') && close[0] != '#') {
      quote = c;
    } else if (c == close[0] && src[i + 1] == close[1]) {
      return i;
    }
  }
  return std::string::npos;
}

// trim_blocks: the newline right after a block or comment tag goes.
// lstrip_blocks: spaces and tabs between a line's start and a block or
// comment tag go. "-" inside a tag's delimiter strips all whitespace on
// that side. These are transformers' settings for chat templates.
std::vector<Piece> split(const std::string& src, const std::string& name) {
  std::vector<Piece> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, line_starting = true;
  auto count_lines = [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i)
      line += src[i] == '\n';
  };
  while (pos <= src.size()) {
    size_t open = std::string::npos;
    for (size_t i = pos; i + 1 < src.size(); ++i)
      if (src[i] == '{' &&
          (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')) {
        open = i;
        break;
      }
    std::string text = src.substr(
        pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k]))
        ++k;
      text.erase(0, k);
    }
    if (open == std::string::npos) {
      if (!text.empty())
        out.push_back({Piece::Kind::Text, text, text_line});
      break;
    }
    count_lines(pos, open);
    const char kind = src[open + 1];
    const char mod = open + 2 < src.size() ? src[open + 2] : 0;
    if (mod == '-') {
      while (!text.empty() && is_space(text.back()))
        text.pop_back();
    } else if (mod != '+' && kind != '{') {
      size_t nl = text.rfind('\n');
      size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_starting) &&
          text.find_first_not_of(" \t", from) == std::string::npos)
        text.erase(from);
    }
    if (!text.empty())
      out.push_back({Piece::Kind::Text, text, text_line});
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t body = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
    size_t end = tag_end(src, body, close);
    if (end == std::string::npos)
      throw UserError(
          name + ":" + std::to_string(line) + ": the tag opened here with '{" +
          std::string(1, kind) + "' is never closed with '" + close + "'.");
    const bool end_minus = end > body && src[end - 1] == '-';
    std::string inner = src.substr(body, (end_minus ? end - 1 : end) - body);
    if (kind != '#')
      out.push_back(
          {kind == '{' ? Piece::Kind::Expr : Piece::Kind::Stmt, inner, line});
    count_lines(open, end + 2);
    pos = end + 2;
    strip_next = end_minus;
    line_starting = false;
    if (!end_minus && kind != '{' && pos < src.size() && src[pos] == '\n') {
      ++pos;
      ++line;
      line_starting = true;
    }
  }
  return out;
}

// ---- expression tokens ------------------------------------------------------

struct Tok {
  enum class Kind { Name, Str, Int, Float, Op, End };
  Kind kind = Kind::End;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

std::vector<Tok> lex(const std::string& body, const std::string& where) {
  std::vector<Tok> out;
  size_t p = 0;
  while (p < body.size()) {
    char c = body[p];
    if (is_space(c)) {
      ++p;
    } else if (std::isalpha((unsigned char)c) || c == '_') {
      size_t q = p;
      while (q < body.size() &&
             (std::isalnum((unsigned char)body[q]) || body[q] == '_'))
        ++q;
      out.push_back({Tok::Kind::Name, body.substr(p, q - p)});
      p = q;
    } else if (std::isdigit((unsigned char)c)) {
      size_t q = p;
      while (q < body.size() && std::isdigit((unsigned char)body[q]))
        ++q;
      bool is_float = q + 1 < body.size() && body[q] == '.' &&
          std::isdigit((unsigned char)body[q + 1]);
      if (is_float) {
        ++q;
        while (q < body.size() && std::isdigit((unsigned char)body[q]))
          ++q;
        Tok t{Tok::Kind::Float, body.substr(p, q - p)};
        t.f = std::strtod(t.s.c_str(), nullptr); // inf when too large
        out.push_back(t);
      } else {
        Tok t{Tok::Kind::Int, body.substr(p, q - p)};
        errno = 0;
        t.i = std::strtoll(t.s.c_str(), nullptr, 10);
        if (errno == ERANGE)
          throw UserError(
              where + ": the number " + t.s +
              " does not fit in a 64-bit integer.");
        out.push_back(t);
      }
      p = q;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t q = p + 1;
      for (; q < body.size() && body[q] != c; ++q) {
        if (body[q] != '\\' || q + 1 >= body.size()) {
          s += body[q];
          continue;
        }
        char e = body[++q];
        switch (e) {
          case 'n':
            s += '\n';
            break;
          case 't':
            s += '\t';
            break;
          case 'r':
            s += '\r';
            break;
          case '\\':
          case '\'':
          case '"':
            s += e;
            break;
          default: // Python keeps unknown escapes as written
            s += '\\';
            s += e;
        }
      }
      if (q >= body.size())
        throw UserError(where + ": a string literal is never closed.");
      out.push_back({Tok::Kind::Str, s});
      p = q + 1;
    } else {
      static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
      std::string op(1, c);
      for (const char* t : two)
        if (body.compare(p, 2, t) == 0)
          op = t;
      if (op.size() == 1 && !std::strchr("+-*/%~<>=()[]{},.:|", c))
        throw UserError(
            where + ": unexpected character '" + op + "' in an expression.");
      out.push_back({Tok::Kind::Op, op});
      p += op.size();
    }
  }
  // The parser and the renderer recurse once per level of an expression,
  // and an expression nests at most as deep as it has tokens; chat
  // templates' longest tags have under 50.
  constexpr size_t kMaxTagTokens = 1000;
  if (out.size() > kMaxTagTokens)
    throw UserError(
        where + ": a tag of more than " + std::to_string(kMaxTagTokens) +
        " tokens; split the expression with {% set %}.");
  out.push_back({Tok::Kind::End, ""});
  return out;
}

// ---- expressions ------------------------------------------------------------

class Parser {
 public:
  Parser(const std::string& body, std::string where, int line)
      : toks_(lex(body, where)), where_(std::move(where)), line_(line) {}

  bool at_end() const {
    return peek().kind == Tok::Kind::End;
  }
  const Tok& peek(size_t ahead = 0) const {
    size_t k = std::min(p_ + ahead, toks_.size() - 1);
    return toks_[k];
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Kind::Op && peek(ahead).s == op;
  }
  bool is_name(const char* n, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Kind::Name && peek(ahead).s == n;
  }
  bool accept_op(const char* op) {
    if (!is_op(op))
      return false;
    ++p_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n))
      return false;
    ++p_;
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op))
      fail(std::string("expected '") + op + "'");
  }
  std::string expect_name() {
    if (peek().kind != Tok::Kind::Name)
      fail("expected a name");
    return toks_[p_++].s;
  }
  void expect_end() {
    if (!at_end())
      fail("unexpected '" + peek().s + "'");
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::string near = at_end() ? "the end of the tag" : "'" + peek().s + "'";
    throw UserError(where_ + ": " + what + " near " + near + ".");
  }

  ExprPtr expression(bool with_condition = true) {
    ExprPtr e = or_expr();
    if (with_condition && accept_name("if")) {
      auto n = make(Expr::Kind::Conditional);
      n->a = or_expr();
      n->b = std::move(e);
      if (accept_name("else"))
        n->c = expression();
      return n;
    }
    return e;
  }

 private:
  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto n = make(Expr::Kind::Binary);
    n->name = std::move(op);
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (accept_name("or")) {
      auto n = make(Expr::Kind::Or);
      n->a = std::move(e);
      n->b = and_expr();
      e = std::move(n);
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (accept_name("and")) {
      auto n = make(Expr::Kind::And);
      n->a = std::move(e);
      n->b = not_expr();
      e = std::move(n);
    }
    return e;
  }
  ExprPtr not_expr() {
    if (accept_name("not")) {
      auto n = make(Expr::Kind::Not);
      n->a = not_expr();
      return n;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    for (;;) {
      static const char* const ops[] = {"==", "!=", "<", ">", "<=", ">="};
      std::string op;
      for (const char* o : ops)
        if (is_op(o))
          op = o;
      if (!op.empty()) {
        ++p_;
      } else if (accept_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = binary(op, std::move(e), math1());
    }
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      std::string op = toks_[p_++].s;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (accept_op("~"))
      e = binary("~", std::move(e), math2());
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = toks_[p_++].s;
      e = binary(op, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (accept_op("**"))
      e = binary("**", std::move(e), unary(true));
    return e;
  }
  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (accept_op("-")) {
      e = make(Expr::Kind::Negate);
      e->a = unary(false);
    } else if (accept_op("+")) {
      e = unary(false);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Tok t = peek();
    switch (t.kind) {
      case Tok::Kind::Name: {
        ++p_;
        auto e = make(Expr::Kind::Literal);
        if (t.s == "true" || t.s == "True")
          e->value = Value::boolean(true);
        else if (t.s == "false" || t.s == "False")
          e->value = Value::boolean(false);
        else if (t.s == "none" || t.s == "None")
          e->value = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = t.s;
        }
        return e;
      }
      case Tok::Kind::Str: {
        std::string s;
        while (peek().kind == Tok::Kind::Str) // adjacent literals join
          s += toks_[p_++].s;
        auto e = make(Expr::Kind::Literal);
        e->value = Value::string(s);
        return e;
      }
      case Tok::Kind::Int: {
        ++p_;
        auto e = make(Expr::Kind::Literal);
        e->value = Value::integer(t.i);
        return e;
      }
      case Tok::Kind::Float: {
        ++p_;
        auto e = make(Expr::Kind::Literal);
        e->value.kind = Value::Kind::Float;
        e->value.f = t.f;
        return e;
      }
      case Tok::Kind::Op:
        if (accept_op("(")) {
          ExprPtr first = expression();
          if (!is_op(",")) {
            expect_op(")");
            return first;
          }
          auto list = make(Expr::Kind::ListLit); // a tuple
          list->args.push_back(std::move(first));
          while (accept_op(",") && !is_op(")"))
            list->args.push_back(expression());
          expect_op(")");
          return list;
        }
        if (accept_op("[")) {
          auto list = make(Expr::Kind::ListLit);
          while (!accept_op("]")) {
            list->args.push_back(expression());
            if (!accept_op(",")) {
              expect_op("]");
              break;
            }
          }
          return list;
        }
        if (accept_op("{")) {
          auto dict = make(Expr::Kind::DictLit);
          while (!accept_op("}")) {
            dict->args.push_back(expression());
            expect_op(":");
            dict->args.push_back(expression());
            if (!accept_op(",")) {
              expect_op("}");
              break;
            }
          }
          return dict;
        }
        break;
      case Tok::Kind::End:
        break;
    }
    fail("expected a value");
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (accept_op(".")) {
        auto n = make(Expr::Kind::Attr);
        if (peek().kind == Tok::Kind::Int) { // tuple.0
          n->kind = Expr::Kind::Item;
          n->b = make(Expr::Kind::Literal);
          n->b->value = Value::integer(toks_[p_++].i);
        } else {
          n->name = expect_name();
        }
        n->a = std::move(e);
        e = std::move(n);
      } else if (accept_op("[")) {
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        auto n = make(Expr::Kind::Call);
        n->a = std::move(e);
        call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  ExprPtr subscript(ExprPtr e) {
    ExprPtr start, stop, step;
    if (!is_op(":"))
      start = expression();
    if (!accept_op(":")) {
      expect_op("]");
      auto n = make(Expr::Kind::Item);
      n->a = std::move(e);
      n->b = std::move(start);
      return n;
    }
    if (!is_op(":") && !is_op("]"))
      stop = expression();
    if (accept_op(":") && !is_op("]"))
      step = expression();
    expect_op("]");
    auto n = make(Expr::Kind::Slice);
    n->a = std::move(e);
    n->args.push_back(std::move(start));
    n->args.push_back(std::move(stop));
    n->args.push_back(std::move(step));
    return n;
  }
  void call_args(Expr& n) {
    expect_op("(");
    while (!accept_op(")")) {
      if (peek().kind == Tok::Kind::Name && is_op("=", 1)) {
        std::string key = toks_[p_].s;
        p_ += 2;
        n.kwargs.emplace_back(key, expression());
      } else {
        n.args.push_back(expression());
      }
      if (!accept_op(",")) {
        expect_op(")");
        break;
      }
    }
  }
  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (accept_op("|")) {
        auto n = make(Expr::Kind::Filter);
        n->name = expect_name();
        while (accept_op(".")) // dotted filter names
          n->name += "." + expect_name();
        if (is_op("("))
          call_args(*n);
        n->a = std::move(e);
        e = postfix(std::move(n));
      } else if (accept_name("is")) {
        auto n = make(Expr::Kind::Test);
        n->negated = accept_name("not");
        n->name = expect_name();
        if (is_op("(")) {
          call_args(*n);
        } else if (
            peek().kind == Tok::Kind::Str || peek().kind == Tok::Kind::Int ||
            peek().kind == Tok::Kind::Float ||
            (peek().kind == Tok::Kind::Name && !is_name("and") &&
             !is_name("or") && !is_name("else") && !is_name("if") &&
             !is_name("in") && !is_name("is") && !is_name("not"))) {
          n->args.push_back(postfix(primary())); // `is equalto "user"`
        }
        n->a = std::move(e);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  std::vector<Tok> toks_;
  size_t p_ = 0;
  std::string where_;
  int line_;
};

// ---- statements -------------------------------------------------------------

struct Open {
  Node* node;
  Body* body;
  std::string closer; // the end tag that closes it
};

std::vector<std::string> targets(Parser& ps) {
  std::vector<std::string> out{ps.expect_name()};
  while (ps.accept_op(","))
    out.push_back(ps.expect_name());
  return out;
}

} // namespace

Body parse_template(const std::string& source, const std::string& name) {
  Body root;
  std::vector<Open> open;
  auto current = [&]() -> Body& {
    return open.empty() ? root : *open.back().body;
  };
  auto add = [&](Node::Kind k, int line) -> Node& {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    current().push_back(std::move(n));
    return *current().back();
  };
  // Rendering recurses once per open block; chat templates nest a few.
  constexpr size_t kMaxBlockDepth = 100;
  for (auto& piece : split(source, name)) {
    const std::string where = name + ":" + std::to_string(piece.line);
    if (open.size() > kMaxBlockDepth)
      throw UserError(
          where + ": blocks nest more than " + std::to_string(kMaxBlockDepth) +
          " deep.");
    if (piece.kind == Piece::Kind::Text) {
      add(Node::Kind::Text, piece.line).text = piece.body;
      continue;
    }
    Parser ps(piece.body, where, piece.line);
    if (piece.kind == Piece::Kind::Expr) {
      ExprPtr e = ps.expression();
      ps.expect_end();
      add(Node::Kind::Emit, piece.line).expr = std::move(e);
      continue;
    }
    if (ps.at_end())
      ps.fail("an empty '{% %}' tag");
    const std::string word = ps.expect_name();
    auto close = [&](const std::string& closer) {
      if (open.empty() || open.back().closer != closer)
        throw UserError(
            where + ": '{% " + word + " %}' without a matching opening tag" +
            (open.empty()
                 ? ""
                 : " (the open block needs " + open.back().closer + ")") +
            ".");
      open.pop_back();
    };
    if (word == "if") {
      Node& n = add(Node::Kind::If, piece.line);
      n.branches.emplace_back(ps.expression(), Body{});
      open.push_back({&n, &n.branches.back().second, "endif"});
    } else if (
        word == "elif" ||
        (word == "else" && !open.empty() && open.back().closer == "endif")) {
      if (open.empty() || open.back().closer != "endif")
        throw UserError(where + ": '{% elif %}' outside an if block.");
      Node* n = open.back().node;
      if (!n->branches.empty() && !n->branches.back().first)
        throw UserError(where + ": '{% " + word + " %}' after '{% else %}'.");
      n->branches.emplace_back(
          word == "elif" ? ps.expression() : nullptr, Body{});
      open.back().body = &n->branches.back().second;
    } else if (word == "else") {
      if (open.empty() || open.back().closer != "endfor")
        throw UserError(where + ": '{% else %}' outside an if or for block.");
      open.back().body = &open.back().node->otherwise;
    } else if (
        word == "endif" || word == "endfor" || word == "endset" ||
        word == "endgeneration") {
      close(word);
    } else if (word == "for") {
      Node& n = add(Node::Kind::For, piece.line);
      n.targets = targets(ps);
      if (!ps.accept_name("in"))
        ps.fail("expected 'in'");
      n.expr = ps.expression(/*with_condition=*/false);
      if (ps.accept_name("if"))
        n.filter = ps.expression(false);
      if (ps.accept_name("recursive"))
        ps.fail("recursive loops are not supported");
      open.push_back({&n, &n.body, "endfor"});
    } else if (word == "set") {
      std::vector<std::string> names = targets(ps);
      if (names.size() == 1 && ps.accept_op(".")) {
        Node& n = add(Node::Kind::SetAttr, piece.line);
        n.targets = {names[0], ps.expect_name()};
        ps.expect_op("=");
        n.expr = ps.expression();
      } else if (ps.at_end() && names.size() == 1) {
        Node& n =
            add(Node::Kind::Set, piece.line); // {% set x %}...{% endset %}
        n.targets = names;
        open.push_back({&n, &n.body, "endset"});
        continue;
      } else {
        Node& n = add(Node::Kind::Set, piece.line);
        n.targets = names;
        ps.expect_op("=");
        n.expr = ps.expression();
      }
    } else if (word == "break" || word == "continue") {
      bool in_loop = false;
      for (const auto& o : open)
        in_loop |= o.closer == "endfor";
      if (!in_loop)
        throw UserError(where + ": '{% " + word + " %}' outside a for loop.");
      add(word == "break" ? Node::Kind::Break : Node::Kind::Continue,
          piece.line);
    } else if (word == "generation") {
      Node& n = add(Node::Kind::Block, piece.line);
      open.push_back({&n, &n.body, "endgeneration"});
    } else {
      throw UserError(
          where + ": '{% " + word + " %}' is not supported" + kSubset);
    }
    ps.expect_end();
  }
  if (!open.empty())
    throw UserError(
        name + ":" + std::to_string(open.back().node->line) +
        ": this block is never closed (expected '{% " + open.back().closer +
        " %}').");
  return root;
}

} // namespace orchard::text::jinja
