// Jinja values' Python behaviour, filters, tests, methods and globals
// (internal to text/jinja*.cpp). `where` ("name:line") starts every error.
#pragma once

#include "text/jinja.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace orchard::text::jinja {

// Limits that keep a template (a file anyone can edit) from hanging or
// exhausting a command or the server; no chat template comes near them.
// A render's work: each node run, loop turn, and item a list is built
// from counts one unit (about a microsecond at most).
constexpr uint64_t kMaxWork = 2'000'000;
// The largest string a template builds (its output included).
constexpr size_t kMaxTextBytes = size_t(1) << 26; // 64 MB
// How deep values nest when printed or compared (a namespace that holds
// itself would recurse forever).
constexpr int kMaxValueDepth = 200;

// UserError "<where>: <what>".
[[noreturn]] void fail(const std::string& where, const std::string& what);
// UserError when a string of `bytes` would pass kMaxTextBytes.
void check_size(size_t bytes);
// Python's str.isspace() for one ASCII character.
bool is_ws(char c);

// Starts a render's work count (per thread).
void reset_work();
// Counts `units` of work; UserError at `where` past kMaxWork.
void charge(uint64_t units, const std::string& where);
// a + b, a - b, a * b, -a on 64-bit integers; UserError at `where` on
// overflow (Python's integers have no limit; Orchard's templates do).
int64_t checked(char op, int64_t a, int64_t b, const std::string& where);

// Byte offsets of each code point's start, then the string's size.
std::vector<size_t> code_points(const std::string& s);
// Bytes [a, b) of `t`, its spans clipped to them.
Text sub(const Text& t, size_t a, size_t b);
// Python's strip/lstrip/rstrip: `chars` (none: whitespace) off either end.
Text strip(const Text& t, const Value* chars, bool left, bool right);
Value text_value(Text t);
// The keyword argument `name`, or nullptr.
const Value* kwarg(const Pairs& kwargs, const std::string& name);
// args[k], else the keyword `name`, else nullptr.
const Value* arg(
    const List& args,
    size_t k,
    const Pairs& kwargs,
    const std::string& name);
// x.a.b as selectattr/map/join read it: mapping items by dotted path.
Value attribute(const Value& obj, const std::string& path);
// Appends `t`, moving its spans along.
void append(Text& out, const Text& t);
// Python's str(): None -> "None", True -> "True", undefined -> "".
Text str_of(const Value& v);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// "a string", "a list", "undefined 'x'": for error messages.
std::string describe(const Value& v);
bool contains(
    const Value& haystack,
    const Value& needle,
    const std::string& where);
// A list's items, a mapping's keys, a string's characters; [] when
// undefined.
List iterate(const Value& v, const std::string& where);
Value item(const Value& obj, const Value& key, const std::string& where);
Value slice(
    const Value& obj,
    std::optional<int64_t> start,
    std::optional<int64_t> stop,
    std::optional<int64_t> step,
    const std::string& where);
int64_t as_int(const Value& v, const std::string& where);
const Value* find_item(const Pairs& d, const std::string& key);
void set_item(Pairs& d, const std::string& key, Value v);
// Python methods templates call: str.strip/split/startswith/..., dict.items
// /keys/values/get.
bool is_method(const Value& obj, const std::string& name);
Value call_method(
    const Value& obj,
    const std::string& name,
    List& args,
    Pairs& kwargs,
    const std::string& where);
// raise_exception, namespace, range, dict.
std::map<std::string, Value> globals(const std::string& template_name);
// transformers' tojson: json.dumps(ensure_ascii=False, indent=indent).
std::string to_json(const Value& v, int indent);

struct Builtins {
  std::string where;
  // args[0] is the filtered value.
  Value filter(const std::string& name, List& args, Pairs& kwargs) const;
  bool test(const std::string& name, const Value& v, const List& args) const;
};

} // namespace orchard::text::jinja
