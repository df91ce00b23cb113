#!/usr/bin/env python3
"""An independent PyTorch reference for Orchard's native GPT and its
optimizers, in the habit of llm.c's test_gpt2: it writes the fixtures that
tests/golden/gpt_reference_test.cpp checks Orchard against (logits, loss,
every gradient, and the weights after 10 optimizer steps).

Rerun (anywhere PyTorch 2.x and the safetensors package are installed; CPU
float64, deterministic; a few seconds):

  python3 tests/reference/gpt_reference.py tests/fixtures/gpt_reference

It writes OUT_DIR/model.safetensors (the initial weights under Orchard's
checkpoint keys) and OUT_DIR/reference.safetensors:
  input_ids, targets        (B, T) int64; a few targets are -1 (ignored)
  logits                    (B, T, V) soft-capped
  loss                      () mean cross-entropy over targets != -1
  grad.<key>                the gradient of the loss for every weight
  <run>.<key>               every weight after STEPS optimizer steps
  <run>.losses              (STEPS,) the loss before each step
  lr_multipliers            (STEPS,) the lr multiplier of each step
for the runs
  adamw        AdamW on every group
  muon         Muon (Newton-Schulz in float64) on the blocks' matrices,
               AdamW on wte and lm_head
  muon_ns_fp32 the same with Newton-Schulz in float32, as Orchard runs it
               when it trains in float32
and, in the file's metadata under "config", a JSON object with the model's
sizes and every optimizer setting (the C++ test reads them from there).

The model, written from the math of src/models/gpt.{h,cpp} (not from any
other project): token embedding, RMSNorm without weights (eps the dtype's
machine epsilon), rotary embeddings on the pairs (x[:D/2], x[D/2:]) with
tables computed in float64 and stored in float32 (as Orchard stores them),
QK-norm after the rotation, causal grouped-query attention (query head h
reads key/value head h // (H / Hkv)), ReLU^2 MLP, no biases, pre-norm
residual blocks, a final RMSNorm, an untied lm_head and logits soft-capped
at 15 (cap * tanh(logits / cap)).

The optimizers, from src/train/optimizer.{h,cpp} and the papers they cite:
AdamW (Loshchilov & Hutter) with bias-corrected moments and decoupled
weight decay p *= 1 - lr * wd; Muon (Keller Jordan's write-up) with
momentum warmed up linearly over `muon_momentum_warmup` steps, Nesterov
(the update is (1 - m) g + m buf after buf = m buf + (1 - m) g), a quintic
Newton-Schulz with coefficients (3.4445, -4.7750, 2.0315) iterated on the
wide orientation after dividing by (Frobenius norm + 1e-7), the update
scaled by sqrt(max(1, rows / cols)), and decoupled weight decay. Every
group's lr is multiplied by the step's lr multiplier.

Dimension letters: B batch, T sequence, C width, H heads, Hkv key/value
heads, D head dim, V vocabulary, L layers.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

DT = torch.float64

# The model: small enough that the fixtures stay under 2 MB, large enough to
# have grouped-query attention (2 query heads per kv head), a tall matrix
# (mlp.c_fc, 128 x 32), wide ones (attn.c_k, mlp.c_proj) and square ones.
CONFIG = dict(
    vocab_size=97,
    n_layer=2,
    n_embd=32,
    n_head=4,
    n_kv_head=2,
    max_seq_len=16,
    rope_base=10000.0,
    softcap=15.0,
)
B, T = 2, 16
SEED = 1234
STEPS = 10

# Optimizer settings. Every group gets its own lr and a nonzero weight
# decay, so a group's settings applied to another would show. Muon's
# warmup is short so that the clamp at 1 is reached within the 10 steps.
OPTIM = dict(
    adam_beta1=0.8,
    adam_beta2=0.95,
    adam_eps=1e-10,
    muon_momentum=0.95,
    muon_momentum_start=0.85,
    muon_momentum_warmup=4,
    newton_schulz_steps=5,
    groups=dict(
        matrices=dict(lr_adamw=0.01, lr_muon=0.02, weight_decay=0.1),
        embedding=dict(lr=0.05, weight_decay=0.01),
        lm_head=dict(lr=0.004, weight_decay=0.02),
    ),
)
NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Muon write-up's quintic
NS_EPS = 1e-7  # as Orchard: keeps the first normalisation finite


def lr_multiplier(step):
    """A decaying multiplier, so that applying it (or not) shows."""
    return 1.0 - 0.05 * step


# --- model -------------------------------------------------------------------


def param_shapes(c):
    C, V = c["n_embd"], c["vocab_size"]
    D = C // c["n_head"]
    kv = c["n_kv_head"] * D
    shapes = {"wte.weight": (V, C)}
    for i in range(c["n_layer"]):
        p = f"blocks.{i}."
        shapes[p + "attn.c_q.weight"] = (c["n_head"] * D, C)
        shapes[p + "attn.c_k.weight"] = (kv, C)
        shapes[p + "attn.c_v.weight"] = (kv, C)
        shapes[p + "attn.c_proj.weight"] = (C, C)
        shapes[p + "mlp.c_fc.weight"] = (4 * C, C)
        shapes[p + "mlp.c_proj.weight"] = (C, 4 * C)
    shapes["lm_head.weight"] = (V, C)
    return shapes


def random_weights(c, gen):
    """Every weight random and nonzero (Orchard starts c_proj and lm_head at
    zero, which would leave paths without gradient). lm_head is scaled so
    that logits reach about +-10 and the soft-cap bends them."""
    w = {}
    for name, shape in param_shapes(c).items():
        fan_in = shape[1]
        std = 1.0 if name == "wte.weight" else 1.0 / math.sqrt(fan_in)
        if name == "lm_head.weight":
            std = 4.0 / math.sqrt(fan_in)
        w[name] = torch.randn(shape, generator=gen, dtype=DT) * std
    return w


def rms_norm(x):
    eps = torch.finfo(x.dtype).eps
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


def rotary_tables(c, T):
    """cos, sin of angle(t, i) = t * base^(-2i / D), (T, D/2); computed in
    float64 and rounded to float32, as Orchard keeps its tables."""
    D = c["n_embd"] // c["n_head"]
    i = torch.arange(D // 2, dtype=torch.float64)
    inv_freq = c["rope_base"] ** (-2.0 * i / D)
    t = torch.arange(T, dtype=torch.float64)
    angle = t[:, None] * inv_freq[None, :]
    return (
        torch.cos(angle).to(torch.float32).to(DT),
        torch.sin(angle).to(torch.float32).to(DT),
    )


def rotate(x, cos, sin):
    """x (B, T, H, D): the pair (a, b) = (x[..., i], x[..., i + D/2]) becomes
    (a cos + b sin, b cos - a sin)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c + b * s, b * c - a * s], dim=-1)


def attention(w, p, x, c, cos, sin):
    Bn, Tn, C = x.shape
    H, Hkv = c["n_head"], c["n_kv_head"]
    D = C // H
    q = (x @ w[p + "c_q.weight"].T).reshape(Bn, Tn, H, D)
    k = (x @ w[p + "c_k.weight"].T).reshape(Bn, Tn, Hkv, D)
    v = (x @ w[p + "c_v.weight"].T).reshape(Bn, Tn, Hkv, D)
    q = rms_norm(rotate(q, cos, sin))
    k = rms_norm(rotate(k, cos, sin))
    # Query head h reads key/value head h // (H / Hkv): index, not repeat.
    kv_of = torch.arange(H) // (H // Hkv)
    k, v = k[:, :, kv_of, :], v[:, :, kv_of, :]  # (B, T, H, D)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)  # (B,H,T,T)
    future = torch.ones(Tn, Tn, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    y = torch.einsum("bhts,bshd->bthd", probs, v).reshape(Bn, Tn, H * D)
    return y @ w[p + "c_proj.weight"].T


def mlp(w, p, x):
    h = torch.relu(x @ w[p + "c_fc.weight"].T)
    return (h * h) @ w[p + "c_proj.weight"].T


def forward(w, c, idx):
    """Soft-capped logits (B, T, V)."""
    Tn = idx.shape[1]
    cos, sin = rotary_tables(c, Tn)
    x = rms_norm(w["wte.weight"][idx])  # (B, T, C)
    for i in range(c["n_layer"]):
        p = f"blocks.{i}."
        x = x + attention(w, p + "attn.", rms_norm(x), c, cos, sin)
        x = x + mlp(w, p + "mlp.", rms_norm(x))
    logits = rms_norm(x) @ w["lm_head.weight"].T
    cap = c["softcap"]
    return cap * torch.tanh(logits / cap)


def cross_entropy(logits, targets):
    """Mean of -log softmax(logits)[target] over targets != -1."""
    logits = logits.reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    keep = targets != -1
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    picked = logp[keep, targets[keep]]
    return -picked.sum() / keep.sum()


def loss_and_grads(w, c, idx, targets):
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in w.items()}
    logits = forward(leaves, c, idx)
    loss = cross_entropy(logits, targets)
    loss.backward()
    return logits.detach(), loss.detach(), {k: v.grad for k, v in leaves.items()}


# --- optimizers --------------------------------------------------------------


def newton_schulz(g, steps, dtype):
    """The quintic iteration toward U V^T for G = U S V^T, in `dtype`, on the
    wide orientation (rows <= cols)."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.norm(x) + NS_EPS)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class AdamW:
    def __init__(self, lr, wd):
        self.lr, self.wd = lr, wd
        self.m, self.v, self.t = {}, {}, 0

    def step(self, params, grads, mult):
        b1, b2, eps = OPTIM["adam_beta1"], OPTIM["adam_beta2"], OPTIM["adam_eps"]
        lr = self.lr * mult
        self.t += 1
        for k in params:
            g = grads[k]
            m = self.m.get(k, torch.zeros_like(g)) * b1 + (1 - b1) * g
            v = self.v.get(k, torch.zeros_like(g)) * b2 + (1 - b2) * g * g
            self.m[k], self.v[k] = m, v
            m_hat = m / (1 - b1**self.t)
            v_hat = v / (1 - b2**self.t)
            decayed = params[k] * (1 - lr * self.wd)
            params[k] = decayed - lr * m_hat / (torch.sqrt(v_hat) + eps)


class Muon:
    def __init__(self, lr, wd, ns_dtype):
        self.lr, self.wd, self.ns_dtype = lr, wd, ns_dtype
        self.buf = {}

    def step(self, params, grads, mult, step):
        o = OPTIM
        frac = min(1.0, step / o["muon_momentum_warmup"])
        mom = (1 - frac) * o["muon_momentum_start"] + frac * o["muon_momentum"]
        lr = self.lr * mult
        for k in params:
            g = grads[k]
            buf = mom * self.buf.get(k, torch.zeros_like(g)) + (1 - mom) * g
            self.buf[k] = buf
            nesterov = (1 - mom) * g + mom * buf
            ortho = newton_schulz(nesterov, o["newton_schulz_steps"], self.ns_dtype)
            rows, cols = g.shape
            scale = math.sqrt(max(1.0, rows / cols))
            params[k] = params[k] * (1 - lr * self.wd) - lr * scale * ortho.to(DT)


def groups_of(w):
    matrices = [k for k in w if k.startswith("blocks.")]
    return {
        "matrices": matrices,
        "embedding": ["wte.weight"],
        "lm_head": ["lm_head.weight"],
    }


def train(w0, c, idx, targets, muon_ns_dtype):
    """STEPS steps on the same batch; Muon on the matrices when
    muon_ns_dtype is given, else AdamW everywhere. Returns the weights and
    the loss before each step."""
    w = {k: v.clone() for k, v in w0.items()}
    G = OPTIM["groups"]
    names = groups_of(w)
    adam = {
        "embedding": AdamW(G["embedding"]["lr"], G["embedding"]["weight_decay"]),
        "lm_head": AdamW(G["lm_head"]["lr"], G["lm_head"]["weight_decay"]),
    }
    muon = None
    if muon_ns_dtype is None:
        adam["matrices"] = AdamW(
            G["matrices"]["lr_adamw"], G["matrices"]["weight_decay"]
        )
    else:
        muon = Muon(
            G["matrices"]["lr_muon"], G["matrices"]["weight_decay"], muon_ns_dtype
        )
    losses = []
    for step in range(STEPS):
        _, loss, grads = loss_and_grads(w, c, idx, targets)
        losses.append(loss.item())
        mult = lr_multiplier(step)
        for group, opt in adam.items():
            sub = {k: w[k] for k in names[group]}
            opt.step(sub, grads, mult)
            w.update(sub)
        if muon is not None:
            sub = {k: w[k] for k in names["matrices"]}
            muon.step(sub, grads, mult, step)
            w.update(sub)
    return w, torch.tensor(losses, dtype=DT)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)
    c = CONFIG
    w0 = random_weights(c, gen)
    idx = torch.randint(0, c["vocab_size"], (B, T), generator=gen)
    targets = torch.randint(0, c["vocab_size"], (B, T), generator=gen)
    for b, t in [(0, 3), (0, 15), (1, 0), (1, 9)]:  # ignored positions
        targets[b, t] = -1

    logits, loss, grads = loss_and_grads(w0, c, idx, targets)
    ref = {
        "input_ids": idx,
        "targets": targets,
        "logits": logits,
        "loss": loss,
        "lr_multipliers": torch.tensor(
            [lr_multiplier(s) for s in range(STEPS)], dtype=DT
        ),
    }
    for k, g in grads.items():
        ref["grad." + k] = g
    runs = {"adamw": None, "muon": torch.float64, "muon_ns_fp32": torch.float32}
    for run, ns_dtype in runs.items():
        w, losses = train(w0, c, idx, targets, ns_dtype)
        for k, v in w.items():
            ref[f"{run}.{k}"] = v
        ref[run + ".losses"] = losses
        print(f"{run}: loss {losses[0]:.6f} -> {losses[-1]:.6f}")

    meta = dict(CONFIG)
    meta.update(
        batch=B,
        seq_len=T,
        seed=SEED,
        steps=STEPS,
        optim=OPTIM,
        runs={k: (None if v is None else str(v).replace("torch.", "")) for k, v in runs.items()},
        torch=torch.__version__,
    )
    metadata = {"config": json.dumps(meta, sort_keys=True)}
    contiguous = lambda d: {k: v.contiguous() for k, v in d.items()}
    save_file(contiguous(w0), os.path.join(out, "model.safetensors"), metadata)
    save_file(contiguous(ref), os.path.join(out, "reference.safetensors"), metadata)
    print(f"loss {loss.item():.12f}; wrote {out}/model.safetensors, reference.safetensors")


if __name__ == "__main__":
    main()
