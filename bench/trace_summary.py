#!/usr/bin/env python3
"""Sum the GPU kernels of a Chrome trace (a Kineto trace written by
orchard_bench_lora_trace with ORCHARD_TRACE=FILE, or torch.profiler's
export_chrome_trace): kernel count, busy time, span, and the top kernels.

  trace_summary.py TRACE.json[.gz] [TOP]
"""
import collections
import gzip
import json
import sys


def main(path, top):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        events = json.load(f)
    events = events.get("traceEvents", events)
    kern = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not kern:
        print("no GPU kernels in", path)
        return
    busy = sum(e["dur"] for e in kern)
    span = max(e["ts"] + e["dur"] for e in kern) - min(e["ts"] for e in kern)
    by = collections.defaultdict(lambda: [0, 0.0])
    for e in kern:
        name = e["name"]
        by[name][0] += 1
        by[name][1] += e["dur"]
    print(f"{len(kern)} kernels, GPU busy {busy / 1e3:.1f} ms of a {span / 1e3:.1f} ms span "
          f"({100 * busy / span:.0f} %)")
    for name, (n, d) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {d / 1e3:7.2f} ms {n:5d}x  {name[:110]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
