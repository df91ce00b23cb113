#!/usr/bin/env bash
# `orchard launch` on the CUDA machine's one GPU (`run` with kind
# nvidia-h200; carry .device-debs): the CUDA build (PyTorch 2.x) with the
# launchers' watch (src/dist/node_watch.cpp), its unit tests, and from the
# command line:
#   1. one process a GPU (`--nproc-per-node gpu`), SIGHUP to the launcher
#      mid-training: passed on, rank 0 saves, exit 129;
#   2. two "nodes" of one process each on one host: node 0's launcher
#      serves the rendezvous, node 1's joins, the ranks connect as
#      torchrun's agent's do; with one GPU both ranks are on it, which NCCL
#      cannot do: both must stop, saying that rank 0 and rank 1 share a
#      GPU, with exit 2 (what each said is printed);
#   3. `--nproc-per-node 2` on the one GPU: the same refusal;
#   4. `--max-restarts 1`, the rank killed (SIGKILL) mid-run with
#      resume=never in its command: the launcher starts it again, it
#      resumes from the newest checkpoint on the GPU and finishes (exit 0);
#   5. two nodes whose launchers were given other --nproc-per-node (gpu
#      on node 0, 2 on node 1): both stop before any rank trains, exit 2,
#      naming the setting and both values.
# Then, with UNIT_ALL=1, every unit test on CUDA.
# SKIP_BUILD=1 reuses a build a previous call left on the still-warm
# machine.
set -uo pipefail
source scripts/device_debs.sh
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x build-cuda/orchard ]; then :
else device_build orchard orchard_unit_tests; fi
O=$PWD/build-cuda/orchard
./build-cuda/orchard_unit_tests --gtest_filter='NodeWatch.*:StopSignal.*:LaunchEnv.*' 2>&1 | tail -3
export ORCHARD_HOME=/tmp/launch-home
W=/tmp/launch-work
rm -rf $W && mkdir -p $W
python3 scripts/word_corpus.py $W/corpus.txt 20000
RUN="train data_paths=[$W/corpus.txt] depth=4 num_iterations=100000 save_every=0 eval_every=0 sample_every=0"

# 1. SIGHUP to the launcher.
$O launch --standalone --nproc-per-node gpu -- $RUN run_dir=$W/hup > $W/hup.log 2>&1 &
L=$!
for _ in $(seq 180); do grep -q "^step [0-9]*/" $W/hup.log && break; sleep 1; done
sleep 3
kill -HUP $L
wait $L
echo "1. SIGHUP: launcher exit $? (want 129)"
grep -E "^Stopped|^orchard launch|error" $W/hup.log

# 2. Two nodes on one GPU.
$O launch --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29571 -- $RUN run_dir=$W/two \
  > $W/node1.log 2>&1 &
N1=$!
timeout 300 $O launch --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29571 -- $RUN run_dir=$W/two \
  > $W/node0.log 2>&1
echo "2. two nodes, one GPU: node 0 exit $?"
wait $N1
echo "   node 1 exit $?"
for n in 0 1; do
  echo "--- node $n"
  grep -E "^orchard launch|error|Distributed" $W/node$n.log | cut -c1-400 | head -12
done

# 3. Two processes on one GPU.
$O launch --standalone --nproc-per-node 2 -- $RUN run_dir=$W/shared > $W/shared.log 2>&1
echo "3. two processes, one GPU: exit $? (want 2)"
grep -E "^orchard launch|error" $W/shared.log | cut -c1-400 | head -8

# 4. A restart on the GPU.
$O launch --standalone --nproc-per-node gpu --max-restarts 1 -- train data_paths=[$W/corpus.txt] depth=4 \
  num_iterations=1500 save_every=20 eval_every=0 sample_every=0 run_dir=$W/restart resume=never > $W/restart.log 2>&1 &
L=$!
for _ in $(seq 600); do ls $W/restart/checkpoints 2>/dev/null | grep -q step_000040 && break; sleep 0.2; done
R=$(pgrep -P $L | head -1)
echo "4. killing rank 0 (pid $R) after $(ls $W/restart/checkpoints | tail -1)"
kill -9 $R
wait $L
echo "   launcher exit $? (want 0)"
grep -E "^orchard launch|^Restart|^Resuming|^Done|error" $W/restart.log | cut -c1-300 | head -12

# 5. Two nodes launched unlike.
$O launch --nnodes 2 --node-rank 0 --nproc-per-node gpu --master-addr 127.0.0.1 --master-port 29572 -- $RUN \
  run_dir=$W/unlike > $W/unlike0.log 2>&1 &
N0=$!
sleep 1
timeout 120 $O launch --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29572 -- $RUN \
  run_dir=$W/unlike > $W/unlike1.log 2>&1
echo "5. unlike nodes: node 1 exit $? (want 2)"
wait $N0
echo "   node 0 exit $? (want 2)"
for n in 0 1; do grep -E "^orchard launch|error" $W/unlike$n.log | cut -c1-300 | head -4; done

if [ "${UNIT_ALL:-0}" = 1 ]; then
  echo "--- every unit test on CUDA"
  timeout ${UNIT_LIMIT_S:-300} ./build-cuda/orchard_unit_tests 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|tests? ran" | tail -30
fi
