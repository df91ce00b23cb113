#!/usr/bin/env bash
# Orchard's set-up and build in one script. Every step is idempotent: a
# second run skips what is already done.
#
#   ./orchard.sh setup        install the system packages (apt or Homebrew)
#   ./orchard.sh build        configure and build (Release) into build/
#   ./orchard.sh test         setup + build + the fuzz tests under the
#                             sanitizers (1 s per reader) + every test (ctest)
#   ./orchard.sh quickstart   setup + build + doctor + the quick pipeline on
#                             WordNet: base, mid and sft training, a report
#                             and chat samples (key=value arguments go to
#                             `orchard pipeline`)
#   ./orchard.sh fuzz         build the readers, the server and their fuzz
#                             tests under AddressSanitizer + UBSan
#                             (build-sanitize/) and run them
#                             (ORCHARD_FUZZ_SECONDS per reader, default 4)
#
# Environment: ORCHARD_BUILD_DIR (default build), ORCHARD_TORCH_PREFIX (a
# libtorch to build against; default: PyTorch's when `python3 -c 'import
# torch'` works, else the system's), ORCHARD_NO_SETUP=1 (skip installing,
# for machines without a package registry).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${ORCHARD_BUILD_DIR:-$ROOT/build}"

say() { printf '==> %s\n' "$*"; }
die() { printf 'orchard.sh: %s\n' "$*" >&2; exit 1; }

jobs() {
  if command -v nproc >/dev/null; then nproc; else sysctl -n hw.ncpu; fi
}

# PyTorch's libtorch, when a python3 with torch is present (CUDA machines,
# macOS with pip torch). Prints nothing otherwise.
python_torch_prefix() {
  command -v python3 >/dev/null || return 0
  local p
  p=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || return 0
  # Only a torch that ships its CMake package (pip wheels do; Debian's
  # python3-torch does not) can be built against.
  [ -f "$p/Torch/TorchConfig.cmake" ] && echo "$p"
  return 0
}

# --- setup ---------------------------------------------------------------------

DEBIAN_PACKAGES=(
  g++ cmake ninja-build pkg-config git
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libpcre2-dev
  libgtest-dev libbenchmark-dev wordnet-base libedit-dev wamerican
)
# For the tests only: the web chat page's end-to-end test drives a headless
# Chromium.
DEBIAN_TEST_PACKAGES=(chromium)
# Debian's libtorch is CPU-only and uses the system BLAS: the OpenMP build of
# OpenBLAS is required (with the reference BLAS training is ~20x slower).
# libgloo-dev: the headers and library of Gloo, c10d's CPU backend
# (multi-process training on the CPU, src/dist).
DEBIAN_TORCH_PACKAGES=(libtorch-dev libopenblas0-openmp libgloo-dev)

BREW_PACKAGES=(cmake ninja pytorch yaml-cpp nlohmann-json cli11 cpp-httplib pcre2 googletest google-benchmark wordnet)

setup_debian() {
  local wanted=("${DEBIAN_PACKAGES[@]}")
  [ "${ORCHARD_SETUP_FOR_TESTS:-}" = "1" ] && wanted+=("${DEBIAN_TEST_PACKAGES[@]}")
  if [ -z "${ORCHARD_TORCH_PREFIX:-}$(python_torch_prefix)" ]; then
    wanted+=("${DEBIAN_TORCH_PACKAGES[@]}")
    # The tests start Orchard under Debian's torchrun (python3-torch, the
    # same 1.13 as libtorch-dev): the launch contract users rely on.
    [ "${ORCHARD_SETUP_FOR_TESTS:-}" = "1" ] && wanted+=(python3-torch)
  fi
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ ${#missing[@]} -gt 0 ]; then
    # apt and dpkg print hundreds of lines; they go to a log, shown in full
    # only when something fails.
    local log="${TMPDIR:-/tmp}/orchard-setup.log"
    say "Installing ${#missing[@]} package(s): ${missing[*]} (a few minutes; log: $log)"
    if ! { $sudo apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
             --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      die "installing packages failed (the whole log: $log)"
    fi
  else
    say "System packages: all installed"
  fi
  # Make the OpenMP OpenBLAS the BLAS and LAPACK libtorch loads.
  local arch; arch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu")"
  for lib in libblas.so.3 liblapack.so.3; do
    local target="/usr/lib/$arch/openblas-openmp/$lib"
    local name="$lib-$arch"
    [ -e "$target" ] || continue
    if [ "$(update-alternatives --query "$name" 2>/dev/null | sed -n 's/^Value: //p')" != "$target" ]; then
      say "Selecting OpenBLAS (OpenMP) for $lib"
      $sudo update-alternatives --set "$name" "$target"
    fi
  done
}

setup_macos() {
  command -v brew >/dev/null || die "Homebrew is needed: see https://brew.sh, then run ./orchard.sh setup again."
  if [ "$(sysctl -n sysctl.proc_translated 2>/dev/null || echo 0)" = "1" ]; then
    echo "Warning: this shell runs under Rosetta 2 (x86_64). Use the arm64 Homebrew in /opt/homebrew and an arm64 shell (arch -arm64 zsh); otherwise MPS is unavailable." >&2
  fi
  local missing=()
  for p in "${BREW_PACKAGES[@]}"; do
    brew list --versions "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "Installing ${missing[*]}"
    brew install "${missing[@]}"
  else
    say "Homebrew packages: all installed"
  fi
}

cmd_setup() {
  if [ "${ORCHARD_NO_SETUP:-}" = "1" ]; then
    say "Setup skipped (ORCHARD_NO_SETUP=1)"
    return
  fi
  case "$(uname -s)" in
    Linux)
      command -v apt-get >/dev/null || die "only Debian/Ubuntu (apt) are supported for automatic set-up; install the packages in ARCHITECTURE.md's table by hand and run ./orchard.sh build."
      setup_debian ;;
    Darwin) setup_macos ;;
    *) die "unsupported system $(uname -s)" ;;
  esac
}

# --- build ---------------------------------------------------------------------

# The targets to build: all by default; only the `orchard` binary for the
# quickstart, which runs no test or benchmark.
cmd_build() {
  local targets=("$@")
  local prefix="${ORCHARD_TORCH_PREFIX:-$(python_torch_prefix)}"
  if [ "$(uname -s)" = "Darwin" ] && [ -z "$prefix" ] && command -v brew >/dev/null; then
    prefix="$(brew --prefix pytorch 2>/dev/null || true)"
  fi
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    say "Configuring ($BUILD_DIR${prefix:+, libtorch from $prefix})"
    cmake -S "$ROOT" -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"}
  fi
  if [ ${#targets[@]} -gt 0 ]; then
    say "Building ${targets[*]} (the first build takes about 8 minutes on 2 cores)"
    cmake --build "$BUILD_DIR" -j "$(jobs)" --target "${targets[@]}"
  else
    say "Building"
    cmake --build "$BUILD_DIR" -j "$(jobs)"
  fi
}

# llama.cpp for the GGUF export tests (tests/gguf): node-llama-cpp's
# prebuilt CPU binary for this platform and an independent GGUF reader, from
# the npm registry, into the build folder (about 90 MB, 15 s). Without
# Node.js or the registry those tests skip and say why; nothing else
# depends on it.
setup_llama_judge() {
  local dir="$BUILD_DIR/llama-judge"
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    say "Node.js/npm not found: the llama.cpp judge of the GGUF tests is not installed (they will skip)"
    return 0
  fi
  local platform
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) platform=linux-x64 ;;
    Linux-aarch64) platform=linux-arm64 ;;
    Darwin-arm64) platform=mac-arm64-metal ;;
    Darwin-x86_64) platform=mac-x64 ;;
    *)
      say "node-llama-cpp has no prebuilt llama.cpp for $(uname -sm): the GGUF tests will skip"
      return 0 ;;
  esac
  local want
  want=$(sed "s|@node-llama-cpp/PLATFORM|@node-llama-cpp/$platform|" "$ROOT/tests/gguf/package.json")
  if [ -f "$dir/node_modules/node-llama-cpp/package.json" ] &&
     [ "$want" = "$(cat "$dir/package.json" 2>/dev/null)" ]; then
    return 0
  fi
  say "Installing llama.cpp for the GGUF tests (npm: node-llama-cpp, prebuilt $platform CPU build; about 90 MB)"
  mkdir -p "$dir"
  printf '%s\n' "$want" >"$dir/package.json"
  local log="${TMPDIR:-/tmp}/orchard-llama-judge.log"
  # --omit=optional: node-llama-cpp's optional dependencies are every
  # platform's builds, CUDA and Vulkan ones among them (gigabytes); the one
  # needed is named above. SKIP_DOWNLOAD: it must not fetch or compile
  # llama.cpp itself.
  if ! (cd "$dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional \
          --no-audit --no-fund >"$log" 2>&1); then
    tail -n 20 "$log" >&2
    say "Installing the llama.cpp judge failed (log: $log); the GGUF tests will skip"
    rm -f "$dir/package.json"
  fi
}

# Every test: first the fuzz campaigns under the sanitizers for a second
# each (the subset of `./orchard.sh fuzz` that CI runs; ORCHARD_NO_SANITIZE=1
# leaves it out while iterating), then every test in ctest. The benchmarks
# are not built.
cmd_test() {
  ORCHARD_SETUP_FOR_TESTS=1 cmd_setup
  cmd_build orchard_tests
  [ "${ORCHARD_NO_SETUP:-}" = "1" ] || setup_llama_judge
  if [ "${ORCHARD_NO_SANITIZE:-}" != "1" ]; then
    ORCHARD_FUZZ_SECONDS="${ORCHARD_FUZZ_SECONDS:-1}" cmd_fuzz
  fi
  # A fresh build folder has no timings, so ctest would start each long
  # test whenever its turn came and could end on one alone; the slowest
  # tests' seconds on 2 cores (tests/ctest_costs.txt) start them first.
  # ctest keeps its own measurements after that.
  local costs="$BUILD_DIR/Testing/Temporary/CTestCostData.txt"
  if [ ! -f "$costs" ]; then
    mkdir -p "$(dirname "$costs")"
    cp "$ROOT/tests/ctest_costs.txt" "$costs"
  fi
  say "Testing"
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "$(jobs)")
}

# The fuzz tests under AddressSanitizer and UndefinedBehaviorSanitizer: a
# separate build of only the readers, the server and tests/fuzz (see
# cmake/sanitize.cmake; about 5 minutes on 2 cores). A sanitizer report
# stops the run and names the input.
cmd_fuzz() {
  local prefix="${ORCHARD_TORCH_PREFIX:-$(python_torch_prefix)}"
  local dir="${ORCHARD_SANITIZE_BUILD_DIR:-$ROOT/build-sanitize}"
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    say "Configuring the sanitizer build ($dir)"
    cmake -S "$ROOT" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DORCHARD_SANITIZE=ON ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} >/dev/null
  fi
  say "Building the readers, the server and the fuzz tests with -fsanitize=address,undefined"
  cmake --build "$dir" -j "$(jobs)" --target orchard_fuzz_tests
  say "Fuzzing under the sanitizers (${ORCHARD_FUZZ_SECONDS:-4} s per reader)"
  (cd "$dir" && \
    ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
    ./orchard_fuzz_tests --gtest_brief=1)
}

cmd_quickstart() {
  cmd_setup
  cmd_build orchard
  say "Checking this machine (orchard doctor)"
  "$BUILD_DIR/orchard" doctor
  # The main job: WordNet corpus -> tokenizer -> shards -> base -> mid -> sft
  # -> report (`orchard pipeline` with the quick preset), then chat
  # exchanges about held-out words. Run again to resume or to see it done.
  say "From text to a chat model on WordNet (orchard pipeline --preset quick)"
  cat <<EXPECT
    What to expect: a model of about 7 million parameters trained for some
    minutes on WordNet's glosses. Its answers about words take the right form
    ("A word meaning ...") but are often wrong or garbled: it shows every
    stage works on this machine, not what a large model can do. For a better
    one, train longer: $BUILD_DIR/orchard pipeline --preset overnight
EXPECT
  "$BUILD_DIR/orchard" pipeline --preset quick "$@"
}

case "${1:-}" in
  setup) cmd_setup ;;
  build) cmd_build ;;
  test) cmd_test ;;
  quickstart) shift; cmd_quickstart "$@" ;;
  fuzz) cmd_fuzz ;;
  *)
    [ -z "${1:-}" ] || echo "unknown command: $1" >&2
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2 ;;
esac
