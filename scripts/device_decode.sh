#!/usr/bin/env bash
# Issue 18 on the CUDA machine (../shared/device/README.md):
#   build the decoding targets against PyTorch's libtorch; run the decoding
#   tests (graphs against eager, the sampler, batched rows, log-probs,
#   prepared models against transformers' fixtures, serve); then, side by
#   side on random models with Llama 3.2 3B's and Qwen2.5 0.5B's configs
#   (bench/peers/lora_step.py --make): orchard_bench_decode and
#   bench/peers/hf_generate.py (transformers generate, dynamic cache, and
#   static cache + torch.compile when PEER_STATIC=1), and `orchard generate`
#   from the command line on the 3B shape (llama3 tokenizer fixture copied
#   in).
# SKIP_BUILD=1 reuses build-cuda (a warm machine); KERNELS=OFF leaves out
# the CUDA kernels of src/ops/cuda (on by default);
# TESTS is the unit tests' gtest filter; NO_PEER=1 skips transformers;
# ORCHARD_BENCH_PRODUCTS=1 and ORCHARD_BENCH_NF4=1 pass through to the
# bench (each kind of one-row product alone, in GB/s; the NF4 base).
# PDL_AB=1 runs the 3B bench again with ORCHARD_PDL=0 (kernels launched
# plainly, no programmatic dependent launch).
set -uo pipefail
OUT="${OUT:-/tmp/orchard-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
source scripts/device_debs.sh
[ "${SKIP_BUILD:-0}" = 1 ] || DEVICE_CMAKE_ARGS=-DORCHARD_CUDA=${KERNELS:-ON} device_build orchard orchard_unit_tests orchard_golden_tests orchard_bench_decode
M=/tmp/llama-3.2-3b-shape Q=/tmp/qwen-0.5b-shape
( [ -f $M/config.json ] || python3 bench/peers/lora_step.py --make $M 2>&1 | grep -v Warn | tail -1
  [ -f $Q/config.json ] || python3 bench/peers/lora_step.py --make-qwen $Q 2>&1 | grep -v Warn | tail -1
  cp tests/fixtures/tokenizers/llama3/* $M/ ) > "$OUT/make_models.log" 2>&1 &
maker=$!
./build-cuda/orchard_unit_tests --gtest_filter="${TESTS:-DecodeOps.*:RmsNorm.*:Decode.*:Attention.*:Engine.*:BatchEngine.*:Serve.*}" \
  > "$OUT/unit.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \] Decode|tests ran" "$OUT/unit.log" | head -30
./build-cuda/orchard_golden_tests --gtest_filter='*Decoding*:*PreparedForInference*' > "$OUT/golden.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/golden.log" | head -10
wait $maker; cat "$OUT/make_models.log"
echo "=== Llama 3.2 3B shape, prompt 128 + 256 new"
./build-cuda/orchard_bench_decode $M cuda 128 256 2>&1 | tee "$OUT/bench_3b.txt" || status=1
if [ "${PDL_AB:-0}" = 1 ]; then
  echo "=== the same, kernels launched plainly (ORCHARD_PDL=0)"
  ORCHARD_PDL=0 ./build-cuda/orchard_bench_decode $M cuda 128 256 2>&1 | tee "$OUT/bench_3b_nopdl.txt" || status=1
fi
[ "${NO_PEER:-0}" = 1 ] || python3 bench/peers/hf_generate.py $M 128 256 2>&1 | grep -E "^transformers|Error|error" | tee -a "$OUT/bench_3b.txt"
echo "=== orchard generate on the 3B shape (command line)"
./build-cuda/orchard generate --model $M --prompt "The orchard" --temperature 0 --max-new-tokens 256 2>&1 | tail -1
./build-cuda/orchard generate --model $M --prompt "The orchard" --max-new-tokens 256 2>&1 | tail -1
echo "=== Qwen2.5 0.5B shape, prompt 128 + 128 new"
./build-cuda/orchard_bench_decode $Q cuda 128 128 2>&1 | tee "$OUT/bench_05b.txt" || status=1
[ "${NO_PEER:-0}" = 1 ] || python3 bench/peers/hf_generate.py $Q 128 128 2>&1 | grep -E "^transformers|Error|error" | tee -a "$OUT/bench_05b.txt"
if [ "${PEER_STATIC:-0}" = 1 ]; then
  echo "=== transformers' static cache + torch.compile on the 3B shape (last: its compilation takes minutes)"
  timeout ${PEER_STATIC_TIMEOUT:-240} python3 bench/peers/hf_generate.py $M 128 256 static 2>&1 \
    | grep -E "^transformers|Error|error" | tee -a "$OUT/bench_3b.txt"
fi
exit $status
