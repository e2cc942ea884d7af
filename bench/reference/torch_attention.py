#!/usr/bin/env python3
"""PyTorch reference for bench_attention: causal attention forward+backward, same shapes.

    /usr/bin/python3 bench/reference/torch_attention.py --T 128,256,512,1024,2048,4096 --batch 4 --threads 2

Uses torch.nn.functional.scaled_dot_product_attention when the installed PyTorch has it
(2.0 and later); Debian 12's python3-torch is 1.13, which does not, so it times the naive
softmax(mask(q k^T) / sqrt(d)) v instead. Prints best-of-reps milliseconds per length.
"""
import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--T", default="128,256,512,1024")
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--heads", type=int, default=6)
ap.add_argument("--head-dim", type=int, default=64)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(a.threads)
sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
kind = "sdpa" if sdpa else "naive"
print(f"torch {torch.__version__}, {kind}, B={a.batch} NH={a.heads} HD={a.head_dim}, {a.threads} threads")
for T in [int(t) for t in a.T.split(",")]:
    q, k, v = (torch.randn(a.batch, a.heads, T, a.head_dim, requires_grad=True) for _ in range(3))
    dy = torch.randn(a.batch, a.heads, T, a.head_dim)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def run():
        if sdpa:
            y = sdpa(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) * a.head_dim ** -0.5
            y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        y.backward(dy)

    run()
    best = 1e30
    for _ in range(a.reps):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    print(f"T={T:5d} torch {kind} fwd+bwd {best * 1e3:10.2f} ms", flush=True)
