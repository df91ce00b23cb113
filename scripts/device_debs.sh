# Sourced by the CUDA machine's scripts (device_ci.sh, device_lora.sh).
# PCRE2, cpp-httplib (with the OpenSSL, zlib and Brotli headers its
# pkg-config file asks for) and libedit are missing on that machine: unpack
# the Debian packages ../shared/device/fetch-debs.sh put in .device-debs
# (carried): fetch-debs.sh libssl-dev zlib1g-dev libbrotli-dev libedit-dev
# libedit2 wamerican. Sets EXTRA_PREFIX for CMAKE_PREFIX_PATH.
# The machine's copy of the tree has no history of its own: the commit the
# builds there name (`orchard --version`, reports) is read from
# .device-debs/commit, written here before the run by
#   sed -n 's/.*"\(.*\)"/\1/p' build/generated/git_commit.h > .device-debs/commit
if [ -s .device-debs/commit ]; then
  ORCHARD_GIT_COMMIT=$(cat .device-debs/commit)
  export ORCHARD_GIT_COMMIT
fi
if ls .device-debs/*.deb >/dev/null 2>&1; then
  D=$(mktemp -d); for f in .device-debs/*.deb; do dpkg -x "$f" "$D"; done
  export PKG_CONFIG_PATH=$D/usr/lib/x86_64-linux-gnu/pkgconfig
  export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  # The .pc files say prefix=/usr: point the compiler and linker there too.
  export CPATH=$D/usr/include LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu
  EXTRA_PREFIX=$D/usr
  # wamerican's word list (GRPO's wordle and letters environments) where
  # the system has none.
  if [ -f $D/usr/share/dict/american-english ] && [ ! -e /usr/share/dict/american-english ]; then
    mkdir -p /usr/share/dict 2>/dev/null && cp $D/usr/share/dict/american-english /usr/share/dict/ 2>/dev/null \
      || echo "note: could not install the word list into /usr/share/dict"
  fi
fi

# device_build TARGET...: configure build-cuda against PyTorch's libtorch
# (Release, sm_90, plus $DEVICE_CMAKE_ARGS) and build the targets; logs in
# $OUT; exits on failure.
device_build() {
  local t0 prefix
  t0=$(date +%s)
  prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix${EXTRA_PREFIX:+;$EXTRA_PREFIX}" -DCMAKE_CUDA_ARCHITECTURES=90 ${DEVICE_CMAKE_ARGS:-} \
    > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
  cmake --build build-cuda -j"$(nproc)" --target "$@" > "$OUT/build.log" 2>&1 \
    || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
  echo "build took $(( $(date +%s) - t0 )) s"
}
