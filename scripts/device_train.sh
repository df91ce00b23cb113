#!/usr/bin/env bash
# Issue 21 on the CUDA machine (../shared/device/README.md): GPT pretraining
# speed against PyTorch, side by side in one run.
# PHASE=bench (default): build; the GPT, loss, optimizer and kernel unit
#   tests on the GPU; orchard_bench_train (d12, width 768, 16 x 1024, bf16:
#   AdamW, Muon, Muon at the tokenizer's odd vocabulary 50,257); the real
#   `orchard train` (Muon, the default, then AdamW; TRAIN_OPTIMS picks;
#   gpt2 tokenizer, generated text); a traced AdamW and Muon step's kernel
#   summaries; PEER=1: then torch.compile's AdamW
#   and Muon peers on the same machine.
# PHASE=peers: the PyTorch peers (bench/peers/gpt_train_step.py): eager and
#   torch.compile, AdamW and Muon; then d20 (width 1280, 8 x 1024) for
#   Orchard and torch.compile, Muon and AdamW (D20_OPTIMS picks).
# PHASE=train: only orchard_bench_train and `orchard train` at d12
#   (TRAIN_OPTIMS, default "adamw muon").
# PHASE=d20: only d20 (D20_OPTIMS, default "adamw muon"): Orchard, then
#   torch.compile for AdamW (the Muon peer is launch-bound; see d12).
#   TRAIN=1: then the real `orchard train` at d20 (TRAIN_OPTIMS, default
#   adamw; 8 x 1024 a step).
# PHASE=pairs: d12, for each optimizer in PAIR_OPTIMS (default "adamw
#   muon"): orchard_bench_train, then torch.compile's peer with the same
#   optimizer (modded-nanogpt's Muon for muon); then `orchard train` with
#   each. UNIT=1: the GPU unit tests first.
# PHASE=trace: orchard_bench_train d12 AdamW and torch.compile's AdamW peer
#   side by side, then one step of each traced (Kineto; torch.profiler for
#   the peer) and their kernels summed (TOP kernels, default 45). UNIT=1:
#   the GPU unit tests first; TRAIN=1: then `orchard train` (TRAIN_OPTIMS);
#   TRACES=0: no traces. TRAIN_GRAPHS="true false": `orchard train` with
#   and without CUDA graphs (default true).
# PHASE=runs: only `orchard train` (TRAIN_OPTIMS, TRAIN_GRAPHS; TRAIN_SHAPE
#   replaces "depth=12 max_seq_len=1024 total_batch_size=16384
#   device_batch_size=16").
# PHASE=memgrid: bench/run_memory_grid.sh cuda (the planner's fit).
# SKIP_BUILD=1: use the build a previous call on this warm machine left.
# Results come back as $OUT/train_bench.txt and $OUT/logs.tgz.
set -uo pipefail
RESULT="${OUT:-/tmp/orchard-out}"
OUT=/tmp/train-logs
mkdir -p "$RESULT" "$OUT"
trap 'tar czf "$RESULT/logs.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1
status=0
source scripts/device_debs.sh
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x build-cuda/orchard ]; then :
elif [ "${PHASE:-bench}" = d20 ]; then
  device_build orchard_bench_train
elif [ "${PHASE:-bench}" = train ]; then
  device_build orchard orchard_bench_train
elif [ "${PHASE:-bench}" = trace ]; then
  device_build orchard_bench_train orchard_bench_train_trace \
    $([ "${UNIT:-0}" = 1 ] && echo orchard_unit_tests) $([ "${TRAIN:-0}" = 1 ] && echo orchard)
else
  device_build orchard orchard_unit_tests orchard_bench_train orchard_bench_train_trace orchard_bench_memory
fi
B=build-cuda
log() { tee -a "$RESULT/train_bench.txt"; }
W=/tmp/train-work
mkdir -p $W
# The real trainer on words of the system's list in random sentences, once
# per optimizer in TRAIN_OPTIMS; the median tokens/s of steps 11 on.
orchard_train_runs() {
  python3 scripts/word_corpus.py $W/corpus.txt 60000
  for o in ${TRAIN_OPTIMS:-muon adamw}; do
  for g in ${TRAIN_GRAPHS:-true}; do
    rm -rf $W/run
    # TRACE_STEP=N (or N-M): that step (those steps) of the real trainer
    # traced, launch to logging.
    ${TRACE_STEP:+env ORCHARD_TRACE=$OUT/train_$o.json ORCHARD_TRACE_STEP=$TRACE_STEP} \
    $B/orchard train --device cuda "data_paths=[$W/corpus.txt]" tokenizer=gpt2 \
      ${TRAIN_SHAPE:-depth=12 max_seq_len=1024 total_batch_size=16384 device_batch_size=16} num_iterations=${STEPS:-60} eval_every=0 sample_every=0 \
      save_every=0 eval_tokens=16384 optimizer=$o cuda_graphs=$g run_dir=$W/run > "$OUT/orchard_train_${o}_$g.log" 2>&1 \
      || { status=1; tail -20 "$OUT/orchard_train_${o}_$g.log"; }
    grep -E "^Model|^Batch|^Memory|^Optimizer|^Precision|Peak|CUDA graph|captured" "$OUT/orchard_train_${o}_$g.log" | head -9 | log
    python3 - $W/run/metrics.jsonl "${TRAIN_SHAPE:-d12} $o cuda_graphs=$g" <<'PY' | log
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][10:]
v = sorted(r["tokens_per_s"] for r in rows)
print(json.dumps({"peer": "orchard train " + sys.argv[2], "steps": len(v), "median_tokens_per_s": round(v[len(v) // 2]),
                  "peak_memory_mb": max(r.get("peak_memory_mb", 0) for r in rows),
                  "loss_first_last": [rows[0].get("loss"), rows[-1].get("loss")],
                  "grad_norm_first_last": [rows[0].get("grad_norm"), rows[-1].get("grad_norm")]}))
first = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][:6]
print("  steps 1-6 loss", [r["loss"] for r in first], "grad_norm", [r["grad_norm"] for r in first])
PY
    if [ -n "${TRACE_STEP:-}" ] && [ -f "$OUT/train_$o.json" ]; then
      echo "trace: orchard train $o, step $TRACE_STEP" | log
      python3 bench/trace_summary.py "$OUT/train_$o.json" ${TOP:-12} 2>&1 | log
      # KEEP_TRACE=1: the trace itself comes back (gzipped) for a closer look.
      if [ "${KEEP_TRACE:-0}" = 1 ]; then gzip -c "$OUT/train_$o.json" > "$RESULT/train_${o}_$g.json.gz"; fi
      rm -f "$OUT/train_$o.json"
    fi
  done
  done
}
unit_tests() {
  OMP_NUM_THREADS=4 $B/orchard_unit_tests \
    --gtest_filter='LinearCrossEntropy.*:Gpt.*:Autocast.*:Optimizers.*:Muon.*:NewtonSchulz.*:FusedTrain.*:MemoryPlan.*:Trainer.*' \
    > "$OUT/unit.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|SKIPPED \]" -A2 "$OUT/unit.log" | head -30 | log
}
case "${PHASE:-bench}" in
bench)
  unit_tests
  A="cuda 12 768 6"
  $B/orchard_bench_train $A 50304 16 1024 20 bf16 adamw 2>&1 | log
  $B/orchard_bench_train $A 50304 16 1024 20 bf16 muon 2>&1 | log
  $B/orchard_bench_train $A 50257 16 1024 20 bf16 muon 2>&1 | log
  for o in adamw muon; do
    ORCHARD_TRACE=$OUT/step.json $B/orchard_bench_train_trace $A 50304 16 1024 5 bf16 $o > /dev/null 2>&1
    echo "trace: $o" | log
    python3 bench/trace_summary.py $OUT/step.json 30 2>&1 | log
    rm -f $OUT/step.json
  done
  orchard_train_runs
  if [ "${PEER:-0}" = 1 ]; then
    for m in "compile bf16 adamw" "compile bf16 muon"; do
      python3 bench/peers/gpt_train_step.py $A 50304 16 1024 20 $m 2>&1 | grep -E "^pytorch|Error" | log
    done
  fi
  ;;
peers)
  P=bench/peers/gpt_train_step.py
  A="cuda 12 768 6 50304 16 1024 20"
  for m in "eager bf16 adamw" "compile bf16 adamw" "compile bf16 muon"; do
    python3 $P $A $m 2>&1 | grep -E "^pytorch|Error" | log
  done
  A20="cuda 20 1280 10 50304 8 1024 15"
  for o in ${D20_OPTIMS:-muon adamw}; do
    $B/orchard_bench_train $A20 bf16 $o 2>&1 | log
    python3 $P $A20 compile bf16 $o 2>&1 | grep -E "^pytorch|Error" | log
  done
  ;;
train)
  # Only the real trainer beside its bench binary (AdamW, then Muon).
  for o in ${TRAIN_OPTIMS:-adamw muon}; do
    $B/orchard_bench_train cuda 12 768 6 50304 16 1024 20 bf16 $o 2>&1 | log
  done
  orchard_train_runs
  ;;
trace)
  [ "${UNIT:-0}" = 1 ] && unit_tests
  A="cuda 12 768 6 50304 16 1024"
  $B/orchard_bench_train $A 20 bf16 adamw 2>&1 | log
  python3 bench/peers/gpt_train_step.py $A 20 compile bf16 adamw 2>&1 | grep -E "^pytorch|Error" | log
  if [ "${TRACES:-1}" = 1 ]; then
    ORCHARD_TRACE=$OUT/step.json $B/orchard_bench_train_trace $A 5 bf16 adamw > /dev/null 2>&1
    echo "trace: orchard adamw" | log
    python3 bench/trace_summary.py $OUT/step.json ${TOP:-45} 2>&1 | log
    PEER_TRACE=$OUT/peer.json python3 bench/peers/gpt_train_step.py $A 5 compile bf16 adamw > /dev/null 2>&1
    echo "trace: torch.compile adamw" | log
    python3 bench/trace_summary.py $OUT/peer.json ${TOP:-45} 2>&1 | log
    rm -f $OUT/step.json $OUT/peer.json
  fi
  [ "${TRAIN:-0}" = 1 ] && orchard_train_runs
  ;;
runs)
  # Only the real trainer (TRAIN_OPTIMS, TRAIN_GRAPHS, TRAIN_SHAPE).
  orchard_train_runs
  ;;
d20)
  A20="cuda 20 1280 10 50304 8 1024 15"
  for o in ${D20_OPTIMS:-adamw muon}; do
    $B/orchard_bench_train $A20 bf16 $o 2>&1 | log
    [ "$o" = adamw ] && python3 bench/peers/gpt_train_step.py $A20 compile bf16 $o 2>&1 | grep -E "^pytorch|Error" | log
  done
  if [ "${TRAIN:-0}" = 1 ]; then
    TRAIN_OPTIMS=${TRAIN_OPTIMS:-adamw} \
      TRAIN_SHAPE="depth=20 max_seq_len=1024 total_batch_size=8192 device_batch_size=8" \
      orchard_train_runs
  fi
  ;;
pairs)
  [ "${UNIT:-0}" = 1 ] && unit_tests
  A="cuda 12 768 6 50304 16 1024 20"
  for o in ${PAIR_OPTIMS:-adamw muon}; do
    $B/orchard_bench_train $A bf16 $o 2>&1 | log
    python3 bench/peers/gpt_train_step.py $A compile bf16 $o 2>&1 | grep -E "^pytorch|Error" | log
  done
  TRAIN_OPTIMS=${PAIR_OPTIMS:-adamw muon} orchard_train_runs
  ;;
memgrid)
  BUILD_DIR=$B bash bench/run_memory_grid.sh cuda > "$OUT/memory_grid_cuda.txt" 2>&1
  cp /tmp/memory_grid.jsonl "$RESULT/memory_grid_cuda.jsonl"
  tail -2 "$OUT/memory_grid_cuda.txt" | log
  ;;
esac
exit $status
