#!/usr/bin/env bash
# The CUDA machine's run (see ../shared/device/README.md): make the Python
# safetensors fixtures, build against PyTorch's libtorch, write the Orchard
# golden file and verify it with the Python library, run every test and
# orchard doctor. Logs and the fixtures come back under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/orchard-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
FIX=tests/fixtures/safetensors
status=0
step() { echo; echo "=== $*"; }

echo "TMPDIR=${TMPDIR:-unset}"; ls -ld /tmp "${TMPDIR:-/tmp}"; touch /tmp/x && echo "/tmp writable"
step "python safetensors fixtures"
python3 -c 'import torch, safetensors, transformers; print("torch", torch.__version__, "safetensors", safetensors.__version__, "cuda", torch.cuda.is_available())'
python3 $FIX/make_fixtures.py $FIX || status=1

step "configure + build"
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
start=$(date +%s)
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${EXTRA_PREFIX:+;$EXTRA_PREFIX}" -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
grep -E "Orchard:|Torch" "$OUT/configure.log" | head -5
cmake --build build-cuda -j16 > "$OUT/build.log" 2>&1 || { grep -E "error|Error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build took $(( $(date +%s) - start )) s"

step "orchard-written golden, verified by the Python library"
ORCHARD_WRITE_GOLDEN=$FIX/orchard_written.safetensors ./build-cuda/orchard_tests \
  --gtest_filter='Safetensors.WriterMatches*' > /dev/null 2>&1
python3 $FIX/make_fixtures.py --verify $FIX/orchard_written.safetensors || status=1

step "ctest"
(cd build-cuda && ctest --output-on-failure -j8 > "$OUT/ctest.log" 2>&1) || status=1
tail -5 "$OUT/ctest.log"; grep -E "Failed|FAILED" "$OUT/ctest.log" | head -20

step "orchard doctor"
./build-cuda/orchard doctor; echo "doctor exit $?"
./build-cuda/orchard doctor --device cpu | tail -3

tar -cf "$OUT/fixtures.tar" $FIX/python_all_dtypes.safetensors $FIX/python_sharded $FIX/orchard_written.safetensors
exit $status
