// Versions Orchard reports (`orchard --version`, doctor, run reports).
#pragma once

#include <string>

namespace orchard {

std::string orchard_version();  // "0.1.0 (git 1a2b3c4)"
std::string compiler_version(); // "GCC 12.2.0"
std::string build_type();       // "Release"

// How printed hints spell the command: "orchard" when it was found on PATH,
// else the path it was run by ("./build/orchard"), so a hint can be pasted
// as it is. Set once by main.
const std::string& program_name();
void set_program_name(const char* argv0);

} // namespace orchard
