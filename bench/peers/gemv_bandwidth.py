"""cuBLAS's matrix-vector products at decoding's shapes, as GB/s.

  python3 bench/peers/gemv_bandwidth.py [hidden inter qkv vocab]

For each projection of one decoder layer of a model (default: Llama 3.2
3B's sizes) and the output head: bf16, one row, F.linear replayed 200
times in a CUDA graph; prints the weight bytes read per second. What a
decoding step could reach if every product ran at cuBLAS's speed.
"""
import sys

import torch
import torch.nn.functional as F

hidden, inter, qkv, vocab = (
    (int(a) for a in sys.argv[1:5]) if len(sys.argv) > 4 else (3072, 8192, 5120, 128256))
shapes = {
    "qkv": (qkv, hidden),
    "o": (hidden, hidden),
    "gate_up": (2 * inter, hidden),
    "down": (hidden, inter),
    "lm_head": (vocab, hidden),
}
for name, (out, inp) in shapes.items():
    w = torch.randn(out, inp, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, inp, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            F.linear(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(200):
            y = F.linear(x, w)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    torch.cuda.synchronize()
    t = a.elapsed_time(b) / 1e3 / 200
    print(f"{name:8s} {out:6d} x {inp:5d}: {t * 1e6:7.1f} us  {w.numel() * 2 / t / 1e9:6.0f} GB/s")
