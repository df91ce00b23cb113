#include "core/version.h"

#ifndef ORCHARD_VERSION
#define ORCHARD_VERSION "0.0.0"
#endif
#if __has_include("git_commit.h")
#include "git_commit.h" // generated at every build (cmake/git_commit.cmake)
#endif
#ifndef ORCHARD_GIT_COMMIT
#define ORCHARD_GIT_COMMIT "unknown"
#endif
#ifndef ORCHARD_BUILD_TYPE
#define ORCHARD_BUILD_TYPE "unknown"
#endif

namespace orchard {

std::string orchard_version() {
  return std::string(ORCHARD_VERSION) + " (git " + ORCHARD_GIT_COMMIT + ")";
}

std::string compiler_version() {
#if defined(__clang__)
  return std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#else
  return "unknown compiler";
#endif
}

std::string build_type() {
  return ORCHARD_BUILD_TYPE;
}

namespace {
std::string& program_name_storage() {
  static std::string name = "orchard";
  return name;
}
} // namespace

const std::string& program_name() {
  return program_name_storage();
}

void set_program_name(const char* argv0) {
  const std::string s = argv0 ? argv0 : "";
  // A name without a slash was found on PATH.
  program_name_storage() = s.find('/') == std::string::npos ? "orchard" : s;
}

} // namespace orchard
