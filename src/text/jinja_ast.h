// The parsed form of a Jinja template (internal to text/jinja*.cpp).
//
// parse_template() turns the source into a tree of Nodes, applying the
// whitespace rules as it goes, so evaluation (jinja.cpp) never looks at the
// source text again.
#pragma once

#include "text/jinja.h"

#include <memory>
#include <string>
#include <vector>

namespace orchard::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal, // value
    Name,    // name
    Attr,    // a.name
    Item,    // a[b]
    Slice,   // a[b:c:d]; missing parts are null
    Call,    // a(args, kwargs)
    Filter,  // a | name(args, kwargs)
    Test,    // a is [not] name(args)
    Not,
    Negate,
    Binary, // a op b: + - * / // % ** ~ == != < > <= >= in, "not in"
    And,
    Or,
    Conditional, // b if a else c
    ListLit,     // args
    DictLit,     // kwargs as key/value expression pairs in args (k0, v0, ...)
  };
  Kind kind = Kind::Literal;
  int line = 0;
  Value value;
  std::string name;     // Name, Attr, Filter, Test, Binary's operator
  bool negated = false; // Test
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    Text,    // text
    Emit,    // {{ expr }}
    If,      // branches: (condition, body); a null condition is `else`
    For,     // targets in expr [if filter]: body [else: otherwise]
    Set,     // targets = expr, or {% set name %}body{% endset %}
    SetAttr, // {% set target.attr = expr %}
    Break,
    Continue,
    Block, // {% generation %}body{% endgeneration %}
  };
  Kind kind = Kind::Text;
  int line = 0;
  std::string text;
  ExprPtr expr, filter;
  std::vector<std::string> targets; // For, Set; SetAttr: {object, attribute}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, otherwise;
};

// UserError "<name>:<line>: ..." for syntax outside the subset.
Body parse_template(const std::string& source, const std::string& name);

} // namespace orchard::text::jinja
