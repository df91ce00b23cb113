#!/usr/bin/env bash
# Issue 22 on the two-GPU machine (`run` with kind nvidia-h200-x2; the
# process group is NCCL there). Also runs on the CPU (DEV=cpu, Gloo) to
# check the script itself.
#   1. Same weights: a small GPT trained by one process and by two
#      (`orchard launch --nproc-per-node 2`) with the same total batch, in
#      float32; the largest weight difference is printed (tolerance 2e-4,
#      as tests/e2e/distributed_test.cpp on the CPU), and every step's
#      gradient norm must agree within 1e-4 (relative). On CUDA twice: the
#      default (the copy engines average) and grad_average=nccl.
#   1b. The same for stage=trm (the quick Sudoku model): weights after 4
#      steps, the puzzles in flight after 8.
#   1c. The same with zero_stage=1 (ZeRO-1: two ranks, each with half the
#      optimizer state) against one process, Muon and AdamW, float32; on
#      CUDA AdamW also with grad_average=nccl.
#   1d. (CUDA, "zlow") bfloat16, two processes with zero_stage=1 (pieces
#      gathered in bfloat16) against two without, no clipping.
#   1e. (CUDA, "low") bfloat16 with accumulation, one process against
#      two: the gradient norms of steps 1-3 (the products write into the
#      buckets there, and the earlier micro-steps' sum is added in).
#   2. Throughput: `orchard train` of a GPT (DEPTH, default 12: GPT-2
#      small's shape with GPT-2's built-in tokenizer) on 1 and 2 processes,
#      bfloat16, median tokens/s of the steps after the 5th; then PyTorch's
#      bench/peers/gpt_train_step.py alone and as DDP under torchrun
#      (COMPILE=1: torch.compile). The goal: two GPUs >= 1.9x one, and at
#      least DDP's scaling.
#   2b. The two-process run again with zero_stage=1: tokens/s and each
#      rank's peak memory beside the unsharded run's. OPTIM=muon trains
#      parts 2 and 2b with Muon (the default of base) instead of AdamW.
# GRAD_REDUCE=bfloat16: the two-process runs of part 2 with
# grad_reduce_dtype=bfloat16, DDP with its bf16_compress_hook; part "same"
# then also checks a two-process run averaging in bfloat16 against one
# process (the mean weight difference, as tests/e2e/distributed_test.cpp).
# SMALL_EXTRA adds settings to part 1's runs (weight_decay=0.1 with
# ORCHARD_TEST_UNUSED_PARAMETER=1: a parameter no rank gives a gradient
# must keep its value on two processes as on one).
# PARTS picks what runs (default "same trm zero zbench bench grpo", grpo
# on CUDA only; "zero" is 1c, "zbench" 2b, "grpo" 3; "kill", 4, only when
# named; "nopeer" adds to "same" a run where rank 1 cannot map the other
# GPU's memory, CUDA only). NCCL_MAX_NCHANNELS etc. pass through.
# TRACE_STEP=N-M (bench, CUDA): also traces those steps of one process and
# of both ranks of two (ORCHARD_TRACE); summaries in $OUT/dist_trace.txt.
# SKIP_BUILD=1 reuses a build a previous call left on the still-warm
# machine. Logs come back as $OUT/logs.tgz, the figures as
# $OUT/dist_bench.jsonl.
set -uo pipefail
RESULT="${OUT:-/tmp/orchard-out}"
OUT=/tmp/dist-logs
mkdir -p "$RESULT" "$OUT"
trap 'tar czf "$RESULT/logs.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1
DEV=${DEV:-cuda}
status=0
if [ "$DEV" = cuda ]; then
  source scripts/device_debs.sh
  if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x build-cuda/orchard ]; then :
  else device_build orchard; fi
  O=$PWD/build-cuda/orchard
  PY=python3
else
  O=${ORCHARD_BIN:-$PWD/build/orchard}
  PY=${PEER_PYTHON:-/usr/bin/python3}
fi
export ORCHARD_HOME=/tmp/dist-home
W=/tmp/dist-work
rm -rf $W && mkdir -p $W

# Text for the runs: words of the system's list in random sentences.
$PY scripts/word_corpus.py $W/corpus.txt 40000

median() { # tokens/s of metrics.jsonl after the 5th step
  $PY - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][5:]
v = sorted(r["tokens_per_s"] for r in rows)
print(f"{v[len(v) // 2]:.0f}" if v else "nan")
PY
}

# (GRPO's part makes its model with transformers: CUDA machine only.)
DEFAULT_PARTS="same trm zero zbench bench"
[ "$DEV" = cuda ] && DEFAULT_PARTS="$DEFAULT_PARTS zlow low grpo"
PARTS=" ${PARTS:-$DEFAULT_PARTS} "
want() { [[ "$PARTS" == *" $1 "* ]]; }

# 1. Same weights, one process against two.
SMALL="train --device $DEV data_paths=[$W/corpus.txt] tokenizer=gpt2 depth=2 max_seq_len=128
  total_batch_size=4096 device_batch_size=8 num_iterations=10 dtype=float32 eval_every=0
  sample_every=0 save_every=0 eval_tokens=1024 ${SMALL_EXTRA:-}"
same_weights() { # name, one-process run, two-process run
  $PY - "$1" $W/$2/checkpoints/step_000010/model.safetensors $W/$3/checkpoints/step_000010/model.safetensors <<'PY' | tee -a "$RESULT/dist_bench.jsonl"
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = load(sys.argv[2]), load(sys.argv[3])
# The blocks' matrices agree to float rounding. The embedding's rows of
# rarely seen tokens may not: their gradients are near zero, and AdamW's
# m / (sqrt(v) + eps) turns rounding noise there into a step of the full
# learning rate (seen on the CPU: 4e-3 at most, 99th percentile 1e-7). So:
# the blocks' largest difference, and the 99th percentile of all.
blocks = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a if k.startswith("blocks."))
diffs = sorted(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
p99 = diffs[int(0.99 * len(diffs))]
# Every step's gradient norm (the copy engines sum its squares as they
# average; one process reads the gradients) within float rounding too.
def norms(p):
    run = p.rsplit("/checkpoints/", 1)[0]
    return [json.loads(l)["grad_norm"] for l in open(run + "/metrics.jsonl") if '"grad_norm"' in l]
na, nb = norms(sys.argv[2]), norms(sys.argv[3])
norm_rel = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(na, nb)) if na and len(na) == len(nb) else float("inf")
ok = blocks < 2e-4 and p99 < 1e-5 and norm_rel < 1e-4
print(json.dumps({"check": sys.argv[1], "blocks_max_abs_diff": blocks,
                  "all_p99_abs_diff": p99, "all_max_abs_diff": diffs[-1],
                  "grad_norm_max_rel_diff": norm_rel, "ok": ok}))
sys.exit(0 if ok else 1)
PY
  [ ${PIPESTATUS[0]} = 0 ] || status=1
}
if want same; then
  $O $SMALL run_dir=$W/one > $OUT/same_one.log 2>&1 || { status=1; tail -20 $OUT/same_one.log; }
  $O launch --nproc-per-node 2 --master-port 29561 -- $SMALL run_dir=$W/two \
    > $OUT/same_two.log 2>&1 || { status=1; tail -20 $OUT/same_two.log; }
  same_weights "same weights, 1 vs 2 processes" one two
  grep -h "Gradient averaging" $OUT/same_two.log | head -1
  # On CUDA the default averages by the copy engines: NCCL's kernels too.
  if [ "$DEV" = cuda ]; then
    $O launch --nproc-per-node 2 --master-port 29568 -- $SMALL grad_average=nccl run_dir=$W/two_nccl \
      > $OUT/same_two_nccl.log 2>&1 || { status=1; tail -20 $OUT/same_two_nccl.log; }
    same_weights "same weights, 1 vs 2 processes, grad_average=nccl" one two_nccl
  fi
  # A host without peer access (rank 1 fails to map the others' memory,
  # ORCHARD_TEST_NO_PEER_ACCESS): by default every rank falls back to NCCL
  # and trains the same weights; grad_average=copy_engines stops, saying
  # why, with no rank left waiting.
  if [ "$DEV" = cuda ] && want nopeer; then
    ORCHARD_TEST_NO_PEER_ACCESS=1 $O launch --nproc-per-node 2 --master-port 29570 -- $SMALL \
      run_dir=$W/two_nopeer > $OUT/same_two_nopeer.log 2>&1 || { status=1; tail -20 $OUT/same_two_nopeer.log; }
    same_weights "same weights, 1 vs 2 processes, rank 1 without peer access" one two_nopeer
    grep -h "Gradient averaging" $OUT/same_two_nopeer.log | head -1
    grep -q "averaged by NCCL (the copy engines cannot: another process could not map them)" \
      $OUT/same_two_nopeer.log || { status=1; echo "nopeer: no fallback said"; }
    t0=$(date +%s.%N)
    ORCHARD_TEST_NO_PEER_ACCESS=1 timeout 300 $O launch --nproc-per-node 2 --master-port 29571 -- $SMALL \
      grad_average=copy_engines run_dir=$W/two_nopeer_forced > $OUT/same_two_nopeer_forced.log 2>&1
    rc=$?; t1=$(date +%s.%N)
    said=$(grep -h "grad_average=copy_engines: the copy engines cannot" $OUT/same_two_nopeer_forced.log | head -1)
    ok=false; [ $rc != 0 ] && [ $rc != 124 ] && [ -n "$said" ] && ok=true
    $PY -c "import json,sys; print(json.dumps({'check': 'grad_average=copy_engines, rank 1 without peer access',
      'exit': $rc, 'seconds': round($t1 - $t0, 1), 'message': sys.argv[1], 'ok': '$ok' == 'true'}))" "$said" \
      | tee -a "$RESULT/dist_bench.jsonl"
    [ $ok = true ] || status=1
  fi
  if [ "${GRAD_REDUCE:-float32}" = bfloat16 ]; then
    $O launch --nproc-per-node 2 --master-port 29567 -- $SMALL grad_reduce_dtype=bfloat16 run_dir=$W/two16 \
      > $OUT/same_two16.log 2>&1 || { status=1; tail -20 $OUT/same_two16.log; }
    grep -h "Gradient averaging" $OUT/same_two16.log | head -1
    $PY - $W/one $W/two $W/two16 <<'PY' | tee -a "$RESULT/dist_bench.jsonl"
import json, struct, sys
def load(p):
    b = open(p + "/checkpoints/step_000010/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = []
    for k, v in sorted(h.items()):
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        out += struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
one, two, low = (load(p) for p in sys.argv[1:4])
mean = lambda a, b: sum(abs(x - y) for x, y in zip(a, b)) / len(a)
m32, m16 = mean(one, two), mean(one, low)
ok = m16 < 3e-4 and m16 > 100 * m32
print(json.dumps({"check": "grad_reduce_dtype=bfloat16, 1 vs 2 processes", "mean_abs_diff_float32": m32,
                  "mean_abs_diff_bfloat16": m16, "ok": ok}))
sys.exit(0 if ok else 1)
PY
    [ ${PIPESTATUS[0]} = 0 ] || status=1
  fi
fi

# 1c. ZeRO-1: Muon (the default) and AdamW, one process against two.
if want zero; then
  for o in muon adamw; do
    $O $SMALL optimizer=$o run_dir=$W/z1_$o > $OUT/zero_one_$o.log 2>&1 || { status=1; tail -20 $OUT/zero_one_$o.log; }
    $O launch --nproc-per-node 2 --master-port 29565 -- $SMALL optimizer=$o zero_stage=1 run_dir=$W/z2_$o \
      > $OUT/zero_two_$o.log 2>&1 || { status=1; tail -20 $OUT/zero_two_$o.log; }
    grep -h "sharded\|Gradient averaging" $OUT/zero_two_$o.log
    same_weights "zero_stage=1 ($o), 1 vs 2 processes" z1_$o z2_$o
  done
  # On CUDA the copy engines reduce-scatter and gather by default: NCCL too.
  if [ "$DEV" = cuda ]; then
    $O launch --nproc-per-node 2 --master-port 29564 -- $SMALL optimizer=adamw zero_stage=1 grad_average=nccl \
      run_dir=$W/z2n_adamw > $OUT/zero_two_nccl.log 2>&1 || { status=1; tail -20 $OUT/zero_two_nccl.log; }
    same_weights "zero_stage=1 (adamw), 1 vs 2 processes, grad_average=nccl" z1_adamw z2n_adamw
  fi
fi
# 1d. (CUDA) ZeRO-1 in bfloat16: the projections' and lm_head's updated
# pieces are gathered in bfloat16 (each owner keeps float32; autocast
# rounds them so anyway). Without clipping (whose norm is summed in
# another order), two processes with zero_stage=1 must train the weights
# two processes without it train, to float rounding.
if want zlow && [ "$DEV" = cuda ]; then
  LOW=${SMALL/dtype=float32/dtype=bfloat16}
  for z in 0 1; do
    $O launch --nproc-per-node 2 --master-port 2958$z -- $LOW optimizer=adamw grad_clip=0 zero_stage=$z \
      run_dir=$W/zl$z > $OUT/zlow_two_z$z.log 2>&1 || { status=1; tail -20 $OUT/zlow_two_z$z.log; }
  done
  grep -h "Gradient averaging" $OUT/zlow_two_z1.log | head -1
  grep -q "gathered in BFloat16" $OUT/zlow_two_z1.log || { status=1; echo "zlow: nothing gathered in bfloat16"; }
  same_weights "bfloat16, 2 processes: zero_stage=1 (gathered in bfloat16) vs 0" zl0 zl1
fi

# 1e. (CUDA) bfloat16 autocast: there the backward's products write their
# gradients straight into the buckets, and with accumulation (4 micro-steps
# in one process, 2 a rank in two) the hook adds the earlier micro-steps'
# sum there. bfloat16 rounding parts the weights within a few steps, so
# the check is the gradient norms of steps 1-3 (seen equal to 7 digits; a
# dropped or doubled earlier sum moves step 1's by far more than 1e-5),
# and that some product did write into its bucket.
if want low && [ "$DEV" = cuda ]; then
  LOW=${SMALL/dtype=float32/dtype=bfloat16}
  $O $LOW run_dir=$W/low1 > $OUT/low_one.log 2>&1 || { status=1; tail -20 $OUT/low_one.log; }
  $O launch --nproc-per-node 2 --master-port 29572 -- $LOW run_dir=$W/low2 \
    > $OUT/low_two.log 2>&1 || { status=1; tail -20 $OUT/low_two.log; }
  made=$(grep -ho "[0-9]* of them made in their bucket" $OUT/low_two.log | head -1)
  $PY - $W/low1 $W/low2 "$made" <<'PY' | tee -a "$RESULT/dist_bench.jsonl"
import json, sys
def norms(run):
    return [json.loads(l)["grad_norm"] for l in open(run + "/metrics.jsonl") if '"grad_norm"' in l][:3]
a, b = norms(sys.argv[1]), norms(sys.argv[2])
rel = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)) if len(a) == len(b) == 3 else float("inf")
made = int(sys.argv[3].split()[0]) if sys.argv[3] else 0
ok = rel < 1e-5 and made > 0
print(json.dumps({"check": "bfloat16 with accumulation, 1 vs 2 processes: steps 1-3 gradient norms",
                  "one": a, "two": b, "max_rel_diff": rel, "made_in_bucket": made, "ok": ok}))
sys.exit(0 if ok else 1)
PY
  [ ${PIPESTATUS[0]} = 0 ] || status=1
fi

# 1b. stage=trm, one process against two (each half the puzzles in
# flight): the same puzzles in flight after 8 steps, the weights equal to
# float rounding after 4 (tests/e2e/distributed_test.cpp on the CPU).
if want trm; then
$O data sudoku --size 4 --count 300 --out $W/s4 > $OUT/trm_data.log 2>&1 || status=1
TRM="train --preset trm-sudoku-quick --device $DEV data=$W/s4 num_iterations=8 save_every=4
  eval_every=0 eval_size=20 save_total_limit=0 dtype=float32"
$O $TRM run_dir=$W/trm1 > $OUT/trm_one.log 2>&1 || { status=1; tail -20 $OUT/trm_one.log; }
$O launch --nproc-per-node 2 --master-port 29564 -- $TRM run_dir=$W/trm2 \
  > $OUT/trm_two.log 2>&1 || { status=1; tail -20 $OUT/trm_two.log; }
$PY - $W/trm1/checkpoints $W/trm2/checkpoints <<'PY' | tee -a "$RESULT/dist_bench.jsonl"
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    fmt = {"F32": "f", "I64": "q", "U8": "B"}
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; c = fmt[v["dtype"]]
        out[k] = struct.unpack("<%d%s" % ((e - s) // struct.calcsize(c), c), b[8 + n + s:8 + n + e])
    return out
one, two = sys.argv[1], sys.argv[2]
a, b = load(one + "/step_000004/model.safetensors"), load(two + "/step_000004/model.safetensors")
w = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)
a, b = load(one + "/step_000008/optimizer.safetensors"), load(two + "/step_000008/optimizer.safetensors")
same = all(a[k] == b[k] for k in ("carry.inputs", "carry.steps", "carry.halted", "carry.puzzle_ids"))
ok = w < 1e-4 and same
print(json.dumps({"check": "trm, 1 vs 2 processes", "weights_max_abs_diff_step4": w,
                  "same_puzzles_in_flight_step8": same, "ok": ok}))
sys.exit(0 if ok else 1)
PY
[ ${PIPESTATUS[0]} = 0 ] || status=1
fi

# 3. stage=grpo on GPUs (a random model of Qwen2.5-0.5B's shape, full
# fine-tuning, float32): one process with 8 completions a step, two with
# 4 each, and two with zero_stage=1. The weights after 4 steps (the same
# completions sampled, the same seeds) and the step times.
if want grpo; then
  GD=$W/grpo-prompts.jsonl GM=$W/qwen-0.5b
  python3 bench/peers/grpo_trl.py --data $GD > $OUT/grpo_data.log 2>&1 || status=1
  python3 bench/peers/grpo_trl.py --make 0.5b $GM > $OUT/grpo_make.log 2>&1 || status=1
  # A random model answers no sum right: a reward_cmd that scores the
  # completion's token ids gives every group a spread (advantages that
  # are not all zero, so the weights move).
  cat > $W/ids_reward.py <<'PY'
#!/usr/bin/env python3
import json, sys
for line in sys.stdin:
    ids = json.loads(line)["completion_ids"]
    print(json.dumps({"ids": (sum(ids) % 97) / 97.0}), flush=True)
PY
  G1="train stage=grpo model=$GM finetune=full env=answers data=$GD prompt_format=raw
    num_generations=8 gradient_accumulation_steps=1 max_completion_length=64 max_steps=4
    learning_rate=1e-5 dtype=float32 weights_dtype=float32 optim=adamw_torch eval_steps=0 eval_prompts=1 save_steps=0"
  chmod +x $W/ids_reward.py
  G1="$G1 reward_cmd=$W/ids_reward.py"
  $O $G1 per_device_train_batch_size=8 run_dir=$W/g1 > $OUT/grpo_one.log 2>&1 || { status=1; tail -20 $OUT/grpo_one.log; }
  for z in 0 1; do
    $O launch --nproc-per-node 2 --master-port 2957$z -- $G1 per_device_train_batch_size=4 zero_stage=$z \
      run_dir=$W/g2z$z > $OUT/grpo_two_z$z.log 2>&1 || { status=1; tail -20 $OUT/grpo_two_z$z.log; }
  done
  grep -h "^Peak memory\|sharded\|^Batch" $OUT/grpo_one.log $OUT/grpo_two_z0.log $OUT/grpo_two_z1.log
  python3 - $W <<'PY' | tee -a "$RESULT/dist_bench.jsonl"
import json, statistics, sys
from safetensors.torch import load_file
w = sys.argv[1]
def final(run):
    return load_file(f"{w}/{run}/checkpoints/step_000004/model.safetensors")
def secs(run):
    rows = [json.loads(l) for l in open(f"{w}/{run}/metrics.jsonl") if '"tokens_per_s"' in l]
    t = [r["elapsed_s"] for r in rows]
    return statistics.median(b - a for a, b in zip(t, t[1:])) if len(t) > 1 else None
one = final("g1")
out = {"check": "grpo full 0.5b-shape, 1 vs 2 processes", "median_step_s": {"one": secs("g1")}}
for run in ("g2z0", "g2z1"):
    two = final(run)
    out["max_abs_diff_" + run] = max((one[k].float() - two[k].float()).abs().max().item() for k in one)
    out["median_step_s"][run] = secs(run)
out["rewards"] = {run: [round(json.loads(l)["reward"], 6) for l in open(f"{w}/{run}/metrics.jsonl") if '"reward"' in l and '"loss"' in l] for run in ("g1", "g2z0", "g2z1")}
start = load_file(f"{w}/qwen-0.5b/model.safetensors")
shared = [k for k in one if k in start and start[k].shape == one[k].shape]
out["moved_by_training"] = max((one[k].float() - start[k].float()).abs().max().item() for k in shared) if shared else None
print(json.dumps(out))
PY
fi

# 2. Throughput, one process and two.
DEPTH=${DEPTH:-12}
B=${B:-16}
T=${T:-1024}
STEPS=${STEPS:-30}
# ACCUM=N: N micro-steps of B x T a process a step (gradient accumulation;
# the peer's DDP averages on the last one only, as Orchard does).
A=${ACCUM:-1}
BIG="train --device $DEV data_paths=[$W/corpus.txt] tokenizer=gpt2 depth=$DEPTH max_seq_len=$T
  optimizer=${OPTIM:-adamw} device_batch_size=$B num_iterations=$STEPS eval_every=0 sample_every=0 save_every=0
  eval_tokens=$((B * T))"
peak() { grep -h "^Peak memory" "$1" | head -1; }
# 4. (PARTS=kill, CUDA) One rank killed (SIGKILL) while the copy engines
# average the buckets: `orchard launch` must stop the other one (it waits
# in a GPU barrier of up to 10 minutes otherwise) and exit non-zero, saying
# which rank died. The seconds from the kill to the launcher's exit too.
if want kill && [ "$DEV" = cuda ]; then
  rm -rf $W/kill
  $O launch --nproc-per-node 2 --master-port 29569 -- ${BIG/num_iterations=$STEPS/num_iterations=100000} \
    total_batch_size=$((2 * B * T)) run_dir=$W/kill > $OUT/kill.log 2>&1 &
  launcher=$!
  for _ in $(seq 120); do grep -q "^step [0-9]*/" $OUT/kill.log 2>/dev/null && break; sleep 1; done
  sleep 5 # well into training
  victim=""
  for p in $(pgrep -f "num_iterations=100000"); do
    [ "$p" != "$launcher" ] && tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1 && victim=$p
  done
  t0=$(date +%s.%N); [ -n "$victim" ] && kill -9 $victim
  wait $launcher; rc=$?; t1=$(date +%s.%N)
  said=$(grep -h "^orchard launch: rank" $OUT/kill.log | head -1)
  left=$(pgrep -f "num_iterations=100000" | wc -l)
  ok=false; [ -n "$victim" ] && [ $rc != 0 ] && [ "$left" = 0 ] && [[ "$said" == *"rank 1"* ]] && ok=true
  $PY -c "import json,sys; print(json.dumps({'check': 'rank 1 killed mid-training (copy engines)', 'launcher_exit': $rc,
    'seconds_to_exit': round($t1 - $t0, 2), 'processes_left': $left, 'message': sys.argv[1], 'ok': '$ok' == 'true'}))" "$said" \
    | tee -a "$RESULT/dist_bench.jsonl"
  [ $ok = true ] || status=1
fi
if want zbench; then
  for z in 0 1; do
    $O launch --nproc-per-node 2 --master-port 29566 -- $BIG total_batch_size=$((A * 2 * B * T)) zero_stage=$z run_dir=$W/bz$z \
      > $OUT/bench_zero$z.log 2>&1 || { status=1; tail -20 $OUT/bench_zero$z.log; }
    echo "{\"orchard\": \"d$DEPTH ${B}x$T accum $A two processes\", \"optimizer\": \"${OPTIM:-adamw}\", \"zero_stage\": $z, \"tokens_per_s\": $(median $W/bz$z/metrics.jsonl), \"peak\": \"$(peak $OUT/bench_zero$z.log)\"}" | tee -a "$RESULT/dist_bench.jsonl"
  done
fi
want bench || exit $status
$O $BIG total_batch_size=$((A * B * T)) run_dir=$W/b1 > $OUT/bench_one.log 2>&1 || { status=1; tail -20 $OUT/bench_one.log; }
$O launch --nproc-per-node 2 --master-port 29562 -- $BIG total_batch_size=$((A * 2 * B * T)) \
  grad_reduce_dtype=${GRAD_REDUCE:-float32} run_dir=$W/b2 \
  > $OUT/bench_two.log 2>&1 || { status=1; tail -20 $OUT/bench_two.log; }
one=$(median $W/b1/metrics.jsonl); two=$(median $W/b2/metrics.jsonl)
echo "{\"orchard\": \"d$DEPTH ${B}x$T accum $A\", \"one\": $one, \"two\": $two}" | tee -a "$RESULT/dist_bench.jsonl"
grep -h "Gradient averaging" $OUT/bench_two.log | head -1 | tee -a "$RESULT/dist_bench.jsonl"
# TRACE_STEP=N-M: those steps of the one- and two-process runs traced
# again (rank 0 and rank 1 each write a trace), summed, and brought back
# gzipped.
if [ -n "${TRACE_STEP:-}" ] && [ "$DEV" = cuda ]; then
  TB=${BIG/num_iterations=$STEPS/num_iterations=${TRACE_STEP#*-}}
  ORCHARD_TRACE=$OUT/one.json ORCHARD_TRACE_STEP=$TRACE_STEP $O $TB \
    total_batch_size=$((A * B * T)) run_dir=$W/t1 > $OUT/trace_one.log 2>&1 || status=1
  ORCHARD_TRACE=$OUT/two.json ORCHARD_TRACE_STEP=$TRACE_STEP $O launch --nproc-per-node 2 --master-port 29564 -- \
    $TB total_batch_size=$((A * 2 * B * T)) run_dir=$W/t2 > $OUT/trace_two.log 2>&1 || status=1
  for t in one.json two.json two.json.rank1; do
    [ -f $OUT/$t ] || continue
    echo "trace: $t" | tee -a "$RESULT/dist_trace.txt"
    $PY bench/trace_summary.py $OUT/$t 25 2>&1 | tee -a "$RESULT/dist_trace.txt"
    gzip -c $OUT/$t > "$RESULT/$t.gz"; rm -f $OUT/$t
  done
fi
[ "${PEERS:-1}" = 1 ] || exit $status # PEERS=0: Orchard's runs only
MODE=eager; [ "${COMPILE:-0}" = 1 ] && MODE=compile
PREC=bf16; [ "$DEV" = cpu ] && PREC=fp32
export PEER_ACCUM=$A
WIDTH=$((64 * DEPTH)); HEADS=$(( WIDTH / 128 > 0 ? WIDTH / 128 : 1 ))
$PY bench/peers/gpt_train_step.py $DEV $DEPTH $WIDTH $HEADS 50257 $B $T $STEPS $MODE $PREC 2>&1 | tail -1 | tee -a "$RESULT/dist_bench.jsonl"
# Underscored flags: both torchrun 1.13 (Debian's) and 2.x take them; 1.13
# also needs --redirects 2 --tee 2 (docs/distributed.md).
TORCHRUN="torchrun --nproc_per_node 2"
$PY -c 'import torch; exit(0 if torch.__version__ >= "2" else 1)' || TORCHRUN="$TORCHRUN --redirects 2 --tee 2"
[ "${GRAD_REDUCE:-float32}" = bfloat16 ] && export DDP_HOOK=bf16
$TORCHRUN --master_port 29563 bench/peers/gpt_train_step.py $DEV $DEPTH $WIDTH $HEADS 50257 $B $T $STEPS $MODE $PREC 2>&1 \
  | grep "^pytorch" | tee -a "$RESULT/dist_bench.jsonl" || status=1
exit $status
