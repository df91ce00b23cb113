// Small string helpers shared by the readers of configs and data.
#pragma once

#include <cctype>
#include <string>

namespace orchard {

// `s` without leading and trailing whitespace (std::isspace).
inline std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a])))
    ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1])))
    --b;
  return s.substr(a, b - a);
}

// ASCII letters in lower case.
inline std::string lower(std::string s) {
  for (auto& c : s)
    c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

} // namespace orchard
