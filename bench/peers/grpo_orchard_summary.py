"""One JSON line from an Orchard GRPO run's metrics.jsonl, as grpo_trl.py
prints TRL's: median s/step over the steps after the first two, the share
of those steps spent generating (generation_s), the allocator's peak.

  grpo_orchard_summary.py RUN_DIR KIND G C
"""
import json
import statistics
import sys

run, kind, G, C = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
steps = [r for r in rows if "loss" in r and "elapsed_s" in r]
per, gen = [], []
for a, b in zip(steps, steps[1:]):
    per.append(b["elapsed_s"] - a["elapsed_s"])
    gen.append(b.get("generation_s", 0.0))
per, gen = per[1:], gen[1:]
print(json.dumps({"peer": "orchard", "kind": kind, "G": G, "C": C, "steps": len(steps),
                  "s_per_step": statistics.median(per),
                  "generation_share": sum(gen) / sum(per),
                  "peak_gb": max(r.get("peak_memory_mb", 0) for r in steps) / 1e3,
                  "mean_completion_length": steps[-1].get("completions/mean_length")}))
