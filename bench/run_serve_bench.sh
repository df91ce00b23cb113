#!/usr/bin/env bash
# Load on `orchard serve` over loopback: N concurrent streaming clients
# (bench/serve_load.cpp), for several N, against one model.
#
#   bash bench/run_serve_bench.sh CHECKPOINT [DEVICE]
#
# Environment: BUILD_DIR (build), CLIENTS ("1 4 16"), REQUESTS (requests per
# client, 4), MAX_TOKENS (128), MAX_BATCH (the server's --max-batch, 16).
set -euo pipefail
CKPT="$1"
DEVICE="${2:-auto}"
BUILD_DIR="${BUILD_DIR:-build}"
PORT=$((20000 + RANDOM % 20000))
"$BUILD_DIR/orchard" serve --checkpoint "$CKPT" --device "$DEVICE" --port "$PORT" \
  --max-batch "${MAX_BATCH:-16}" > /tmp/orchard-serve-bench.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
  sleep 0.2
done
head -3 /tmp/orchard-serve-bench.log
for n in ${CLIENTS:-1 4 16}; do
  "$BUILD_DIR/orchard_bench_serve" "$PORT" "$n" "${REQUESTS:-4}" "${MAX_TOKENS:-128}"
done
curl -s "http://127.0.0.1:$PORT/health"; echo
