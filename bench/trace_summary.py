#!/usr/bin/env python3
"""Sum the GPU kernels of a Chrome trace (a Kineto trace written by
orchard_bench_lora_trace with ORCHARD_TRACE=FILE, or torch.profiler's
export_chrome_trace): kernel count, busy time, span, and the top kernels.
With --ops, the CPU ops of an autograd-profiler trace instead
(orchard_bench_train with ORCHARD_CPU_PROFILE=FILE): each op's self time,
its time less the ops it called, summed by name.

  trace_summary.py [--ops] TRACE.json[.gz] [TOP]
"""
import collections
import gzip
import json
import sys


def main(path, top):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
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
    # Where the GPU waited: the longest gaps between one kernel's end and
    # the next one's start, with the kernels on either side.
    kern.sort(key=lambda e: e["ts"])
    gaps, end, before = [], None, None
    for e in kern:
        if end is not None and e["ts"] > end:
            gaps.append((e["ts"] - end, before, e["name"]))
        if end is None or e["ts"] + e["dur"] > end:
            end, before = e["ts"] + e["dur"], e["name"]
    idle = sum(g for g, _, _ in gaps)
    print(f"  idle {idle / 1e3:.2f} ms in {len(gaps)} gaps; the longest:")
    for g, a, b in sorted(gaps, key=lambda t: -t[0])[:8]:
        print(f"    {g / 1e3:6.3f} ms after {a[:45]} | before {b[:45]}")


def ops(path, top):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    events = [e for e in events if e.get("ph") == "X" and "dur" in e]
    by = collections.defaultdict(lambda: [0, 0.0])
    total = 0.0
    for tid in {e.get("tid") for e in events}:
        # Per thread, an op's children are the events inside its interval.
        evs = sorted((e for e in events if e.get("tid") == tid),
                     key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, event, self time]
        def close(until):
            while stack and stack[-1][0] <= until:
                end, e, own = stack.pop()
                by[e["name"]][0] += 1
                by[e["name"]][1] += own
        for e in evs:
            close(e["ts"])
            if stack:
                stack[-1][2] -= e["dur"]
            else:
                total += e["dur"]
            stack.append([e["ts"] + e["dur"], e, e["dur"]])
        close(float("inf"))
    print(f"{len(events)} ops, {total / 1e3:.1f} ms at the top level")
    for name, (n, d) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {d / 1e3:8.2f} ms {100 * d / total:5.1f} % {n:6d}x  {name[:90]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    as_ops = bool(args) and args[0] == "--ops"
    if as_ops:
        args = args[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    (ops if as_ops else main)(args[0], int(args[1]) if len(args) > 1 else 25)
