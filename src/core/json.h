// A nesting limit for JSON from files people edit or download.
//
// nlohmann::json parses any depth without recursion, but copying a value
// (json::value(), push_back of a subtree, a ternary with a temporary)
// recurses once per level, so a 100,000-deep document overflows the stack.
// No file Orchard reads nests more than a few levels; readers refuse deeper
// ones before parsing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace orchard {

// Far above any tokenizer.json, safetensors header, adapter or chat record
// (they nest 3 to 6 levels), far below a stack overflow.
constexpr size_t kMaxJsonDepth = 256;

// The deepest nesting of [ and { in JSON text, outside strings.
inline size_t json_nesting(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

} // namespace orchard
