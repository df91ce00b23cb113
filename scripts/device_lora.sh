#!/usr/bin/env bash
# Issue 7 on the CUDA machine (../shared/device/README.md):
#   build   build against PyTorch's libtorch, run every test, check Orchard's
#           adapter and merged model with peft/transformers
#           (tests/reference/make_hf_fixtures.py --verify-*), fine-tune the tiny
#           fixture Llama from the command line on the GPU
#   bench   make a random model with Llama 3.2 3B's config and run
#           bench/peers/lora_step.py and orchard_bench_lora side by side
#           (LoRA r=16, all linear layers, bf16, checkpointing, batch 1,
#           sequence 1024 and 2048; greedy generation 128 + 256 tokens)
#   profile one traced step of each at 1024 and 2048, GPU kernels summed by
#           bench/trace_summary.py (traces left in $OUT)
#   probe   `orchard plan --probe --json` on that model: LoRA (bf16, 4-bit,
#           without checkpointing) and full fine-tuning at 1024 and 2048,
#           micro-batch 1 and 2 (and the preset, with its lora.dropout);
#           then a model with Qwen2.5 0.5B's shape (152K vocabulary, so the
#           loss weighs more), LoRA and full, micro-batch 1-16; each
#           measured beside the planner's prediction
#           ($OUT/probe.jsonl, one plan per line)
set -uo pipefail
OUT="${OUT:-/tmp/orchard-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
mode="${1:-build}"
status=0
source scripts/device_debs.sh
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
if [ "$mode" = profile ]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${EXTRA_PREFIX:+;$EXTRA_PREFIX}" -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
    || { tail -40 "$OUT/configure.log"; exit 1; }
  cmake --build build-cuda -j16 --target orchard_bench_lora orchard_bench_lora_trace > "$OUT/build.log" 2>&1 \
    || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
  M=/tmp/llama-3.2-3b-shape
  [ -f $M/config.json ] || python3 bench/peers/lora_step.py --make $M 2>&1 | grep -v Warn | tail -1
  for T in ${SEQS:-1024 2048}; do
    PEER_TRACE=$OUT/peft-$T.json python3 bench/peers/lora_step.py $M $T ${STEPS:-6} 16 2>&1 | grep -E "^transformers" || status=1
    python3 bench/trace_summary.py $OUT/peft-$T.json ${TOP:-12}
    ORCHARD_TRACE=$OUT/orchard-$T.json ./build-cuda/orchard_bench_lora_trace $M cuda $T ${STEPS:-6} 16 2>&1 | grep -E "^(orchard|  median)" || status=1
    python3 bench/trace_summary.py $OUT/orchard-$T.json ${TOP:-25}
  done
  gzip -f $OUT/*.json 2>/dev/null
  exit $status
fi
if [ ! -x build-cuda/orchard ] || [ "$mode" = build ]; then
  start=$(date +%s)
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${EXTRA_PREFIX:+;$EXTRA_PREFIX}" -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
    || { tail -40 "$OUT/configure.log"; exit 1; }
  cmake --build build-cuda -j16 > "$OUT/build.log" 2>&1 || { grep -E "error|Error" -A3 "$OUT/build.log" | head -60; exit 1; }
  echo "build took $(( $(date +%s) - start )) s"
fi
if [ "$mode" = build ]; then
  (cd build-cuda && ctest --output-on-failure -j8 > "$OUT/ctest.log" 2>&1) || status=1
  tail -4 "$OUT/ctest.log"; grep -E "\*\*\*Failed|FAILED|Skipped" "$OUT/ctest.log" | head -20
  G=$(mktemp -d)
  ORCHARD_PEFT_GOLDEN=$G ./build-cuda/orchard_golden_tests --gtest_filter='Lora.WritesGoldenForPeft*' > /dev/null 2>&1
  python3 tests/reference/make_hf_fixtures.py --verify-adapter tests/fixtures/hf/llama $G/adapter $G/adapter_logits.safetensors 2>&1 | grep -v Warn | tail -2 || status=1
  python3 tests/reference/make_hf_fixtures.py --verify-merged $G/merged $G/adapter_logits.safetensors 2>&1 | grep -v Warn | tail -2 || status=1
  python3 - <<'PY'
import json
w = [("river", "a large natural stream of water"), ("fox", "a small wild dog")]
with open("/tmp/chat.jsonl", "w") as f:
    for i in range(40):
        a, b = w[i % 2]
        f.write(json.dumps({"messages": [{"role": "user", "content": f"what is a {a}?"}, {"role": "assistant", "content": b + "."}]}) + "\n")
PY
  (cd /tmp && $OLDPWD/build-cuda/orchard train stage=lora model=$OLDPWD/tests/fixtures/hf/llama data=/tmp/chat.jsonl max_steps=10 max_seq_length=64 save_steps=5 2>&1 | tail -12) || status=1
  (cd /tmp && $OLDPWD/build-cuda/orchard chat --model $OLDPWD/tests/fixtures/hf/llama --adapter runs/lora/llama -p "what is a fox?" --max-new-tokens 6 2>&1 | tail -3) || status=1
fi
if [ "$mode" = probe ]; then
  cmake --build build-cuda -j16 --target orchard > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -30; exit 1; }
  M=/tmp/llama-3.2-3b-shape
  [ -n "${PROBE_ONLY_QWEN:-}" ] || [ -f $M/config.json ] || python3 bench/peers/lora_step.py --make $M 2>&1 | grep -v Warn | tail -1
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  Q=/tmp/qwen2.5-0.5b-shape
  [ -f $Q/config.json ] || python3 bench/peers/lora_step.py --make-qwen $Q 2>&1 | grep -v Warn | tail -1
  probe_one() { # model, then plan arguments (per_device_train_batch_size=1 unless given)
    local m=$1; shift
    ./build-cuda/orchard plan model=$m per_device_train_batch_size=1 "$@" \
        --probe --json 2> "$OUT/probe-err.log" | python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])
print(json.dumps(j))
for p in j.get("probe", []):
    print(sys.argv[1], p["batch"], "measured %.0f MB predicted %.0f MB (%+.1f %%)" % (p.get("measured_bytes", 0) / 1e6, p.get("predicted_bytes", 0) / 1e6, p.get("error_percent", 0)) if "measured_bytes" in p else p, file=sys.stderr)
' "$(basename $m) $*" >> "$OUT/probe.jsonl" || { status=1; tail -5 "$OUT/probe-err.log"; }
  }
  if [ -z "${PROBE_ONLY_QWEN:-}" ]; then
    for args in "stage=lora max_seq_length=1024" "stage=lora max_seq_length=2048" \
        "stage=lora max_seq_length=1024 load_in_4bit=true" \
        "stage=lora max_seq_length=2048 load_in_4bit=true" \
        "stage=lora max_seq_length=1024 gradient_checkpointing=false" \
        "--preset lora-llama-3.2-3b max_seq_length=1024" \
        "--preset lora-llama-3.2-3b max_seq_length=2048" \
        "stage=full max_seq_length=1024"; do
      probe_one $M $args
    done
  fi
  for args in "stage=lora max_seq_length=1024" "stage=lora max_seq_length=2048" \
      "stage=lora max_seq_length=1024 per_device_train_batch_size=8" \
      "stage=lora max_seq_length=256 per_device_train_batch_size=1" \
      "stage=lora max_seq_length=1024 load_in_4bit=true" \
      "stage=lora max_seq_length=1024 gradient_checkpointing=false" \
      "stage=full max_seq_length=1024" "stage=full max_seq_length=1024 per_device_train_batch_size=8"; do
    probe_one $Q $args
  done
fi
if [ "$mode" = bench ]; then
  cmake --build build-cuda -j16 --target orchard_bench_lora > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -30; exit 1; }
  M=/tmp/llama-3.2-3b-shape
  [ -f $M/config.json ] || python3 bench/peers/lora_step.py --make $M 2>&1 | grep -v Warn | tail -1
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  STEPS=${STEPS:-12}
  for T in 1024 2048; do
    G=""; [ $T = 1024 ] && G="128 256"
    for rep in 1 2; do
      python3 bench/peers/lora_step.py $M $T $STEPS 16 $G 2>&1 | grep -E "^(transformers)" || status=1
      ./build-cuda/orchard_bench_lora $M cuda $T $STEPS 16 $G 2>&1 | grep -E "^(orchard|  median)" || status=1
      G=""
    done
  done
  # 4-bit NF4 base (load_in_4bit=true) against bitsandbytes' NF4 + peft.
  for T in 1024 2048; do
    PEER_4BIT=1 python3 bench/peers/lora_step.py $M $T $STEPS 16 2>&1 | grep -E "^(transformers)" || status=1
    LORA_4BIT=1 ./build-cuda/orchard_bench_lora $M cuda $T $STEPS 16 2>&1 | grep -E "^(orchard|  median)" || status=1
  done
fi
exit $status
