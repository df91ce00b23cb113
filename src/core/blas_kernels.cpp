#include "core/blas_kernels.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#include <unistd.h>
#endif

namespace orchard {
namespace {

constexpr const char* kFromVariable = "ORCHARD_BLAS_CORE_FROM";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) {
    return char(std::tolower(c));
  });
  return s;
}

bool unset(const char* name) {
  const char* v = std::getenv(name);
  return !v || !*v;
}

} // namespace

std::string better_blas_core(
    const std::string& picked,
    bool avx512,
    bool avx2_fma) {
  if (lower(picked) != "prescott")
    return "";
  return avx512 ? "SkylakeX" : avx2_fma ? "Haswell" : "";
}

std::string blas_core() {
#if defined(__linux__) || defined(__APPLE__)
  using CoreName = char* (*)();
  auto name = reinterpret_cast<CoreName>(
      dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (name && name())
    return name();
#endif
  return "";
}

std::string blas_core_switch_note() {
  if (unset(kFromVariable) || unset("OPENBLAS_CORETYPE"))
    return "";
  return std::string("OpenBLAS picked ") + std::getenv(kFromVariable) +
      "'s generic kernels for this CPU (a model newer than this OpenBLAS); "
      "Orchard asked for " +
      std::getenv("OPENBLAS_CORETYPE") +
      "'s with OPENBLAS_CORETYPE (set that variable yourself to choose).";
}

void use_fast_blas_kernels(char** argv) {
#if defined(__linux__) && defined(__x86_64__)
  if (!argv || !argv[0] || !unset("OPENBLAS_CORETYPE"))
    return;
  const std::string picked = blas_core();
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd");
  const bool avx2_fma =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string better = better_blas_core(picked, avx512, avx2_fma);
  if (better.empty())
    return;
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::setenv(kFromVariable, picked.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // Not started again: go on as it was.
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kFromVariable);
#else
  (void)argv;
#endif
}

} // namespace orchard
