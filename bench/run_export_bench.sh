#!/usr/bin/env bash
# `orchard export gguf` measured, and llama.cpp's CPU decoding of the export
# beside `orchard generate` on the same model (issue 23's benchmark):
#   bench/run_export_bench.sh [export|decode|all]
# export: a random model in Llama 3.2 3B's shape (bf16, 6.4 GB), exported
#         to f16 and q4_K_M: wall time, peak resident memory (GNU time) and
#         file size. llama.cpp's convert_hf_to_gguf.py + llama-quantize are
#         not available here (Python's gguf package and llama.cpp's tools
#         are not in Debian or npm), so the figures stand alone beside the
#         file's own size.
# decode: Qwen2.5 0.5B's shape (Llama 3's tokenizer, vocabulary 128,256),
#         exported to q4_0, q8_0 and f16 and decoded by llama.cpp
#         (node-llama-cpp's prebuilt CPU build, bench/peers/llama_cpp_decode.mjs)
#         and by `orchard generate` (--dtype float32 and bfloat16 on the
#         CPU), greedy, prompt ~128
#         tokens + NEW new tokens, THREADS threads each.
# Needs build/ with orchard and orchard_bench_random_model (cmake --build
# build --target orchard orchard_bench_random_model) and the llama.cpp judge
# that ./orchard.sh test installs in build/llama-judge. Models are cached in
# WORK (default /tmp/orchard-export-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
work=${WORK:-/tmp/orchard-export-bench}
what=${1:-all}
threads=${THREADS:-$(nproc)}
new=${NEW:-64}
judge=$build/llama-judge
mkdir -p "$work"

model() { # SHAPE -> folder
  local dir=$work/$1
  [ -f "$dir/model.safetensors" ] || "$build/orchard_bench_random_model" "$1" "$dir" >&2
  echo "$dir"
}

timed_export() { # DIR TYPE OUT
  rm -f "$3"
  /usr/bin/time -f "  wall %e s, peak resident %M KB" \
    "$build/orchard" export gguf --model "$1" --type "$2" --out "$3" 2>&1 |
    grep -E "^Wrote|wall|fall|tensors:"
}

if [ "$what" = export ] || [ "$what" = all ]; then
  dir=$(model llama-3.2-3b)
  echo "== export, Llama 3.2 3B shape: $(du -h "$dir/model.safetensors" | cut -f1) of bf16 safetensors"
  for t in f16 q4_K_M; do
    timed_export "$dir" "$t" "$work/3b-$t.gguf"
  done
  rm -f "$work"/3b-*.gguf
fi

if [ "$what" = decode ] || [ "$what" = all ]; then
  [ -d "$judge/node_modules/node-llama-cpp" ] ||
    { echo "llama.cpp is not installed in $judge: run ./orchard.sh test first" >&2; exit 1; }
  cp "$root/bench/peers/llama_cpp_decode.mjs" "$judge/"
  dir=$(model qwen2.5-0.5b)
  prompt=$(printf 'apple %.0s' $(seq 1 127))
  echo "== decode on the CPU ($threads threads), Qwen2.5 0.5B shape, $new new tokens"
  for t in q4_0 q8_0 f16; do
    out=$work/0.5b-$t.gguf
    [ -f "$out" ] || "$build/orchard" export gguf --model "$dir" --type "$t" --out "$out" >/dev/null
    (cd "$judge" && node llama_cpp_decode.mjs "$out" 128 "$new" "$threads")
  done
  for dtype in float32 bfloat16; do
    for run in 1 2 3; do
      OMP_NUM_THREADS=$threads "$build/orchard" generate --model "$dir" --device cpu \
        --dtype $dtype --prompt "$prompt" --temperature 0 --max-new-tokens "$new" 2>&1 |
        grep -o "prompt .*tokens/s" | sed "s/^/orchard generate ($dtype), run $run: /"
    done
  done
fi
