#!/usr/bin/env bash
# Issue 22's two-GPU gap taken apart (`run` kind nvidia-h200-x2): `orchard
# train` of a GPT (DEPTH, default 12; B x T tokens a GPU a step, default
# 16 x 1024; AdamW, bfloat16, 30 steps, median tokens/s of steps 6 on)
#   ALONE=1: one process on GPU 0, one on GPU 1, then one on each at once
#            (no collectives: what two independent GPUs do), then GPU 0
#            and GPU 1 with cuda_graphs=false;
#   SPECS:   two processes (`orchard launch`) under each "label:ENV=V,..."
#            (label "eager..." adds cuda_graphs=false). ENV may be
#            ORCHARD_TEST_SKIP_BUCKETS=all|last (a measurement only: the
#            buckets' gradients are then not averaged) or NCCL_* settings;
#            SET=key=value adds a setting to the command instead
#            (SET=grad_reduce_dtype=bfloat16); '+' in a value stands for
#            a comma (swap:CUDA_VISIBLE_DEVICES=1+0);
#            a label starting "one" runs one process on GPU 0 instead
#            (the reference the two are measured against; a spec's
#            CUDA_VISIBLE_DEVICES=1 runs it on GPU 1).
# ACCUM=N: N micro-steps of B x T a process a step.
# CLOCKS=1: each run's GPUs' SM clocks and power while busy
#           (scripts/gpu_clocks.sh).
# UNIT=1 also builds the unit tests and runs TESTS (a gtest filter) first.
# SKIP_BUILD=1 reuses build-cuda. Logs in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/orchard-out}; mkdir -p "$OUT"
source scripts/device_debs.sh
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x build-cuda/orchard ]; then :; else
  device_build orchard $([ "${UNIT:-0}" = 1 ] && echo orchard_unit_tests); fi
if [ "${UNIT:-0}" = 1 ]; then
  ./build-cuda/orchard_unit_tests --gtest_filter="${TESTS:-GradientSink.*:LinearCrossEntropy.*:FusedTrain.*:Trainer.*}" \
    > $OUT/unit.log 2>&1 && echo "unit tests passed: $(grep -c '^\[       OK' $OUT/unit.log)" \
    || { echo "unit tests FAILED"; grep -E '^\[  FAILED|Failure' -A3 $OUT/unit.log | head -40; }
fi
export ORCHARD_HOME=/tmp/dist-home W=/tmp/dist-variants; mkdir -p $W
python3 scripts/word_corpus.py $W/corpus.txt 40000
med() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if '\"tokens_per_s\"' in l][5:]
v=sorted(r['tokens_per_s'] for r in rows); print(sys.argv[2], f'{v[len(v)//2]:.0f}')" $1/metrics.jsonl "$2"; }
DEPTH=${DEPTH:-12} B=${B:-16} T=${T:-1024} A=${ACCUM:-1}
BIG="train --device cuda data_paths=[$W/corpus.txt] tokenizer=gpt2 depth=$DEPTH max_seq_len=$T optimizer=adamw
  device_batch_size=$B num_iterations=30 eval_every=0 sample_every=0 save_every=0 eval_tokens=$((B * T))"
O=build-cuda/orchard
clk() { # label command...: the command, under scripts/gpu_clocks.sh where CLOCKS=1
  if [ "${CLOCKS:-0}" = 1 ]; then CLOCKS_TO=$OUT/clocks.$1.txt scripts/gpu_clocks.sh "$@"; else shift; "$@"; fi; }
clocks() { [ -f $OUT/clocks.$1.txt ] && cat $OUT/clocks.$1.txt && rm -f $OUT/clocks.$1.txt; }
i=0
if [ "${ALONE:-0}" = 1 ]; then
  one() { # GPU, run name, extra settings
    rm -rf $W/$2 # a warm machine's earlier run would be resumed, not run
    clk "$2" env CUDA_VISIBLE_DEVICES=$1 $O $BIG total_batch_size=$((A * B * T)) ${3:-} run_dir=$W/$2 > $OUT/$2.log 2>&1
    med $W/$2 "d$DEPTH $2"; clocks $2; }
  one 0 gpu0_alone; one 1 gpu1_alone
  one 0 gpu0_beside_gpu1 & one 1 gpu1_beside_gpu0; wait
  one 0 gpu0_eager cuda_graphs=false; one 1 gpu1_eager cuda_graphs=false
fi
for spec in ${SPECS:-}; do
  label=${spec%%:*}; envs=${spec#*:}; i=$((i+1))
  extra=""; [[ $label == eager* ]] && extra="cuda_graphs=false"
  for kv in ${envs//,/ }; do [[ $kv == SET=* ]] && extra="$extra ${kv#SET=}"; done
  envs=$(echo "${envs//,/ }" | tr ' ' '\n' | grep -v '^SET=' | tr '\n+' ' ,'); envs=${envs:-X=1}
  rm -rf $W/r$i # a warm machine's earlier run would be resumed, not run
  if [[ $label == one* ]]; then
    clk "$label" env CUDA_VISIBLE_DEVICES=0 $envs $O $BIG total_batch_size=$((A * B * T)) run_dir=$W/r$i > $OUT/r$i.log 2>&1 || tail -5 $OUT/r$i.log
    med $W/r$i "d$DEPTH one process, $label"; clocks $label; continue
  fi
  clk "$label" env $envs $O launch --nproc-per-node 2 --master-port $((29600 + i)) -- $BIG total_batch_size=$((A * 2 * B * T)) \
    $extra run_dir=$W/r$i > $OUT/r$i.log 2>&1 || tail -5 $OUT/r$i.log
  med $W/r$i "d$DEPTH accum $A two processes, $label"
  clocks $label
done
