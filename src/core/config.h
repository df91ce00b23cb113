// Typed configuration: one declaration per option, four sources.
//
// A config is a plain struct with defaults (see src/train/pretrain_config.h).
// A `Schema` declares each of its options once: the dotted key users type
// (`arch.n_embd`), aliases (`arch.hidden_size`, the Hugging Face name), the
// help text, an environment alias (`DEPTH`) and optional choices or bounds,
// bound to the struct field it sets. From that one table come parsing,
// validation, `--help`, `orchard config` and the config.yaml of a run.
//
// Sources, later wins:
//   1. a preset (configs/<name>.yaml, compiled into the binary)
//   2. --config FILE (YAML; nested maps or dotted keys)
//   3. environment aliases (DEPTH=8)
//   4. trailing key=value overrides (arch.n_embd=512 data_paths=[a,b])
// Every error names the key, the source (file:line, variable, argument), the
// value and what was expected, and suggests the nearest valid key.
#pragma once

#include "core/machine.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace orchard::config {

// Pointer to the field an option sets. std::optional<int64_t> (<double>) is
// an integer (a number) that may be `auto` (nullopt): resolved later from
// other settings.
using FieldRef = std::variant<
    int64_t*,
    double*,
    bool*,
    std::string*,
    std::vector<std::string>*,
    std::optional<int64_t>*,
    std::optional<double>*>;

using FieldAccess = std::function<FieldRef(void*)>;

template <class C, class T>
FieldAccess field(T C::*member) {
  return
      [member](void* c) -> FieldRef { return &(static_cast<C*>(c)->*member); };
}

template <class C, class S, class T>
FieldAccess field(S C::*outer, T S::*inner) {
  return [outer, inner](void* c) -> FieldRef {
    return &((static_cast<C*>(c)->*outer).*inner);
  };
}

struct Option {
  std::string key = {}; // dotted: "arch.n_embd"
  FieldAccess access = {};
  std::string help = {};                 // one line, with a typical value
  std::string env = {};                  // environment alias, "" for none
  std::vector<std::string> aliases = {}; // other accepted keys
  std::vector<std::string> choices = {}; // strings: allowed values
  std::optional<double> min = {};        // numbers: inclusive bounds
  std::optional<double> max = {};
};

// Where a value came from: "default", "preset quick (quick.yaml:4)",
// "run.yaml:7", "environment DEPTH", "command line".
using Origins = std::map<std::string, std::string>;

class Schema {
 public:
  explicit Schema(std::string what) : what_(std::move(what)) {}

  Schema& add(Option option);

  const std::vector<Option>& options() const {
    return options_;
  }
  // The option for a key or alias; nullptr if none.
  const Option* find(const std::string& key) const;
  // The declared key closest to `key` (edit distance over keys and aliases),
  // or "" when nothing is close.
  std::string nearest(const std::string& key) const;
  const std::string& what() const {
    return what_;
  }

 private:
  std::string what_;
  std::vector<Option> options_;
};

struct Sources {
  std::string preset;                 // name under configs/, "" for none
  std::string config_file;            // path, "" for none
  std::vector<std::string> overrides; // "key=value"
  EnvLookup env = process_env();
};

// Applies every source to `cfg` (whose fields start at their defaults).
// Throws UserError on any unknown key or bad value. Returns where each
// non-default value came from.
Origins resolve(const Schema& schema, void* cfg, const Sources& sources);

// How late a source comes in the order above, from an Origins value:
// 0 default, 1 preset, 2 --config file, 3 environment, 4 command line.
int source_precedence(const std::string& origin);

// Applies one textual value, as a trailing override would.
void set_value(
    const Schema& schema,
    void* cfg,
    const std::string& key,
    const std::string& value,
    const std::string& origin);

// YAML text of every option, nested by dotted prefix (`arch:` then its keys),
// with `# origin` comments on values that are not defaults.
std::string to_yaml(
    const Schema& schema,
    void* cfg,
    const Origins& origins = {});

// The value of one option as text ("512", "auto", "[a, b]", "true").
std::string value_text(const Option& option, void* cfg);

// The option table for `--help`: key, default, env alias, help.
std::string help_table(const Schema& schema, void* defaults);

// Writes to_yaml() into `path` atomically.
void write_yaml(
    const std::string& path,
    const Schema& schema,
    void* cfg,
    const Origins& origins);

// Presets compiled into the binary from configs/*.yaml.
std::vector<std::string> preset_names();
std::optional<std::string> preset_text(const std::string& name);

// Levenshtein distance, for suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

} // namespace orchard::config
