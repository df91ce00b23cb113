// A conversation and what rendering it gives: the types chat templates
// (text/chat_template.h, built-in families) and a model's own Jinja
// template (text/model_template.h) share, so neither includes the other.
#pragma once

#include "text/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::text {

struct Message {
  std::string role; // system, user or assistant
  std::string content;
};

struct Rendered {
  std::vector<TokenId> ids;
  std::vector<uint8_t> mask; // same length as ids
};

} // namespace orchard::text
