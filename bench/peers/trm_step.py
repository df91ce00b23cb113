#!/usr/bin/env python3
"""The upstream TRM training step in PyTorch, eager or torch.compile'd: the
peer that Orchard's stage=trm is timed against (bench/RESULTS.md, issue 20).

The model is tests/reference/trm_reference.py's TinyRecursiveModel (written
from the paper's equations; Orchard's golden test checks both against each
other in float64). The loop is upstream's pretrain.py step as its paper and
README describe it: global_batch_size slots, each with its puzzle and carry;
every step draws a fresh batch and halted slots take from it (their carry
reset to H_init / L_init), one supervision step in bfloat16 (weights cast
at each use and states kept in bfloat16, as upstream: no autocast),
stable-max cross-entropy + 0.5 BCE(q_halt), backward, AdamATan2 on the
network (lr, weight decay, betas 0.9 / 0.95), SignSGD on the used puzzle
embedding rows, EMA of the weights; halting at halt_max_steps or q_halt > 0
with exploration 0.1. Upstream compiles the model (torch.compile): --compile
does the same to the step's forward and loss.

  python3 bench/peers/trm_step.py --data DIR [--compile] [--steps 60]
      [--warmup 15] [--batch 768] [--hidden 512] [--minutes M --eval N
      --eval-every STEPS] [--lr 1e-4] [--lr-warmup STEPS]

DIR is an `orchard data sudoku` folder (train.csv / test.csv in
Sudoku-Extreme's layout). Prints one JSON line: cells/s (global batch x 81
per step over the timed steps), s/step, peak memory. With --minutes it
trains that long instead (compilation included) and evaluates the raw and
the EMA weights (all halt_max_steps steps) on the first N held-out puzzles
at the end, printing exact accuracy ("exact_raw", "exact" for the EMA).
--eval-every STEPS also evaluates both every STEPS steps on the way, one
JSON line each ("eval": step, "elapsed_s": seconds since the loop began,
evaluations and compilation included, as Orchard's metrics.jsonl counts its
own), so that the two accuracy curves can be set side by side.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "reference"))
from trm_reference import TinyRecursiveModel, act_loss, swiglu_width  # noqa: E402


def read_csv(path, size=81):
    """Sudoku-Extreme CSV -> (inputs, labels) int64: pad 0, blank 1, digit d -> d + 1."""
    qs, ans = [], []
    with open(path) as f:
        next(f)
        for line in f:
            _, q, a, _ = line.rstrip("\n").split(",")
            qs.append([1 if ch == "." else int(ch) + 1 for ch in q])
            ans.append([int(ch) + 1 for ch in a])
    return torch.tensor(qs), torch.tensor(ans)


def trunc_normal(shape, std, device):
    t = torch.empty(shape, device=device)
    torch.nn.init.trunc_normal_(t, std=std, a=-2 * std, b=2 * std)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--batch", type=int, default=768)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--lr-warmup", type=int, default=0, help="steps of linear warmup (Orchard's lr_warmup_steps)")
    ap.add_argument("--minutes", type=float, default=0)
    ap.add_argument("--eval", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=0, help="with --minutes: evaluate every STEPS steps too")
    ap.add_argument("--trace", help="write a Chrome trace of one more step here")
    ap.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test of this script)")
    args = ap.parse_args()
    dev = args.device
    torch.manual_seed(0)
    c = dict(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, puzzle_emb_ndim=args.hidden,
             puzzle_emb_len=16, H_cycles=3, L_cycles=6, L_layers=2, hidden_size=args.hidden,
             num_heads=8, expansion=4.0, pos_encodings="none", mlp_t=True, causal=False,
             rms_norm_eps=1e-5, rope_theta=10000.0, halt_max_steps=16, halt_exploration_prob=0.1)
    shapes = TinyRecursiveModel(c, {}).shapes()
    w = {}
    for k, shape in shapes.items():
        std = 1.0 / math.sqrt(shape[-1])
        if k == "embed_tokens.weight":
            std = 1.0 / math.sqrt(c["hidden_size"])
        w[k] = trunc_normal(shape, std, dev)
    w["puzzle_emb"].zero_()
    w["q_head.weight"].zero_()
    w["q_head.bias"].fill_(-5.0)
    for v in w.values():
        v.requires_grad_(True)
    D = c["hidden_size"]
    buffers = {"H_init": trunc_normal((D,), 1.0, dev), "L_init": trunc_normal((D,), 1.0, dev)}
    model = TinyRecursiveModel(c, {**w, **buffers}, dev, forward_dtype=torch.bfloat16)
    ema = {k: v.detach().clone() for k, v in w.items()}
    n_params = sum(v.numel() for k, v in w.items() if k != "puzzle_emb")

    train_in, train_lab = (t.to(dev) for t in read_csv(os.path.join(args.data, "train.csv")))
    B, T = args.batch, model.T
    N = train_in.shape[0]

    def forward_loss(z_H, z_L, inputs, labels, ids):
        z_H, z_L, logits, q_halt, q_cont = model.step(z_H, z_L, inputs, ids)
        loss = act_loss(logits, q_halt, labels) / B
        with torch.no_grad():
            valid = labels != -100
            exact = ((logits.argmax(-1) == labels) | ~valid).all(-1)
        return loss, z_H, z_L, q_halt.detach(), exact

    step_fn = torch.compile(forward_loss) if args.compile else forward_loss

    net_keys = [k for k in w if k != "puzzle_emb"]
    m = {k: torch.zeros_like(w[k]) for k in net_keys}
    v2 = {k: torch.zeros_like(w[k]) for k in net_keys}
    b1, b2, wd, base_lr = 0.9, 0.95, 1.0, args.lr
    t = 0

    @torch.no_grad()
    def optimizer_step(ids):
        nonlocal t
        t += 1
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        lr = base_lr * min(1.0, t / args.lr_warmup) if args.lr_warmup > 0 else base_lr
        for k in net_keys:
            p, g = w[k], w[k].grad
            m[k].lerp_(g, 1 - b1)
            v2[k].mul_(b2).addcmul_(g, g, value=1 - b2)
            p.mul_(1 - lr * wd)
            p.sub_(lr * torch.atan2(m[k] / bc1, (v2[k] / bc2).sqrt()))
            p.grad = None
        pe = w["puzzle_emb"]
        rows = torch.unique(ids)
        pe[rows] = pe[rows] * (1 - lr * wd) - lr * torch.sign(pe.grad[rows])
        pe.grad = None
        if hasattr(torch, "_foreach_lerp_"):
            torch._foreach_lerp_(list(ema.values()), [w[k].detach() for k in ema], 1 - 0.999)
        else:  # PyTorch 1.x (a CPU smoke test)
            for k, e in ema.items():
                e.lerp_(w[k].detach(), 1 - 0.999)

    z_H, z_L = model.initial_carry(B)
    inputs = torch.zeros(B, 81, dtype=torch.long, device=dev)
    labels = torch.zeros(B, 81, dtype=torch.long, device=dev)
    ids = torch.zeros(B, dtype=torch.long, device=dev)
    steps = torch.zeros(B, dtype=torch.long, device=dev)
    halted = torch.ones(B, dtype=torch.bool, device=dev)
    H0, L0 = model.initial_carry(B)

    def one_step():
        nonlocal z_H, z_L, inputs, labels, steps, halted
        rows = torch.randint(0, N, (B,), device=dev)
        hb = halted.view(B, 1)
        inputs = torch.where(hb, train_in[rows], inputs)
        labels = torch.where(hb, train_lab[rows], labels)
        z_H = torch.where(hb.view(B, 1, 1), H0, z_H)
        z_L = torch.where(hb.view(B, 1, 1), L0, z_L)
        steps = torch.where(halted, 0, steps) + 1
        loss, z_H, z_L, q_halt, exact = step_fn(z_H, z_L, inputs, labels, ids)
        loss.backward()
        optimizer_step(ids)
        with torch.no_grad():
            h = (steps >= c["halt_max_steps"]) | (q_halt > 0)
            explore = torch.rand(B, device=dev) < c["halt_exploration_prob"]
            minimum = explore.long() * torch.randint(2, c["halt_max_steps"] + 1, (B,), device=dev)
            halted = h & (steps >= minimum)
        return loss

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    name = "torch.compile" if args.compile else "PyTorch eager"
    if args.minutes > 0:
        test_in, test_lab = (t_.to(dev)[: args.eval] for t_ in read_csv(os.path.join(args.data, "test.csv")))

        @torch.no_grad()
        def held_out():
            """(exact, cells) of the current weights, all halt_max_steps steps."""
            right = cells = 0
            for s in range(0, test_in.shape[0], B):
                x, y = test_in[s : s + B], test_lab[s : s + B]
                zh, zl = model.initial_carry(x.shape[0])
                i0 = torch.zeros(x.shape[0], dtype=torch.long, device=dev)
                for _ in range(c["halt_max_steps"]):
                    zh, zl, logits, _, _ = model.step(zh, zl, x, i0)
                hit = logits.argmax(-1) == y
                right += hit.all(-1).sum().item()
                cells += hit.sum().item()
            n = test_in.shape[0]
            return right / n, cells / (n * y.shape[1])

        def evaluate(step, elapsed):
            """Raw weights, then the EMA's (swapped in and back)."""
            exact_raw, cells_raw = held_out()
            raw = {k: w[k].detach().clone() for k in ema}
            for k in ema:
                w[k].data.copy_(ema[k])
            exact, cells = held_out()
            for k in ema:
                w[k].data.copy_(raw[k])
            return {"peer": name, "eval": step, "elapsed_s": round(elapsed, 1), "held_out": test_in.shape[0],
                    "exact": exact, "cells": round(cells, 4), "exact_raw": exact_raw, "cells_raw": round(cells_raw, 4)}

        start = time.time()
        done = 0
        while time.time() - start < args.minutes * 60:
            one_step()
            done += 1
            if args.eval_every > 0 and done % args.eval_every == 0:
                sync()
                print(json.dumps(evaluate(done, time.time() - start)), flush=True)
        sync()
        train_s = time.time() - start
        row = evaluate(done, train_s)
        print(json.dumps({"peer": name, "minutes": round(train_s / 60, 2), "steps": done,
                          "held_out": row["held_out"], "exact": row["exact"], "exact_raw": row["exact_raw"],
                          "cells": row["cells"], "cells_raw": row["cells_raw"],
                          "gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}))
        return
    for _ in range(args.warmup):
        one_step()
    sync()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.time()
    for _ in range(args.steps):
        loss = one_step()
    sync()
    dt = (time.time() - start) / args.steps
    if args.trace:
        with torch.profiler.profile() as prof:
            one_step()
            sync()
        prof.export_chrome_trace(args.trace)
    print(json.dumps({
        "peer": name, "batch": B, "hidden": D, "parameters": n_params, "steps": args.steps,
        "s_per_step": round(dt, 5), "cells_per_s": round(B * 81 / dt),
        "peak_memory_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if dev == "cuda" else None,
        "loss": round(loss.item(), 4), "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
