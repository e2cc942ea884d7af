#!/usr/bin/python3
"""Causal attention with attention-probability dropout in float64 by PyTorch autograd, for
tests/unit/kernels/test_dropout.cpp.

Writes tests/golden/attention_dropout.safetensors: one (B, T, C) problem with NH local heads
that are heads [HEAD_OFFSET, HEAD_OFFSET + NH) of a model with HEADS heads (a tensor-parallel
shard), dropout probability P and mask key KEY. The keep-mask is loom's counter-based mask
(include/loom/core/dropout.hpp, attention_dropout_keep), rebuilt here from its definition:

    splitmix64(x) = mix of x + 0x9e3779b97f4a7c15 (Steele, Lea, Flood 2014)
    threshold     = round(P * 2^32)
    keep(b,h,i,j) = (splitmix64(KEY + ((b*HEADS + HEAD_OFFSET + h)*T + i)*T + j) >> 32) >= threshold

The mask is stored too, and the C++ test checks that loom's exported mask (materialised with
attention_dropout_keep) equals it bit for bit before comparing numbers.

Forward (PyTorch F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=P) with the
mask given explicitly): S = q k^T / sqrt(HD), causal; A = softmax(S); out = (A * keep / (1-P)) v.
Gradients: d(sum(out * dout)) / d qkv, by autograd. Inputs are float32-representable.
Needs torch only (no numpy); the safetensors format is written with struct + json.
Run with the Debian interpreter that has python3-torch:
    /usr/bin/python3 tests/golden/make_attention_dropout.py
"""
import json
import struct
from pathlib import Path

import torch

B, T, C, NH = 2, 67, 16, 2          # T > one 64-row tile and not a multiple of it
HD = C // NH
HEAD_OFFSET, HEADS = 1, 4            # this call holds global heads 1 and 2 of 4
P = 0.2
KEY = 0x0123456789ABCDEF
SEED = 2024
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def keep_mask():
    threshold = int(round(P * 2.0 ** 32))
    keep = torch.zeros(B, NH, T, T, dtype=torch.uint8)
    for b in range(B):
        for h in range(NH):
            for i in range(T):
                base = ((b * HEADS + HEAD_OFFSET + h) * T + i) * T
                for j in range(T):
                    keep[b, h, i, j] = 1 if (splitmix64((KEY + base + j) & M64) >> 32) >= threshold else 0
    return keep


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    qkv = torch.randn(B, T, 3 * C, dtype=torch.float32).double().requires_grad_(True)
    dout = torch.randn(B, T, C, dtype=torch.float32).double()
    keep = keep_mask()
    q, k, v = qkv.split(C, dim=2)
    heads = lambda x: x.view(B, T, NH, HD).transpose(1, 2)  # (B, NH, T, HD)
    q, k, v = heads(q), heads(k), heads(v)
    s = q @ k.transpose(-1, -2) / HD ** 0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    a = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    a = a * keep.double() / (1.0 - P)
    out = (a @ v).transpose(1, 2).reshape(B, T, C)
    (out * dout).sum().backward()

    tensors = [
        ("qkv", "F64", qkv.detach()),
        ("dout", "F64", dout),
        ("keep", "U8", keep),
        ("out", "F64", out.detach()),
        ("dqkv", "F64", qkv.grad),
    ]
    meta = {"writer": "tests/golden/make_attention_dropout.py", "torch": torch.__version__,
            "B": str(B), "T": str(T), "C": str(C), "NH": str(NH), "head_offset": str(HEAD_OFFSET),
            "heads": str(HEADS), "p": repr(P), "key": str(KEY), "kept": str(int(keep.sum())),
            "visible": str(B * NH * T * (T + 1) // 2)}
    header, pos, data = {"__metadata__": meta}, 0, b""
    for name, dtype, a in tensors:
        values = a.contiguous().flatten().tolist()
        raw = struct.pack(f"<{len(values)}d", *values) if dtype == "F64" else bytes(values)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
        data += raw
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path = Path(__file__).resolve().parent / "attention_dropout.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    kept_causal = int((keep.bool() & causal).sum())
    print(f"wrote {path} ({path.stat().st_size} bytes); kept {kept_causal} of "
          f"{B * NH * T * (T + 1) // 2} visible probabilities (1-P = {1 - P})")


if __name__ == "__main__":
    main()
