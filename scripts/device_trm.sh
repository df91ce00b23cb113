#!/usr/bin/env bash
# Issue 20 on the CUDA machine (../shared/device/README.md).
# PHASE=bench (default): build orchard and the golden tests against
#   PyTorch's libtorch; run the Trm unit tests; write the TRM reference fixtures
#   (tests/reference/trm_reference.py, back as $OUT/trm_reference.tgz) and check
#   Orchard against them; then time one supervision step of the paper's
#   Sudoku MLP model (batch 768, bfloat16) in PyTorch eager, torch.compile
#   (bench/peers/trm_step.py) and `orchard train --preset trm-sudoku`.
# PHASE=profile: orchard_bench_trm (the step alone) and the peers, each
#   with a kernel summary of one traced step (NO_PEER=1: Orchard only).
# PHASE=kernels: the fused training kernels (src/ops/cuda/train_fused.cu)
#   against their plain ops and the TRM tests on the GPU, then the step alone
#   (orchard_bench_trm, with a traced step's kernel summary) and `orchard
#   train`'s s/step (PEER=1: the torch.compile peer too, in the same run).
# PHASE=build: the build alone; a next call within the machine's idle
#   time (30 s) finds it, and with SKIP_BUILD=1 uses it as it is.
# PHASE=accuracy: `orchard train --preset trm-sudoku` on generated easy
#   9x9 puzzles for SECS seconds (default MINUTES * 60, MINUTES 9) with
#   evaluations of 1,000 held-out puzzles along the way, EMA and raw
#   weights (the accuracy-against-time curve).
# PHASE=peer-accuracy: the PyTorch peer (torch.compile) given the same
#   minutes (MINUTES), data, lr and warmup; raw and EMA weights evaluated
#   at the end.
# PHASE=side-by-side: on a two-GPU machine, `orchard train --preset
#   trm-sudoku` on GPU 0 and the torch.compile peer on GPU 1 at the same
#   time, each given SECS (1500) s of wall clock on the same data, lr and
#   warmup, both evaluating 1,000 held-out puzzles (EMA and raw) every
#   EVAL_EVERY (500) steps. Both start in their own sessions (setsid), so
#   they outlive this call; then PHASE=collect calls, one after another
#   within the machine's idle time, wait up to WAIT (570) s each and bring
#   back the curves so far ($OUT/orchard_metrics.jsonl, $OUT/peer_curve.jsonl;
#   copied every 15 s, so a call cut short still returns them).
#   DATA=DIR uses a carried `orchard data sudoku` folder instead of
#   generating one.
# At most 8 files come back: logs go to /tmp/trm-logs and come back as
# $OUT/logs.tgz; the fixtures as $OUT/trm_reference.tgz.
set -uo pipefail
RESULT="${OUT:-/tmp/orchard-out}"
OUT=/tmp/trm-logs
mkdir -p "$RESULT" "$OUT"
trap 'tar czf "$RESULT/logs.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1
status=0
SBS=/tmp/trm-sbs
collect_curves() {
  cp $SBS/run/metrics.jsonl "$RESULT/orchard_metrics.jsonl" 2>/dev/null
  grep -h '^{"peer"' $SBS/peer.log > "$RESULT/peer_curve.jsonl" 2>/dev/null
  cp $SBS/orchard.log $SBS/peer.log "$OUT/" 2>/dev/null
}
if [ "${PHASE:-bench}" = collect ]; then
  deadline=$(( $(date +%s) + ${WAIT:-570} ))
  while [ "$(date +%s)" -lt $deadline ] && pgrep -f "trm_step.py|orchard train" > /dev/null; do
    collect_curves; sleep 15
  done
  collect_curves
  pgrep -fa "trm_step.py|orchard train" | cut -c1-80 || echo "both runs have ended"
  grep -h "held-out" $SBS/orchard.log | tail -3
  tail -3 "$RESULT/peer_curve.jsonl"
  exit 0
fi
source scripts/device_debs.sh
# SKIP_BUILD=1: use the build a previous call on this (still warm) machine
# left, whatever the working tree holds now.
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x build-cuda/orchard ]; then :
else case "${PHASE:-bench}" in
bench) device_build orchard orchard_golden_tests orchard_unit_tests ;;
profile) device_build orchard orchard_bench_trm orchard_bench_trm_trace ;;
kernels) device_build orchard orchard_unit_tests orchard_golden_tests orchard_bench_trm orchard_bench_trm_trace ;;
*) device_build orchard ;;
esac; fi
O=$PWD/build-cuda/orchard
# DIFFICULTY=hard: the accuracy phases on hard puzzles (<= 25 givens, not
# solved by singles) instead of easy ones.
DIFF=${DIFFICULTY:-easy}
D9=${DATA:-/tmp/trm-${DIFF}9}
[ -f $D9/train.csv ] || $O data sudoku --size 9 --difficulty $DIFF --count 10000 --augment 8 --seed 1 --out $D9 | head -1
# `orchard train --preset trm-sudoku` for STEPS steps: s/step from
# metrics.jsonl after 15 warm-up steps.
train_bench() {
  R=/tmp/trm-bench-run; rm -rf $R
  $O train --preset trm-sudoku data=$D9 num_iterations=${STEPS:-80} eval_every=0 eval_size=100 save_every=0 \
    run_dir=$R > "$OUT/orchard_bench.log" 2>&1 || { status=1; tail -20 "$OUT/orchard_bench.log"; }
  grep -E "^Batch|^Plan|step 1/" "$OUT/orchard_bench.log"
  python3 - $R <<'PY' | tee -a "$RESULT/trm_bench.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"tokens_per_s"' in l]
timed = rows[15:]
dt = (timed[-1]["elapsed_s"] - rows[14]["elapsed_s"]) / len(timed)
print(json.dumps({"peer": "orchard", "steps": len(timed), "s_per_step": round(dt, 5),
                  "cells_per_s": round(768 * 81 / dt),
                  "peak_memory_mb": max(r["peak_memory_mb"] for r in timed)}))
PY
}
case "${PHASE:-bench}" in
build) ;;
bench)
  python3 tests/reference/trm_reference.py tests/fixtures/trm_reference || status=1
  tar czf "$RESULT/trm_reference.tgz" -C tests/fixtures trm_reference
  ./build-cuda/orchard_golden_tests --gtest_filter='TrmReference.*' > "$OUT/golden.log" 2>&1 || status=1
  OMP_NUM_THREADS=4 ./build-cuda/orchard_unit_tests --gtest_filter='Trm.*' > "$OUT/unit.log" 2>&1 || status=1
  grep -hE "trm_reference\]|^\[  (PASSED|FAILED) |Failure" -A2 "$OUT/golden.log" "$OUT/unit.log" | head -30
  for flag in "" --compile; do
    python3 bench/peers/trm_step.py --data $D9 $flag > "$OUT/peer$flag.log" 2>&1 || { status=1; tail -20 "$OUT/peer$flag.log"; }
    grep '^{"peer"' "$OUT/peer$flag.log" | tee -a "$RESULT/trm_bench.jsonl"
  done
  train_bench
  ;;
profile)
  # Where a step's time goes: Orchard's step alone (orchard_bench_trm) and
  # the peers', each with a Kineto trace summed by bench/trace_summary.py.
  ./build-cuda/orchard_bench_trm cuda | tee -a "$RESULT/trm_bench.jsonl"
  ORCHARD_TRACE=$OUT/orchard.json ./build-cuda/orchard_bench_trm_trace cuda 768 3 > /dev/null
  python3 bench/trace_summary.py $OUT/orchard.json 25
  [ "${NO_PEER:-0}" = 1 ] || for flag in "" --compile; do
    python3 bench/peers/trm_step.py --data $D9 $flag --steps 20 --trace $OUT/peer$flag.json | tee -a "$RESULT/trm_bench.jsonl"
    python3 bench/trace_summary.py $OUT/peer$flag.json 25
  done
  train_bench
  gzip $OUT/*.json
  ;;
kernels)
  ./build-cuda/orchard_unit_tests --gtest_filter='FusedTrain.*:Trm.*:DecodeOps.*' > "$OUT/unit.log" 2>&1 || status=1
  ./build-cuda/orchard_golden_tests --gtest_filter='TrmReference.*' > "$OUT/golden.log" 2>&1 || status=1
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|actual" -A1 "$OUT/unit.log" "$OUT/golden.log" | head -40
  ./build-cuda/orchard_bench_trm cuda | tee -a "$RESULT/trm_bench.jsonl"
  ORCHARD_TRACE=$OUT/orchard.json ./build-cuda/orchard_bench_trm_trace cuda 768 3 > /dev/null
  python3 bench/trace_summary.py $OUT/orchard.json 25
  train_bench
  if [ "${PEER:-0}" = 1 ]; then
    python3 bench/peers/trm_step.py --data $D9 --compile > "$OUT/peer--compile.log" 2>&1 || { status=1; tail -20 "$OUT/peer--compile.log"; }
    grep '^{"peer"' "$OUT/peer--compile.log" | tee -a "$RESULT/trm_bench.jsonl"
  fi
  gzip -f $OUT/*.json
  ;;
accuracy)
  R=/tmp/trm-acc-run; rm -rf $R
  timeout -s INT ${SECS:-$(( ${MINUTES:-9} * 60 ))} $O train --preset trm-sudoku data=$D9 num_iterations=100000 \
    lr_warmup_steps=${WARMUP:-500} lr=${LR:-1e-4} eval_every=${EVAL_EVERY:-1000} eval_size=1000 save_every=2000 \
    run_dir=$R > "$OUT/orchard_accuracy.log" 2>&1
  grep -E "^Batch|held-out" "$OUT/orchard_accuracy.log" | tail -20
  cp $R/metrics.jsonl "$RESULT/accuracy_metrics.jsonl"
  ;;
side-by-side)
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  rm -rf $SBS; mkdir -p $SBS
  SECS=${SECS:-1500}
  CUDA_VISIBLE_DEVICES=0 setsid nohup timeout -s INT $SECS $O train --preset trm-sudoku data=$D9 \
    num_iterations=100000 lr_warmup_steps=${WARMUP:-200} lr=${LR:-3e-4} eval_every=${EVAL_EVERY:-500} \
    eval_size=1000 save_every=2000 run_dir=$SBS/run > $SBS/orchard.log 2>&1 < /dev/null &
  CUDA_VISIBLE_DEVICES=1 setsid nohup timeout -s INT $(( SECS + 120 )) python3 bench/peers/trm_step.py \
    --data $D9 --compile --minutes $(python3 -c "print($SECS / 60)") --eval-every ${EVAL_EVERY:-500} \
    --lr ${LR:-3e-4} --lr-warmup ${WARMUP:-200} > $SBS/peer.log 2>&1 < /dev/null &
  sleep ${SETTLE:-45}
  grep -E "^Batch|^Plan|step 1/|rror" $SBS/orchard.log | head; tail -3 $SBS/peer.log
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
  collect_curves
  ;;
peer-accuracy)
  python3 bench/peers/trm_step.py --data $D9 --compile --minutes ${MINUTES:-9} --lr ${LR:-1e-4} --lr-warmup ${WARMUP:-500} \
    > "$OUT/peer_accuracy.log" 2>&1 || { status=1; tail -20 "$OUT/peer_accuracy.log"; }
  grep '^{"peer"' "$OUT/peer_accuracy.log"
  ;;
esac
exit $status
