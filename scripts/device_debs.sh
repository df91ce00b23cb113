# Sourced by the CUDA machine's scripts (device_ci.sh, device_lora.sh).
# PCRE2, cpp-httplib (with the OpenSSL, zlib and Brotli headers its
# pkg-config file asks for) and libedit are missing on that machine: unpack
# the Debian packages ../shared/device/fetch-debs.sh put in .device-debs
# (carried): fetch-debs.sh libssl-dev zlib1g-dev libbrotli-dev libedit-dev
# libedit2 wamerican. Sets EXTRA_PREFIX for CMAKE_PREFIX_PATH.
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
