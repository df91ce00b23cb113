// Versions Orchard reports (`orchard --version`, doctor, run reports).
#pragma once

#include <string>

namespace orchard {

std::string orchard_version();  // "0.1.0 (git 1a2b3c4)"
std::string compiler_version(); // "GCC 12.2.0"
std::string build_type();       // "Release"

} // namespace orchard
