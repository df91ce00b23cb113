#!/usr/bin/env bash
# Issue 19 on the CUDA machine (../shared/device/README.md): build orchard
# and the unit tests against PyTorch's libtorch, run the GRPO tests, then
# GRPO side by side with TRL (bench/peers/grpo_trl.py, TRL's sources
# carried in .peers/trl-site) on random models with Qwen2.5-3B's shape
# (LoRA, the guide's settings) and 0.5B's (full fine-tuning).
# ONLY=3b|0.5b runs one of the two; NO_PEER=1 skips TRL. The 0.5B shape
# runs with its defaults (bfloat16 weights and 8-bit moments on a GPU: the
# peer's row), then with float32 weights and moments, then bfloat16 weights
# with float32 moments.
set -uo pipefail
OUT="${OUT:-/tmp/orchard-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
source scripts/device_debs.sh
device_build orchard orchard_unit_tests
OMP_NUM_THREADS=1 ./build-cuda/orchard_unit_tests --gtest_filter="${TESTS:-Grpo*:Wordle.*}" \
  > "$OUT/unit.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |held-out|tests ran" "$OUT/unit.log" | head -20
export PYTHONPATH=$PWD/.peers/trl-site
DATA=/tmp/grpo-prompts.jsonl
python3 bench/peers/grpo_trl.py --data $DATA
O=$PWD/build-cuda/orchard
bench() { # size kind G B ACC [extra orchard settings] [peer: 1 or 0]
  local size=$1 kind=$2 G=$3 B=$4 ACC=$5 extra=${6:-} peer=${7:-1} M=/tmp/qwen-$1-grpo
  [ -f $M/config.json ] || python3 bench/peers/grpo_trl.py --make $size $M 2>&1 | grep -v Warn | tail -1
  echo "=== Qwen2.5-$size shape, $kind, num_generations $G, per_device $B x accumulation $ACC, 128 new tokens $extra"
  local R=/tmp/grpo-run-$size tag=$size$(echo "$extra" | tr ' =' '_-' | sed 's/^./_&/')
  rm -rf $R
  $O train stage=grpo model=$M finetune=$kind env=answers data=$DATA prompt_format=raw \
    num_generations=$G per_device_train_batch_size=$B gradient_accumulation_steps=$ACC \
    max_completion_length=128 max_steps=${STEPS:-8} learning_rate=1e-6 bf16=true \
    gradient_checkpointing=true eval_steps=0 eval_prompts=1 save_steps=0 run_dir=$R $extra \
    > "$OUT/orchard_$tag.log" 2>&1 || { status=1; tail -20 "$OUT/orchard_$tag.log"; }
  grep -E "^Batch|^Rollouts|Peak memory" "$OUT/orchard_$tag.log"
  python3 bench/peers/grpo_orchard_summary.py $R $kind $G 128 | tee -a "$OUT/grpo_bench.jsonl"
  if [ "${NO_PEER:-0}" != 1 ] && [ "$peer" = 1 ]; then
    G=$G B=$B ACC=$ACC C=128 STEPS=${STEPS:-8} python3 bench/peers/grpo_trl.py $M $kind \
      > "$OUT/trl_$size.log" 2>&1 || { status=1; tail -20 "$OUT/trl_$size.log"; }
    grep '^{"peer"' "$OUT/trl_$size.log" | tee -a "$OUT/grpo_bench.jsonl"
  fi
}
[ "${ONLY:-3b}" = 0.5b ] || bench 3b lora 2 1 2
[ "${ONLY:-0.5b}" = 3b ] || bench 0.5b full 8 8 1
# The 0.5B shape again with float32 weights and moments, and with bfloat16
# weights (as TRL holds them) and float32 moments; TRL's figures are the
# default row's.
[ "${ONLY:-0.5b}" = 3b ] || bench 0.5b full 8 8 1 "weights_dtype=float32 optim=adamw_torch" 0
[ "${ONLY:-0.5b}" = 3b ] || bench 0.5b full 8 8 1 "weights_dtype=bfloat16 optim=adamw_torch" 0
exit $status
