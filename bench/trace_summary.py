#!/usr/bin/env python3
"""Sum the GPU kernels of a Chrome trace (a Kineto trace written by
orchard_bench_lora_trace with ORCHARD_TRACE=FILE, or torch.profiler's
export_chrome_trace): kernel count, busy time, span, and the top kernels.
With --ops, the CPU ops of an autograd-profiler trace instead
(orchard_bench_train with ORCHARD_CPU_PROFILE=FILE): each op's self time,
its time less the ops it called, summed by name. With --streams, a trace
with several CUDA streams (a rank of a two-GPU run): each stream's
device, busy and NCCL time, the busiest stream's (the compute stream's)
gaps with what ran on the others meanwhile, and with --against ONE.json[.gz] (a
one-process trace) its kernels' time beside that trace's, by name, the
largest differences first.

  trace_summary.py [--ops] TRACE.json[.gz] [TOP]
  trace_summary.py --streams TRACE.json[.gz] [--against ONE.json[.gz]] [TOP]
"""
import collections
import gzip
import json
import sys


def gpu_events(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]


def stream_of(e):
    return e.get("args", {}).get("stream", e.get("tid"))


def by_name(kern):
    by = collections.defaultdict(lambda: [0, 0.0])
    for e in kern:
        by[e["name"][:100]][0] += 1
        by[e["name"][:100]][1] += e["dur"]
    return by


def streams(path, against, top):
    kern = gpu_events(path)
    per = collections.defaultdict(list)
    for e in kern:
        per[stream_of(e)].append(e)
    span = max(e["ts"] + e["dur"] for e in kern) - min(e["ts"] for e in kern)
    print(f"{len(kern)} kernels on {len(per)} streams, a {span / 1e3:.2f} ms span")
    for s, es in sorted(per.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        busy = sum(e["dur"] for e in es)
        nccl = sum(e["dur"] for e in es if "nccl" in e["name"].lower())
        devices = sorted({str(e.get("args", {}).get("device", "?")) for e in es})
        print(f"  stream {s} (device {','.join(devices)}): {len(es)} kernels, busy {busy / 1e3:.2f} ms, "
              f"NCCL {nccl / 1e3:.2f} ms")
    main_stream = max(per, key=lambda s: sum(e["dur"] for e in per[s]))
    comp = sorted(per[main_stream], key=lambda e: e["ts"])
    other = [e for e in kern if stream_of(e) != main_stream]
    gaps = [(b["ts"] - a["ts"] - a["dur"], a, b) for a, b in zip(comp, comp[1:])
            if b["ts"] - a["ts"] - a["dur"] > 0]
    print(f"stream {main_stream} idle {sum(g for g, _, _ in gaps) / 1e3:.2f} ms; by the gaps' length:")
    for lo, hi in ((0, 2), (2, 5), (5, 10), (10, 100), (100, float("inf"))):
        part = [g for g, _, _ in gaps if lo <= g < hi]
        print(f"  {lo}-{hi} us: {len(part)} gaps, {sum(part) / 1e3:.2f} ms")
    print("the longest gaps, and what ran on the other streams then (start after the gap "
          "began / length, ms):")
    for g, a, b in sorted(gaps, key=lambda t: -t[0])[:8]:
        t = a["ts"] + a["dur"]
        meanwhile = [f"{o['name'][:28]} {(o['ts'] - t) / 1e3:+.2f}/{o['dur'] / 1e3:.2f}"
                     for o in other if o["ts"] < b["ts"] and o["ts"] + o["dur"] > t]
        print(f"  {g / 1e3:6.3f} ms after {a['name'][:40]} | before {b['name'][:30]} | {meanwhile[:3]}")
    if not against:
        return
    one = gpu_events(against)
    one_per = collections.defaultdict(list)
    for e in one:
        one_per[stream_of(e)].append(e)
    one_main = max(one_per, key=lambda s: sum(e["dur"] for e in one_per[s]))
    a, b = by_name(one_per[one_main]), by_name(comp)
    total_a = sum(v[1] for v in a.values())
    total_b = sum(v[1] for v in b.values())
    print(f"compute stream busy: {total_b / 1e3:.2f} ms here, {total_a / 1e3:.2f} ms in {against}; "
          "by kernel (here - there):")
    rows = sorted(((b.get(n, [0, 0])[1] - a.get(n, [0, 0])[1], n) for n in set(a) | set(b)),
                  key=lambda r: -abs(r[0]))
    for d, n in rows[:top]:
        print(f"  {d / 1e3:+7.3f} ms  {a.get(n, [0, 0])[0]:5d}x -> {b.get(n, [0, 0])[0]:5d}x  {n[:80]}")


def main(path, top):
    kern = gpu_events(path)
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
    mode = args.pop(0) if args and args[0] in ("--ops", "--streams") else None
    against = None
    if "--against" in args:
        at = args.index("--against")
        against = args[at + 1] if at + 1 < len(args) else None
        del args[at:at + 2]
    if not args or (mode != "--streams" and against):
        print(__doc__)
        sys.exit(2)
    top = int(args[1]) if len(args) > 1 else 25
    if mode == "--ops":
        ops(args[0], top)
    elif mode == "--streams":
        streams(args[0], against, top)
    else:
        main(args[0], top)
