#!/usr/bin/env bash
# Orchard vs PyTorch training throughput, same architecture, one run
# (scripts/device_train.sh adds the real `orchard train`, a traced step and
# d20 on the CUDA machine).
#   bench/run_train_bench.sh cuda   (GPT-2 small size: d12, width 768, vocab 50304, 16 x 1024)
#   bench/run_train_bench.sh cpu    (d4, d6, d12 at width 64*depth, vocab 8192, 8 x 256)
#   PAIRS=N (cpu): each depth's two runs N times, interleaved (a shared VM's
#   speed drifts by more than the ratios measured; compare the medians).
# Needs build/ (or BUILD_DIR) and a Python with torch (PEER_PYTHON, default
# python3; on Debian: apt-get install python3-torch, then PEER_PYTHON=/usr/bin/python3).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD_DIR:-$root/build}/orchard_bench_train
peer=$root/bench/peers/gpt_train_step.py
py=${PEER_PYTHON:-python3}
if [ "${1:-cpu}" = cuda ]; then
  args="cuda 12 768 6 50304 16 1024 20"
  "$bin" $args fp32 adamw
  "$bin" $args bf16 adamw
  "$bin" $args bf16 muon
  "$py" "$peer" $args eager fp32
  "$py" "$peer" $args eager bf16
  "$py" "$peer" $args compile bf16
  "$py" "$peer" $args compile bf16 muon
else
  # Both sides on the OpenBLAS kernels orchard itself runs (it replaces the
  # generic fallback on CPUs newer than the OpenBLAS; core/blas_kernels.h):
  # the bench binary and Python would otherwise get the slow ones.
  if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    core=$("$(dirname "$bin")/orchard" doctor --device cpu 2>/dev/null |
      sed -n 's/.*, \([A-Za-z0-9]*\) kernels)$/\1/p' | head -1)
    [ -n "$core" ] && export OPENBLAS_CORETYPE=$core && echo "OpenBLAS kernels: $core"
  fi
  for d in 4 6 12; do
    w=$((64 * d)); h=$(( (w + 127) / 128 ))
    args="cpu $d $w $h 8192 8 256 5"
    for _ in $(seq "${PAIRS:-1}"); do
      "$bin" $args fp32 adamw
      "$py" "$peer" $args eager fp32
    done
  done
fi
