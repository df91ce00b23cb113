#!/usr/bin/env python3
"""An independent PyTorch reference for Orchard's tiny recursive model
(src/models/trm.{h,cpp}), its ACT loss (src/stages/trm/recursion.cpp) and
its optimizers (AdamATan2 for the network, SignSGD for the puzzle
embeddings): it writes the fixtures that tests/golden/trm_reference_test.cpp
checks Orchard against.

Written from the equations of the paper (Jolicoeur-Martineau, "Less is
More: Recursive Reasoning with Tiny Networks", 2025) and the upstream
repository's model description (SamsungSAILMontreal/TinyRecursiveModels),
not from either's code. bench/peers/trm_step.py imports TinyRecursiveModel
from here to time the upstream training step on the GPU.

Rerun (anywhere PyTorch 2.x and the safetensors package are installed; CPU
float64, deterministic; a few seconds):

  python3 tests/reference/trm_reference.py tests/fixtures/trm_reference

For each variant in VARIANTS it writes OUT_DIR/<variant>.model.safetensors
(the initial weights under Orchard's keys, random everywhere, puzzle
embeddings and Q-head included, so that every path carries gradient) and
OUT_DIR/<variant>.reference.safetensors:
  inputs, labels, puzzle_ids   (B, S), (B, S) with some -100, (B)
  step<k>.loss                 () of supervision step k = 0, 1, 2: the mean
                               over the B puzzles of (mean stable-max
                               cross-entropy over labelled cells + 0.5 BCE
                               of q_halt against "every cell right")
  step0.logits, step0.q_halt, step0.q_continue, step0.z_H, step0.z_L
  grad.<key>                   the gradient of step0.loss for every weight
  final.<key>                  every weight after the three steps, each
                               followed by one optimizer update
and, in the metadata under "config", the model's sizes and the optimizer
settings as JSON. Each supervision step starts from the previous one's
detached carry (the first from H_init / L_init), as ACT training does while
no puzzle halts.

The model (Dimension letters: B puzzles, S cells, P puzzle-embedding
positions, T = P + S, D width, V vocabulary):
  x = sqrt(D) * [puzzle_emb(id) zero-padded to P*D, viewed (P, D) ;
                 embed_tokens(inputs)]; with learned positions the
      bracket is first averaged with them: (e + pos) / sqrt(2)
  net(h, inj): h = h + inj, then each of L_layers post-norm blocks:
      h = norm(h + mix(h)); h = norm(h + SwiGLU(h))
      norm(h) = h / sqrt(mean(h^2) + 1e-5), no scale
      mix = attention (qkv in one matrix, rotary on (x[:d/2], x[d/2:])
            halves with float32-rounded tables, or none) or, with mlp_t,
            a SwiGLU over the T positions (the norm then over positions)
      SwiGLU(h) = down(silu(gate) * up), [gate, up] = gate_up(h); its
            width round(2/3 * expansion * in) rounded up to 256
  one supervision step from (z_H, z_L):
      H_cycles times: L_cycles times z_L = net(z_L, z_H + x)
                      z_H = net(z_H, z_L)
      every cycle but the last without gradients;
      logits = lm_head(z_H)[P:], (q_halt, q_continue) = q_head(z_H[0])
Stable-max: s(x) = 1 / (1 - x + 1e-30) for x < 0, x + 1 otherwise;
log p = log(s / sum s), in float64.

The optimizers: AdamATan2 (p <- p (1 - lr wd) - lr atan2(m / (1 - b1^t),
sqrt(v / (1 - b2^t))), moments as Adam's) on every weight but the puzzle
embeddings; SignSGD on the puzzle embeddings' rows that the batch used
(p <- p (1 - lr wd) - lr sign(g) on those rows only).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

IGNORE = -100
Q_LOSS_WEIGHT = 0.5
STABLEMAX_EPS = 1e-30

# Three small models: the Sudoku variant (mlp_t, no positions, a puzzle
# prefix of two positions with zero padding), attention with rotary
# positions and a one-position prefix, and attention with learned
# positions and no prefix.
BASE = dict(
    seq_len=6,
    vocab_size=5,
    num_puzzle_identifiers=4,
    H_cycles=2,
    L_cycles=2,
    L_layers=2,
    hidden_size=16,
    num_heads=2,
    expansion=2.0,
    causal=False,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    halt_max_steps=4,
    halt_exploration_prob=0.0,
    no_ACT_continue=True,
)
VARIANTS = {
    "mlp_t": dict(BASE, mlp_t=True, pos_encodings="none", puzzle_emb_ndim=24, puzzle_emb_len=0),
    "rope": dict(BASE, mlp_t=False, pos_encodings="rope", puzzle_emb_ndim=16, puzzle_emb_len=1),
    "learned": dict(BASE, mlp_t=False, pos_encodings="learned", puzzle_emb_ndim=0, puzzle_emb_len=0),
}
B = 3
STEPS = 3
SEED = 20
OPTIM = dict(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, puzzle_emb_lr=0.05, puzzle_emb_weight_decay=0.1)


def prefix_len(c):
    if c["puzzle_emb_ndim"] <= 0:
        return 0
    if c["puzzle_emb_len"] > 0:
        return c["puzzle_emb_len"]
    return -(-c["puzzle_emb_ndim"] // c["hidden_size"])


def swiglu_width(h, expansion):
    w = round(expansion * h * 2 / 3)
    return -(-w // 256) * 256


def norm(x, eps):
    f = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    return (f * torch.rsqrt(f.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


def linear(x, weight, bias=None):
    """x @ weight^T in x's dtype (weights cast as upstream's CastedLinear)."""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


def swiglu(w, prefix, x):
    gate, up = linear(x, w[prefix + "gate_up_proj.weight"]).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, w[prefix + "down_proj.weight"])


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_tables(c):
    """(T, d) cos and sin, computed in float64 and rounded to float32."""
    d = c["hidden_size"] // c["num_heads"]
    T = prefix_len(c) + c["seq_len"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    f = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    e = torch.cat((f, f), dim=-1)
    return e.cos().float(), e.sin().float()


class TinyRecursiveModel:
    """The model as a function of a dict of weights (Orchard's key names).
    forward_dtype (default: the weights') is what the states and products
    are computed in; bench/peers/trm_step.py passes bfloat16, as upstream
    runs on the GPU (weights cast at each use, no autocast)."""

    def __init__(self, c, weights, device="cpu", forward_dtype=None):
        self.c = c
        self.w = weights
        self.dt = forward_dtype
        self.P = prefix_len(c)
        self.T = self.P + c["seq_len"]
        self.tables = None
        if c["pos_encodings"] == "rope" and not c["mlp_t"]:
            cos, sin = rope_tables(c)
            self.tables = (cos.to(device), sin.to(device))

    def shapes(self):
        c, D, V = self.c, self.c["hidden_size"], self.c["vocab_size"]
        s = {"embed_tokens.weight": (V, D)}
        if c["pos_encodings"] == "learned":
            s["embed_pos.weight"] = (self.T, D)
        if c["puzzle_emb_ndim"] > 0:
            s["puzzle_emb"] = (c["num_puzzle_identifiers"], c["puzzle_emb_ndim"])
        s["lm_head.weight"] = (V, D)
        s["q_head.weight"] = (2, D)
        s["q_head.bias"] = (2,)
        inner = swiglu_width(D, c["expansion"])
        for i in range(c["L_layers"]):
            p = f"L_level.{i}."
            if c["mlp_t"]:
                it = swiglu_width(self.T, c["expansion"])
                s[p + "mlp_t.gate_up_proj.weight"] = (2 * it, self.T)
                s[p + "mlp_t.down_proj.weight"] = (self.T, it)
            else:
                s[p + "self_attn.qkv_proj.weight"] = (3 * D, D)
                s[p + "self_attn.o_proj.weight"] = (D, D)
            s[p + "mlp.gate_up_proj.weight"] = (2 * inner, D)
            s[p + "mlp.down_proj.weight"] = (D, inner)
        return s

    def attention(self, prefix, h):
        c, w = self.c, self.w
        Bn, T, D = h.shape
        H = c["num_heads"]
        d = D // H
        qkv = linear(h, w[prefix + "qkv_proj.weight"]).view(Bn, T, 3 * H, d)
        q, k, v = qkv[:, :, :H], qkv[:, :, H : 2 * H], qkv[:, :, 2 * H :]
        if self.tables is not None:
            cos, sin = (t[:, None, :] for t in self.tables)
            work = torch.promote_types(q.dtype, torch.float32)
            q = (q.to(work) * cos + rotate_half(q.to(work)) * sin).to(q.dtype)
            k = (k.to(work) * cos + rotate_half(k.to(work)) * sin).to(k.dtype)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if c["causal"]:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1), float("-inf"))
        work = torch.promote_types(scores.dtype, torch.float32)
        y = torch.softmax(scores.to(work), dim=-1).to(v.dtype) @ v
        return linear(y.transpose(1, 2).reshape(Bn, T, D), w[prefix + "o_proj.weight"])

    def block(self, i, h):
        c, eps = self.c, self.c["rms_norm_eps"]
        p = f"L_level.{i}."
        if c["mlp_t"]:
            t = h.transpose(1, 2)
            h = norm(t + swiglu(self.w, p + "mlp_t.", t), eps).transpose(1, 2)
        else:
            h = norm(h + self.attention(p + "self_attn.", h), eps)
        return norm(h + swiglu(self.w, p + "mlp.", h), eps)

    def net(self, h, injection):
        h = h + injection
        for i in range(self.c["L_layers"]):
            h = self.block(i, h)
        return h

    def input_embeddings(self, inputs, puzzle_ids):
        c, w, D = self.c, self.w, self.c["hidden_size"]
        dt = self.dt or w["embed_tokens.weight"].dtype
        e = F.embedding(inputs, w["embed_tokens.weight"].to(dt))
        if self.P > 0:
            pe = w["puzzle_emb"][puzzle_ids]
            pad = self.P * D - pe.shape[1]
            if pad > 0:
                pe = F.pad(pe, (0, pad))
            e = torch.cat((pe.view(-1, self.P, D).to(e.dtype), e), dim=1)
        if c["pos_encodings"] == "learned":
            e = 0.707106781 * (e + w["embed_pos.weight"].to(dt))
        return math.sqrt(D) * e

    def initial_carry(self, n):
        D, dt = self.c["hidden_size"], self.dt or self.w["H_init"].dtype
        return (
            self.w["H_init"].to(dt).view(1, 1, D).expand(n, self.T, D).clone(),
            self.w["L_init"].to(dt).view(1, 1, D).expand(n, self.T, D).clone(),
        )

    def step(self, z_H, z_L, inputs, puzzle_ids):
        c = self.c
        x = self.input_embeddings(inputs, puzzle_ids)
        with torch.no_grad():
            for _ in range(c["H_cycles"] - 1):
                for _ in range(c["L_cycles"]):
                    z_L = self.net(z_L, z_H + x)
                z_H = self.net(z_H, z_L)
        for _ in range(c["L_cycles"]):
            z_L = self.net(z_L, z_H + x)
        z_H = self.net(z_H, z_L)
        logits = linear(z_H, self.w["lm_head.weight"])[:, self.P :]
        q = linear(z_H[:, 0], self.w["q_head.weight"], self.w["q_head.bias"])
        q = q.to(torch.promote_types(q.dtype, torch.float32))
        return z_H.detach(), z_L.detach(), logits, q[..., 0], q[..., 1]


def stablemax_cross_entropy(logits, labels):
    x = logits.to(torch.float64)
    s = torch.where(x < 0, 1 / (1 - x + STABLEMAX_EPS), x + 1)
    logp = torch.log(s / s.sum(-1, keepdim=True))
    valid = labels != IGNORE
    picked = logp.gather(-1, torch.where(valid, labels, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, -picked, torch.zeros_like(picked))


def act_loss(logits, q_halt, labels):
    """The step's loss summed over puzzles (divide by their number)."""
    valid = labels != IGNORE
    counts = valid.sum(-1)
    lm = stablemax_cross_entropy(logits, labels).sum(-1) / counts.clamp_min(1)
    with torch.no_grad():
        right = (valid & (logits.argmax(-1) == labels)).sum(-1) == counts
    q = F.binary_cross_entropy_with_logits(q_halt, right.to(q_halt.dtype), reduction="sum")
    return lm.sum() + Q_LOSS_WEIGHT * q


class Optimizers:
    """AdamATan2 on the network, SignSGD on the puzzle embeddings."""

    def __init__(self, weights, o):
        self.w, self.o = weights, o
        self.t = 0
        self.m = {k: torch.zeros_like(v) for k, v in weights.items() if k != "puzzle_emb"}
        self.v = {k: torch.zeros_like(v) for k, v in self.m.items()}

    @torch.no_grad()
    def step(self, used_ids):
        o = self.o
        self.t += 1
        b1, b2, lr = o["beta1"], o["beta2"], o["lr"]
        for k, m in self.m.items():
            p, g = self.w[k], self.w[k].grad
            m.mul_(b1).add_(g, alpha=1 - b1)
            self.v[k].mul_(b2).addcmul_(g, g, value=1 - b2)
            mh = m / (1 - b1**self.t)
            vh = self.v[k] / (1 - b2**self.t)
            p.mul_(1 - lr * o["weight_decay"])
            p.sub_(lr * torch.atan2(mh, vh.sqrt()))
        if "puzzle_emb" in self.w:
            p = self.w["puzzle_emb"]
            rows = torch.unique(used_ids)
            lr = o["puzzle_emb_lr"]
            p[rows] = p[rows] * (1 - lr * o["puzzle_emb_weight_decay"]) - lr * torch.sign(p.grad[rows])
        for p in self.w.values():
            p.grad = None


def trunc_normal(shape, std, gen, dtype):
    t = torch.randn(shape, generator=gen, dtype=dtype) * std
    return t.clamp(-2 * std, 2 * std)


def make_variant(name, c, out):
    gen = torch.Generator().manual_seed(SEED + len(name))
    dt = torch.float64
    model = TinyRecursiveModel(c, {})
    w = {}
    for k, shape in model.shapes().items():
        fan_in = shape[-1]
        std = 1.0 / math.sqrt(fan_in)
        if k in ("embed_tokens.weight", "embed_pos.weight"):
            std = 1.0 / math.sqrt(c["hidden_size"])
        if k == "puzzle_emb":
            std = 0.5
        w[k] = trunc_normal(shape, std, gen, dt)
    w["q_head.bias"] = torch.tensor([-1.0, 0.5], dtype=dt)
    D = c["hidden_size"]
    buffers = {"H_init": trunc_normal((D,), 1.0, gen, dt), "L_init": trunc_normal((D,), 1.0, gen, dt)}
    initial = {k: v.clone() for k, v in {**w, **buffers}.items()}
    for v in w.values():
        v.requires_grad_(True)
    model = TinyRecursiveModel(c, {**w, **buffers})

    S, V = c["seq_len"], c["vocab_size"]
    inputs = torch.randint(0, V, (B, S), generator=gen)
    labels = torch.randint(1, V, (B, S), generator=gen)
    labels[0, 1] = IGNORE
    labels[2, :2] = IGNORE
    ids = torch.tensor([1, 3, 1]) % c["num_puzzle_identifiers"]
    # One puzzle's labels equal the model's first answer below would make
    # "every cell right" true for it; random labels leave it false, which
    # the loss's BCE term covers as well.
    opt = Optimizers(w, OPTIM)
    ref = {"inputs": inputs, "labels": labels, "puzzle_ids": ids}
    z_H, z_L = model.initial_carry(B)
    for k in range(STEPS):
        z_H, z_L, logits, q_halt, q_cont = model.step(z_H, z_L, inputs, ids)
        loss = act_loss(logits, q_halt, labels) / B
        loss.backward()
        ref[f"step{k}.loss"] = loss.detach()
        if k == 0:
            ref.update({
                "step0.logits": logits.detach(),
                "step0.q_halt": q_halt.detach(),
                "step0.q_continue": q_cont.detach(),
                "step0.z_H": z_H,
                "step0.z_L": z_L,
            })
            for key, p in w.items():
                ref["grad." + key] = p.grad.detach().clone()
        opt.step(ids)
    for key, p in w.items():
        ref["final." + key] = p.detach().clone()
    meta = {"config": json.dumps({"model": c, "optim": OPTIM, "steps": STEPS}, sort_keys=True)}
    from safetensors.torch import save_file

    def contiguous(d):
        return {k: v.contiguous() for k, v in d.items()}

    save_file(contiguous(initial), os.path.join(out, f"{name}.model.safetensors"), meta)
    save_file(contiguous(ref), os.path.join(out, f"{name}.reference.safetensors"), meta)
    print(f"{name}: losses " + ", ".join(f"{ref[f'step{k}.loss'].item():.12f}" for k in range(STEPS)))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name, c in VARIANTS.items():
        make_variant(name, c, out)


if __name__ == "__main__":
    main()
