"""The peer of bench/train_step.cpp: the same GPT (rotary, QK RMS-norm,
parameterless RMSNorm, ReLU^2 MLP, untied lm_head, logit soft-cap 15, no
biases) in PyTorch, timed the same way: forward, backward and an optimizer
step on random tokens, median of the steps after 3 warm-up steps.

  python3 gpt_train_step.py DEVICE DEPTH WIDTH HEADS VOCAB BATCH SEQ STEPS [eager|compile] [fp32|bf16] [adamw|muon]

adamw: torch.optim.AdamW over every weight (fused=True on CUDA with
PyTorch 2.x, its fastest form). muon: as orchard_bench_train's muon and
modded-nanogpt: the blocks' matrices by Muon (Nesterov momentum 0.95,
five quintic Newton-Schulz iterations in bfloat16, torch.compile'd in
compile mode, lr scaled by sqrt(max(1, rows / cols))), the rest by AdamW.

Under torchrun (WORLD_SIZE > 1) it is PyTorch DDP: one process per GPU
(cuda:LOCAL_RANK, NCCL; gloo on the CPU), each on its own BATCH x SEQ
tokens, gradients averaged by DDP's reducer (buckets overlapped with the
backward); tokens/s counts every rank's tokens (rank 0 prints):

  torchrun --nproc-per-node 2 gpt_train_step.py cuda 12 768 6 50304 16 1024 30 compile bf16

DDP_HOOK=bf16: DDP sends the gradients in bfloat16 (its
bf16_compress_hook: each bucket cast down, all-reduced, cast back), what
`orchard train grad_reduce_dtype=bfloat16` does.

PEER_ACCUM=N: N micro-steps of BATCH x SEQ a step (gradient accumulation,
1 by default); under DDP the first N-1 run in `no_sync()`, so the buckets
are averaged once, during the last backward, as Orchard does with
total_batch_size = N x BATCH x SEQ x processes.

PEER_TRACE=FILE: after timing, one more step under torch.profiler written
to FILE as a Chrome trace (bench/trace_summary.py sums its kernels).
"""
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def rotary(x, cos, sin):
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], -1)


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H, s.D = H, C // H
        s.c_q, s.c_k, s.c_v, s.c_proj = (nn.Linear(C, C, bias=False) for _ in range(4))
        s.c_fc, s.m_proj = nn.Linear(C, 4 * C, bias=False), nn.Linear(4 * C, C, bias=False)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        h = norm(x)
        q = norm(rotary(s.c_q(h).view(B, T, s.H, s.D), cos, sin)).transpose(1, 2)
        k = norm(rotary(s.c_k(h).view(B, T, s.H, s.D), cos, sin)).transpose(1, 2)
        v = s.c_v(h).view(B, T, s.H, s.D).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x: the explicit causal softmax, as Orchard on 1.13
            att = (q @ k.transpose(-2, -1)) / (s.D ** 0.5)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(att.float().masked_fill(mask, float("-inf")), -1).to(v.dtype) @ v
        x = x + s.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.m_proj(F.relu(s.c_fc(norm(x))).square())


def newton_schulz(g, steps=5):
    # Keller Jordan's quintic iteration (modded-nanogpt), coefficients from there.
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.mT if tall else x


class Muon(torch.optim.Optimizer):
    def __init__(s, params, lr=0.02, momentum=0.95, compiled=False):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        s.ns = torch.compile(newton_schulz) if compiled else newton_schulz

    @torch.no_grad()
    def step(s):
        for group in s.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = s.state[p]
                if "buf" not in st:
                    st["buf"] = torch.zeros_like(p.grad)
                buf = st["buf"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                u = s.ns(p.grad.lerp(buf, group["momentum"]))
                p.add_(u.to(p.dtype), alpha=-group["lr"] * max(1, p.size(-2) / p.size(-1)) ** 0.5)


class GPT(nn.Module):
    def __init__(s, L, C, H, V, T):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        s.lm_head = nn.Linear(C, V, bias=False)
        D = C // H
        inv = 10000.0 ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        s.register_buffer("cos", ang.cos().float()[None, :, None, :])
        s.register_buffer("sin", ang.sin().float()[None, :, None, :])

    def forward(s, idx, targets):
        x = norm(s.wte(idx))
        for b in s.blocks:
            x = b(x, s.cos, s.sin)
        logits = s.lm_head(norm(x)).float()
        logits = 15 * torch.tanh(logits / 15)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    dev, L, C, H, V, B, T, steps = sys.argv[1], *map(int, sys.argv[2:9])
    mode = sys.argv[9] if len(sys.argv) > 9 else "eager"
    prec = sys.argv[10] if len(sys.argv) > 10 else "fp32"
    optim = sys.argv[11] if len(sys.argv) > 11 else "adamw"
    torch.backends.cuda.matmul.allow_tf32 = False
    # As Orchard does: every core, shared among a node's processes.
    torch.set_num_threads(max(1, os.cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        if dev.startswith("cuda"):
            dev = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.startswith("cuda") else "gloo")
    torch.manual_seed(0)
    model = GPT(L, C, H, V, T).to(dev)
    fused = {"fused": True} if dev.startswith("cuda") and torch.__version__ >= "2" else {}
    if optim == "muon":
        matrices = [p for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2]
        rest = [p for n, p in model.named_parameters() if not (n.startswith("blocks.") and p.dim() == 2)]
        opts = [torch.optim.AdamW(rest, lr=1e-3, weight_decay=0.0, **fused),
                Muon(matrices, compiled=mode == "compile")]
    else:
        opts = [torch.optim.AdamW(model.parameters(), lr=1e-3, **fused)]
    if world > 1:
        model = DDP(model, device_ids=[torch.device(dev).index] if dev.startswith("cuda") else None)
        if os.environ.get("DDP_HOOK") == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    step_fn = torch.compile(model) if mode == "compile" else model
    torch.manual_seed(rank + 1)  # each rank its own tokens
    x = torch.randint(0, V, (B, T), device=dev)
    y = torch.randint(0, V, (B, T), device=dev)
    accum = os.environ.get("PEER_ACCUM", "1")
    if not accum.isdigit() or int(accum) < 1:
        sys.exit(f"PEER_ACCUM={accum!r}: the micro-steps a step must be a whole number >= 1")
    accum = int(accum)
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    def micro_step():
        if prec == "bf16":
            with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16):
                loss = step_fn(x, y)
        else:
            loss = step_fn(x, y)
        (loss / accum).backward()

    def train_step():
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        for m in range(accum):
            if world > 1 and m < accum - 1:
                with model.no_sync():  # DDP averages on the last backward only
                    micro_step()
            else:
                micro_step()
        for opt in opts:
            opt.step()

    times = []
    for s in range(steps + 3):
        sync()
        t0 = time.perf_counter()
        train_step()
        sync()
        if s >= 3:
            times.append(time.perf_counter() - t0)
    trace = os.environ.get("PEER_TRACE")
    if trace and rank == 0:  # one more step under torch.profiler, as Chrome JSON
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            train_step()
            sync()
        prof.export_chrome_trace(trace)
    times.sort()
    med = times[len(times) // 2]
    # CUDA: the allocator's peak; CPU: the process's peak RSS (as Orchard's
    # bench reports), which includes the Python interpreter and torch import.
    peak = (torch.cuda.max_memory_allocated() if dev.startswith("cuda")
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1e3) / 1e6
    n = sum(p.numel() for p in model.parameters())
    if rank == 0:
        ddp = f" DDP x{world}" if world > 1 else ""
        if world > 1 and os.environ.get("DDP_HOOK") == "bf16":
            ddp += " (bf16_compress_hook)"
        acc = f" accum {accum}" if accum > 1 else ""
        print(f"pytorch {mode} {prec} {optim}{ddp} d{L} w{C} vocab {V} batch {B}x{T}{acc}: {world * accum * B * T / med:.0f} tokens/s "
              f"(median {med:.4f} s/step), peak {peak:.0f} MB, {n} params")


if __name__ == "__main__":
    main()
