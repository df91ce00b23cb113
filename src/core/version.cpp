#include "core/version.h"

#ifndef ORCHARD_VERSION
#define ORCHARD_VERSION "0.0.0"
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

} // namespace orchard
