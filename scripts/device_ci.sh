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

source scripts/device_debs.sh

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
ORCHARD_WRITE_GOLDEN=$FIX/orchard_written.safetensors ./build-cuda/orchard_unit_tests \
  --gtest_filter='Safetensors.WriterMatches*' > /dev/null 2>&1
python3 $FIX/make_fixtures.py --verify $FIX/orchard_written.safetensors || status=1

step "ctest"
(cd build-cuda && ctest --output-on-failure -j8 > "$OUT/ctest.log" 2>&1) || status=1
tail -5 "$OUT/ctest.log"; grep -E "Failed|FAILED" "$OUT/ctest.log" | head -20

step "Hugging Face tokenizers reads Orchard's tokenizer.json"
HF=$(mktemp -d)
ORCHARD_HF_OUT=$HF ./build-cuda/orchard_golden_tests --gtest_filter='*HfRoundTrip*' > /dev/null 2>&1
for enc in gpt2 cl100k_base; do
  python3 tests/fixtures/tokenizers/check_hf.py ./build-cuda/orchard $HF/$enc \
    tests/fixtures/tokenizers/${enc}_reference.json 1 || status=1
done
cat src/*/*.cpp src/*/*.h > $HF/corpus.txt
./build-cuda/orchard tokenizer train --input $HF/corpus.txt --vocab-size 2000 --out $HF/trained | tail -2
python3 tests/fixtures/tokenizers/check_hf.py ./build-cuda/orchard $HF/trained \
  tests/fixtures/tokenizers/cl100k_base_reference.json || status=1

step "orchard train and generate on the GPU (smoke run on Orchard's own sources)"
G=$(mktemp -d)
# The default precision (bf16 autocast) with Muon, then float16 with loss
# scaling and AdamW, then float32.
for extra in "" "dtype=float16 optimizer=adamw" "dtype=float32"; do
  ORCHARD_HOME=$G/home ./build-cuda/orchard train --device cuda "data_paths=[src]" depth=2 \
    max_seq_len=128 total_batch_size=8192 num_iterations=30 eval_every=10 sample_every=15 \
    run_dir=$G/run$(echo $extra | tr -dc a-z0-9) $extra 2>&1 \
    | grep -E "Precision|Optimizer|Done|Samples at|skipped|Error|error" || status=1
done
cp $G/run/metrics.jsonl "$OUT/cuda_bf16_metrics.jsonl" 2>/dev/null
./build-cuda/orchard generate --device cuda --checkpoint $G/run --prompt "int main(" \
  --max-new-tokens 40 --seed 1 | tail -3 || status=1

if [ "${ORCHARD_BENCH:-0}" = 1 ]; then
  step "training throughput vs PyTorch (bench/run_train_bench.sh cuda)"
  BUILD_DIR=build-cuda bash bench/run_train_bench.sh cuda 2>&1 | tee "$OUT/train_bench.txt"
fi

if [ "${ORCHARD_OOM:-0}" = 1 ]; then
  step "a real CUDA out-of-memory: d24 at 64 x 512 tokens, halved until it fits"
  # 4000 documents of words from Orchard's sources: enough for a validation split.
  mkdir -p $G/words && python3 -c "
import random, re, glob
words = re.findall(r'[A-Za-z]+', ' '.join(open(f).read() for f in glob.glob('src/*/*.*')))
random.seed(0)
with open('$G/words/docs.jsonl', 'w') as out:
    for i in range(4000):
        out.write('{\"text\": \"%s\"}\\n' % ' '.join(random.choices(words, k=300)))
"
  for extra in "device_batch_size=64" ""; do
    ORCHARD_HOME=$G/home ./build-cuda/orchard train --device cuda "data_paths=[$G/words]" depth=24 \
      max_seq_len=512 total_batch_size=32768 num_iterations=2 eval_every=0 sample_every=0 \
      save_every=0 eval_tokens=8192 run_dir=$G/oom$extra $extra 2>&1 \
      | grep -E "Memory plan|Batch:|Out of memory|Peak memory|Done|rror" || status=1
  done
fi

if [ "${ORCHARD_MEMGRID:-0}" = 1 ]; then
  step "memory planner: predicted vs measured (bench/run_memory_grid.sh cuda)"
  BUILD_DIR=build-cuda bash bench/run_memory_grid.sh cuda > "$OUT/memory_grid_cuda.txt" 2>&1
  tail -3 "$OUT/memory_grid_cuda.txt"
  ./build-cuda/orchard plan --device cuda --preset overnight --probe 2>&1 | tail -12
fi

if [ "${ORCHARD_SERVE_BENCH:-0}" = 1 ]; then
  step "orchard serve under load (bench/run_serve_bench.sh)"
  # The d2 smoke model above, and a d12 (GPT-2 small's shape) trained two
  # steps: the numbers measure serving, not the model's quality.
  ORCHARD_HOME=$G/home ./build-cuda/orchard train --device cuda "data_paths=[src]" depth=12 \
    max_seq_len=1024 total_batch_size=16384 num_iterations=2 eval_every=0 sample_every=0 \
    run_dir=$G/d12 2>&1 | grep -E "Model:|Done" || status=1
  for run in run d12; do
    echo "--- $run"
    BUILD_DIR=build-cuda CLIENTS="1 8 32" MAX_BATCH=32 MAX_TOKENS=128 \
      bash bench/run_serve_bench.sh $G/$run cuda 2>&1 | tee -a "$OUT/serve_bench.txt"
  done
fi

step "orchard doctor"
./build-cuda/orchard doctor; echo "doctor exit $?"
./build-cuda/orchard doctor --device cpu | tail -3

tar -cf "$OUT/fixtures.tar" $FIX/python_all_dtypes.safetensors $FIX/python_sharded $FIX/orchard_written.safetensors
exit $status
