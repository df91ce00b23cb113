#!/usr/bin/env python3
"""What moving a rank's half of the updated weights to the other GPU costs:
copy-engine peer copies (cudaMemcpyPeerAsync, as torch's cross-device
copy_ issues them) of N values in float32 and in bfloat16, one way and
both ways at once, between GPU 0 and GPU 1. Prints one JSON line a case.

  p2p_copy.py [VALUES]   (default 62,000,000: half of GPT d12's 124 M
                          non-embedding values)
"""
import json
import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 62_000_000
assert torch.cuda.device_count() >= 2, "needs two GPUs"
print(json.dumps({"peer_access": torch.cuda.can_device_access_peer(0, 1)}))
for dtype in (torch.float32, torch.bfloat16):
    a0 = torch.randn(n, device="cuda:0").to(dtype)
    a1 = torch.randn(n, device="cuda:1").to(dtype)
    b0, b1 = torch.empty_like(a0), torch.empty_like(a1)
    s0 = torch.cuda.Stream(device=0)
    s1 = torch.cuda.Stream(device=1)
    for both in (False, True):
        times = []
        for _ in range(12):
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(s1):  # GPU 1 pulls GPU 0's half
                start.record(s1)
                b1.copy_(a0, non_blocking=True)
            if both:  # and GPU 0 pulls GPU 1's at the same time
                with torch.cuda.stream(s0):
                    b0.copy_(a1, non_blocking=True)
            with torch.cuda.stream(s1):
                end.record(s1)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            times.append(start.elapsed_time(end))
        ms = sorted(times[2:])[len(times[2:]) // 2]
        mb = n * a0.element_size() / 1e6
        print(json.dumps({"dtype": str(dtype).replace("torch.", ""), "values": n,
                          "MB": round(mb, 1), "both_ways": both, "ms": round(ms, 3),
                          "GB_per_s": round(mb / ms, 1)}))
