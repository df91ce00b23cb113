#!/usr/bin/env bash
# Predicted vs measured peak memory of a training step over a grid of model
# sizes x micro-batches x gradient checkpointing (bench/memory_probe.cpp,
# one process per point). Prints one JSON line per point and a summary.
#   bench/run_memory_grid.sh cpu     (d2/d4/d6 widths 128-384, 256 tokens, float32)
#   bench/run_memory_grid.sh cuda    (d4, d12 w768, d20 w1280, 1024 tokens, bf16 and float32)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BUILD_DIR:-$root/build}/orchard_bench_memory
dev=${1:-cpu}
if [ "$dev" = cuda ]; then
  sizes=("4 256 2 8192" "12 768 6 50304" "20 1280 10 50304"); batches="1 4 16"; T=1024; dtypes="bf16 fp32"
else
  sizes=("2 128 1 8192" "4 256 2 8192" "6 384 3 8192"); batches="1 4 8"; T=256; dtypes="fp32"
fi
for dt in $dtypes; do for s in "${sizes[@]}"; do for b in $batches; do for ck in 0 1; do
  "$bin" "$dev" $s $b $T $ck $dt muon 2
done; done; done; done | tee /tmp/memory_grid.jsonl
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/memory_grid.jsonl") if l.startswith("{")]
errs = [abs(r["ratio"] - 1) for r in rows]
print(f"{len(rows)} points; predicted/measured from {min(r['ratio'] for r in rows):.3f} "
      f"to {max(r['ratio'] for r in rows):.3f}; within 15%: {sum(e <= 0.15 for e in errs)}/{len(rows)}")
PY
