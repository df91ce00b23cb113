#include "core/config.h"

#include "core/error.h"
#include "core/files.h"
#include "core/strings.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

namespace orchard::config {
namespace {

// Integers this large no longer survive a trip through double (2^53).
constexpr double kMaxExactDouble = 9007199254740992.0;

std::string unquote(const std::string& s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') &&
      s.back() == s.front())
    return s.substr(1, s.size() - 2);
  return s;
}

// The error every bad value gets: key, source, value, what was expected.
[[noreturn]] void bad_value(
    const Option& o,
    const std::string& origin,
    const std::string& value,
    const std::string& expected) {
  throw UserError(
      "config key '" + o.key + "' (" + origin + "): invalid value '" + value +
      "', expected " + expected + ".\n  Help: " + o.key + " — " + o.help);
}

void check_bounds(
    const Option& o,
    const std::string& origin,
    const std::string& text,
    double v) {
  std::ostringstream bound;
  if (o.min && v < *o.min) {
    bound << "a number >= " << *o.min;
    bad_value(o, origin, text, bound.str());
  }
  if (o.max && v > *o.max) {
    bound << "a number <= " << *o.max;
    bad_value(o, origin, text, bound.str());
  }
}

int64_t parse_int(
    const Option& o,
    const std::string& origin,
    const std::string& text) {
  std::string s = trim(text);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && *end == '\0' && errno == 0) {
    check_bounds(o, origin, s, static_cast<double>(v));
    return v;
  }
  // Scientific notation is fine when it names a whole number: 2e9, 1.5e3.
  double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == '\0' && std::isfinite(d) && d == std::floor(d) &&
      std::fabs(d) <= kMaxExactDouble) {
    check_bounds(o, origin, s, d);
    return static_cast<int64_t>(d);
  }
  bad_value(o, origin, s, "an integer (e.g. 512)");
}

double parse_float(
    const Option& o,
    const std::string& origin,
    const std::string& text) {
  std::string s = trim(text);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v))
    bad_value(o, origin, s, "a number (e.g. 0.02 or 3e-4)");
  check_bounds(o, origin, s, v);
  return v;
}

bool parse_bool(
    const Option& o,
    const std::string& origin,
    const std::string& text) {
  std::string s = lower(trim(text));
  if (s == "true" || s == "1" || s == "yes" || s == "on")
    return true;
  if (s == "false" || s == "0" || s == "no" || s == "off")
    return false;
  bad_value(o, origin, trim(text), "a boolean (true/false, True/False, 1/0)");
}

std::string parse_string(
    const Option& o,
    const std::string& origin,
    const std::string& text) {
  std::string s = unquote(trim(text));
  if (!o.choices.empty() &&
      std::find(o.choices.begin(), o.choices.end(), s) == o.choices.end()) {
    std::string list;
    for (const auto& c : o.choices)
      list += (list.empty() ? "" : "|") + c;
    bad_value(o, origin, s, "one of " + list);
  }
  return s;
}

// "[a, b]", "a,b", "[]" or a single "a".
std::vector<std::string> parse_list(const std::string& text) {
  std::string s = trim(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']')
    s = s.substr(1, s.size() - 2);
  std::vector<std::string> items;
  if (trim(s).empty())
    return items;
  std::string item;
  char quote = 0;
  for (char c : s) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        item += c;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == ',') {
      items.push_back(trim(item));
      item.clear();
    } else {
      item += c;
    }
  }
  items.push_back(trim(item));
  return items;
}

void assign(
    const Option& o,
    void* cfg,
    const std::string& text,
    const std::string& origin) {
  FieldRef ref = o.access(cfg);
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          *p = parse_int(o, origin, text);
        } else if constexpr (std::is_same_v<T, double>) {
          *p = parse_float(o, origin, text);
        } else if constexpr (std::is_same_v<T, bool>) {
          *p = parse_bool(o, origin, text);
        } else if constexpr (std::is_same_v<T, std::string>) {
          *p = parse_string(o, origin, text);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          *p = parse_list(text);
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          if (lower(trim(text)) == "auto")
            *p = std::nullopt;
          else
            *p = parse_int(o, origin, text);
        } else {
          if (lower(trim(text)) == "auto")
            *p = std::nullopt;
          else
            *p = parse_float(o, origin, text);
        }
      },
      ref);
}

[[noreturn]] void unknown_key(
    const Schema& schema,
    const std::string& key,
    const std::string& origin) {
  std::string msg = "unknown key '" + key + "' (" + origin + ")";
  std::string near = schema.nearest(key);
  if (!near.empty())
    msg += "; did you mean '" + near + "'?";
  msg += schema.what() == "fine-tuning"
      ? "\n  `orchard config stage=lora` prints every fine-tuning key."
      : "\n  `orchard config --help` lists every " + schema.what() + " option.";
  throw UserError(msg);
}

std::string type_name(const FieldRef& ref) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>)
          return "int";
        else if constexpr (std::is_same_v<T, double>)
          return "float";
        else if constexpr (std::is_same_v<T, bool>)
          return "bool";
        else if constexpr (std::is_same_v<T, std::string>)
          return "string";
        else if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return "list";
        else if constexpr (std::is_same_v<T, std::optional<int64_t>>)
          return "int|auto";
        else
          return "float|auto";
      },
      ref);
}

// Walks a YAML document, turning nested maps into dotted keys, and applies
// each leaf. `where` is the file's name for messages.
void apply_yaml_node(
    const Schema& schema,
    void* cfg,
    const YAML::Node& node,
    const std::string& prefix,
    const std::function<std::string(int)>& origin_at,
    Origins& origins) {
  for (const auto& kv : node) {
    std::string name = kv.first.as<std::string>();
    std::string key = prefix.empty() ? name : prefix + "." + name;
    std::string origin = origin_at(kv.first.Mark().line + 1);
    const YAML::Node& value = kv.second;
    const Option* o = schema.find(key);
    if (value.IsMap()) {
      if (o)
        throw UserError(
            "config key '" + key + "' (" + origin +
            "): expected a value, found a nested map.");
      apply_yaml_node(schema, cfg, value, key, origin_at, origins);
      continue;
    }
    if (!o)
      unknown_key(schema, key, origin);
    std::string text;
    if (value.IsSequence()) {
      if (!std::holds_alternative<std::vector<std::string>*>(o->access(cfg)))
        bad_value(*o, origin, "[...]", "a single " + type_name(o->access(cfg)));
      std::vector<std::string> items;
      for (const auto& item : value) {
        if (!item.IsScalar())
          bad_value(*o, origin, "[...]", "a list of plain values");
        items.push_back(item.as<std::string>());
      }
      *std::get<std::vector<std::string>*>(o->access(cfg)) = items;
    } else if (value.IsNull()) {
      bad_value(*o, origin, "", "a value (the key has none)");
    } else {
      assign(*o, cfg, value.as<std::string>(), origin);
    }
    origins[o->key] = origin;
  }
}

// `where` names the file in messages; `label` wraps "file:line" for origins
// (a preset says which preset).
void apply_yaml_text(
    const Schema& schema,
    void* cfg,
    const std::string& text,
    const std::string& where,
    const std::string& label,
    Origins& origins) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UserError(
        "config file " + where + ":" + std::to_string(e.mark.line + 1) + ":" +
        std::to_string(e.mark.column + 1) + ": not valid YAML: " + e.msg);
  }
  if (root.IsNull())
    return; // an empty file sets nothing
  if (!root.IsMap())
    throw UserError(
        "config file " + where +
        ": expected a map of keys to values (key: value per line).");
  auto origin_at = [&](int line) {
    std::string at = where + ":" + std::to_string(line);
    return label.empty() ? at : label + " (" + at + ")";
  };
  try {
    apply_yaml_node(schema, cfg, root, "", origin_at, origins);
  } catch (const YAML::Exception& e) { // a key that is a list or a map, ...
    throw UserError(
        "config file " + where + ":" + std::to_string(e.mark.line + 1) +
        ": expected plain `key: value` entries: " + e.msg);
  }
}

bool plain_yaml_scalar(const std::string& s) {
  if (s.empty())
    return false;
  static const char* reserved[] = {
      "true", "false", "yes", "no", "on", "off", "null", "~"};
  std::string l = lower(s);
  for (const char* r : reserved)
    if (l == r)
      return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
          c == '.' || c == '/'))
      return false;
  // A string that reads as a number must stay a string.
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return *end != '\0';
}

std::string yaml_string(const std::string& s) {
  if (plain_yaml_scalar(s))
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      // Escaped: a raw newline in a quoted YAML scalar reads back as a
      // space, and other control characters are not allowed.
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

} // namespace

Schema& Schema::add(Option option) {
  if (find(option.key))
    throw std::logic_error("duplicate config key " + option.key);
  options_.push_back(std::move(option));
  return *this;
}

const Option* Schema::find(const std::string& key) const {
  for (const auto& o : options_) {
    if (o.key == key)
      return &o;
    for (const auto& a : o.aliases)
      if (a == key)
        return &o;
  }
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min(
          {prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string Schema::nearest(const std::string& key) const {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  auto consider = [&](const std::string& candidate) {
    size_t d = edit_distance(lower(key), lower(candidate));
    // The last segment alone also counts: "hidden_size" -> "arch.hidden_size".
    auto dot = candidate.rfind('.');
    if (dot != std::string::npos && key.find('.') == std::string::npos)
      d = std::min(
          d, edit_distance(lower(key), lower(candidate.substr(dot + 1))));
    if (d < best_d) {
      best_d = d;
      best = candidate;
    }
  };
  for (const auto& o : options_) {
    consider(o.key);
    for (const auto& a : o.aliases)
      consider(a);
  }
  // Close means a typo, not a different word: at most a third of the key.
  size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_d <= limit ? best : "";
}

void set_value(
    const Schema& schema,
    void* cfg,
    const std::string& key,
    const std::string& value,
    const std::string& origin) {
  const Option* o = schema.find(key);
  if (!o)
    unknown_key(schema, key, origin);
  assign(*o, cfg, value, origin);
}

Origins resolve(const Schema& schema, void* cfg, const Sources& sources) {
  Origins origins;
  if (!sources.preset.empty()) {
    auto text = preset_text(sources.preset);
    if (!text) {
      std::string names;
      for (const auto& n : preset_names())
        names += (names.empty() ? "" : ", ") + n;
      throw UserError(
          "unknown preset '" + sources.preset + "'; the presets are: " + names +
          ".");
    }
    apply_yaml_text(
        schema,
        cfg,
        *text,
        "configs/" + sources.preset + ".yaml",
        "preset " + sources.preset,
        origins);
  }
  if (!sources.config_file.empty()) {
    const std::string& path = sources.config_file;
    if (!std::filesystem::exists(path))
      throw UserError(
          "config file '" + path +
          "' not found (given with --config); check the path.");
    std::ifstream in(path);
    if (!in)
      throw UserError("config file '" + path + "' cannot be read.");
    std::stringstream ss;
    ss << in.rdbuf();
    apply_yaml_text(schema, cfg, ss.str(), path, "", origins);
  }
  for (const auto& o : schema.options()) {
    if (o.env.empty())
      continue;
    if (auto v = sources.env(o.env)) {
      std::string origin = "environment " + o.env;
      assign(o, cfg, *v, origin);
      origins[o.key] = origin;
    }
  }
  for (size_t i = 0; i < sources.overrides.size(); ++i) {
    const std::string& arg = sources.overrides[i];
    std::string origin = "command line '" + arg + "'";
    auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError(
          "'" + arg +
          "' is not a key=value override; write it as key=value, e.g. "
          "depth=8 or arch.n_embd=512.");
    std::string key = trim(arg.substr(0, eq));
    set_value(schema, cfg, key, arg.substr(eq + 1), origin);
    origins[schema.find(key)->key] = "command line";
  }
  return origins;
}

int source_precedence(const std::string& origin) {
  // The prefixes resolve() writes: "preset NAME (...)", "environment VAR",
  // "command line"; anything else is a --config file's "path:line".
  if (origin.empty() || origin == "default")
    return 0;
  if (origin.rfind("command line", 0) == 0)
    return 4;
  if (origin.rfind("environment ", 0) == 0)
    return 3;
  if (origin.rfind("preset ", 0) == 0)
    return 1;
  return 2;
}

namespace {
// Keeps floats recognisable as floats in YAML: 1 -> 1.0.
std::string float_text(double v) {
  std::ostringstream out;
  out << std::setprecision(10) << v;
  std::string s = out.str();
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}
} // namespace

std::string value_text(const Option& option, void* cfg) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(*p);
        } else if constexpr (std::is_same_v<T, double>) {
          return float_text(*p);
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return yaml_string(*p);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string s = "[";
          for (size_t i = 0; i < p->size(); ++i)
            s += (i ? ", " : "") + yaml_string((*p)[i]);
          return s + "]";
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          return p->has_value() ? std::to_string(**p) : "auto";
        } else {
          return p->has_value() ? float_text(**p) : "auto";
        }
      },
      option.access(cfg));
}

std::string to_yaml(const Schema& schema, void* cfg, const Origins& origins) {
  std::ostringstream out;
  std::vector<std::string> open; // the map path currently open
  for (const auto& o : schema.options()) {
    std::vector<std::string> parts;
    std::stringstream ks(o.key);
    for (std::string part; std::getline(ks, part, '.');)
      parts.push_back(part);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() &&
           open[common] == parts[common])
      ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      out << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    out << std::string(2 * (parts.size() - 1), ' ') << parts.back() << ": "
        << value_text(o, cfg);
    if (auto it = origins.find(o.key); it != origins.end())
      out << "  # " << it->second;
    out << "\n";
  }
  return out.str();
}

std::string help_table(const Schema& schema, void* defaults) {
  size_t width = 0;
  std::vector<std::string> heads;
  for (const auto& o : schema.options()) {
    heads.push_back(o.key + "=" + value_text(o, defaults));
    width = std::max(width, heads.back().size());
  }
  width = std::min<size_t>(width, 36);
  std::ostringstream out;
  out << schema.what() << " options (key=default; set them in --config FILE "
      << "or as trailing key=value):\n";
  for (size_t i = 0; i < heads.size(); ++i) {
    const Option& o = schema.options()[i];
    out << "  " << std::left << std::setw(static_cast<int>(width)) << heads[i]
        << "  " << o.help;
    if (!o.choices.empty()) {
      std::string list;
      for (const auto& c : o.choices)
        list += (list.empty() ? "" : "|") + c;
      out << " [" << list << "]";
    }
    if (!o.env.empty())
      out << " (env " << o.env << ")";
    if (!o.aliases.empty()) {
      out << " (also";
      for (const auto& a : o.aliases)
        out << " " << a;
      out << ")";
    }
    out << "\n";
  }
  return out.str();
}

void write_yaml(
    const std::string& path,
    const Schema& schema,
    void* cfg,
    const Origins& origins) {
  atomic_write(path, to_yaml(schema, cfg, origins));
}

} // namespace orchard::config
