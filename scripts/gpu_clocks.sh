#!/usr/bin/env bash
# Runs a command while nvidia-smi samples every GPU's SM clock, power,
# temperature and utilization every 100 ms, then prints for each GPU the
# medians over the samples where it was busy (utilization >= 50 %) and the
# clock-limit reasons seen then. Two GPUs running one synchronous step go
# at the slower one's pace: this says whether one ran at lower clocks.
#   scripts/gpu_clocks.sh LABEL command [args...]
# CLOCKS_TO=FILE appends the summary there instead of printing it (for a
# command whose output goes to a log).
set -uo pipefail
label=$1; shift
log=$(mktemp)
nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 100 > "$log" 2>/dev/null &
sampler=$!
"$@"; rc=$?
kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
python3 - "$log" "$label" >> "${CLOCKS_TO:-/dev/stdout}" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        gpu, sm, watts, temp, util = int(f[0]), float(f[1]), float(f[2]), float(f[3]), float(f[4])
    except (ValueError, IndexError):
        continue
    if util >= 50:
        rows[gpu].append((sm, watts, temp, f[5] if len(f) > 5 else "?"))
for gpu in sorted(rows):
    r = rows[gpu]
    reasons = collections.Counter(x[3] for x in r).most_common(2)
    print(f"{sys.argv[2]}: GPU {gpu} busy {len(r)} samples, SM clock {statistics.median(x[0] for x in r):.0f} MHz "
          f"(min {min(x[0] for x in r):.0f}), power {statistics.median(x[1] for x in r):.0f} W, "
          f"{statistics.median(x[2] for x in r):.0f} C, limits {reasons}")
if not rows:
    print(f"{sys.argv[2]}: no busy GPU sampled")
PY
rm -f "$log"
exit $rc
