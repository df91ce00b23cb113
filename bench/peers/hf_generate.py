#!/usr/bin/env python3
"""The peer of bench/decode.cpp: transformers' generate on the same folder.

  hf_generate.py DIR PROMPT NEW [static]

Greedy, batch 1, bfloat16, the same random prompt tokens as
orchard_bench_decode. Decode tokens/s = (NEW - 1) / (t(NEW) - t(1)): the
time of generate with NEW new tokens minus that of generate with one (the
prefill), each the best of 3 after warm-up. `static` adds transformers'
fastest documented form: a static cache, with which generate compiles
the forward by torch.compile (mode="reduce-overhead", CUDA graphs).
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def timed(model, ids, new, **kw):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def best(model, ids, new, runs=3, **kw):
    return min(timed(model, ids, new, **kw)[0] for _ in range(runs))


def main():
    d, p, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    forms = ["dynamic"] + (["static"] if len(sys.argv) > 4 and sys.argv[4] == "static" else [])
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    v = model.config.vocab_size
    ids = torch.tensor([[(i * 7919) % v for i in range(p)]], device="cuda")
    model.generation_config.pad_token_id = model.generation_config.eos_token_id
    for form in forms:
        kw = {}
        if form == "static":
            # transformers compiles the forward itself for a static cache
            # (generation_config.compile_config: torch.compile with
            # mode="reduce-overhead", fullgraph=True). Compiling
            # model.forward by hand as well fails in transformers 5 with
            # "accessing tensor output of CUDAGraphs that has been
            # overwritten" (2026-11-24).
            kw["cache_implementation"] = "static"
        t = time.perf_counter()
        for new in (n, 1):  # warm-up (and compilation)
            timed(model, ids, new, **kw)
        warm = time.perf_counter() - t
        with torch.inference_mode():
            tn = best(model, ids, n, **kw)
            t1 = best(model, ids, 1, **kw)
        print(f"transformers generate ({form} cache{', torch.compile' if form == 'static' else ''}): "
              f"decode {(n - 1) / (tn - t1):.1f} tok/s, prefill {p / t1:.0f} tok/s "
              f"(warm-up {warm:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
