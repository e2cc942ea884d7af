#!/usr/bin/python3
"""Golden reference for loom's GPT on the model `tiny`: forward, backward and 10 AdamW steps.

Writes tests/golden/gpt_tiny.safetensors (next to this script). Everything is computed in
float64 with PyTorch autograd from float32-representable initial values, so loom's fp32 code
can be compared against it with a tolerance that reflects only loom's own rounding.

Semantics (llm.c layout; see tests/golden/README.md for the key list):
  x = wte[tokens] + wpe[:T]
  per layer l:  h = LN(x; ln1_w[l], ln1_b[l])                     eps 1e-5, biased variance
                q, k, v = split(h qkv_w[l]^T + qkv_b[l], C)       head h = channels [h*HS,(h+1)*HS)
                y = causal softmax(q k^T / sqrt(HS)) v            heads concatenated back
                x = x + y attproj_w[l]^T + attproj_b[l]
                x = x + GELU_tanh(LN(x; ln2_w[l], ln2_b[l]) fc_w[l]^T + fc_b[l]) fcproj_w[l]^T + fcproj_b[l]
  logits = LN(x; lnf_w, lnf_b) wte^T                              (B,T,Vp), tied LM head, no bias
  loss = mean over targets != -1 of cross-entropy(logits[..., :V], targets)
  per step s (t = s+1): global norm of all grads; clip with coef = max_norm/(norm+1e-6) if < 1;
  lr(s) = warmup + cosine; AdamW, weight decay only on qkv_w, attproj_w, fc_w, fcproj_w.

The safetensors file is written by hand (struct + json), not with the safetensors package.
Run with the Debian interpreter that has python3-torch:  /usr/bin/python3 make_gpt_tiny.py
"""
import json
import math
import os
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- configuration
# Seed chosen among 1..79 so that clipping is both skipped (steps 0, 1, 8, 9: norms 0.87-0.96)
# and taken (steps 2-7: norms 1.10-1.74), every pre-clip norm at least 3.9% away from max_norm.
SEED = 79
L, NH, C, MAX_T, V, VP = 2, 3, 24, 16, 61, 64  # loom::models::tiny
HS = C // NH                                   # head size 8
B, T = 3, 13
LN_EPS = 1e-5
STEPS = 10
MAX_LR, MIN_LR, WARMUP, DECAY_STEPS = 1e-2, 1e-3, 3, 8
BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY = 0.9, 0.95, 1e-8, 0.1
MAX_NORM, CLIP_EPS = 1.0, 1e-6
AGREE = 1e-12  # hand-written AdamW vs torch.optim.AdamW, max abs difference

# (name, shape) in llm.c order; linear weights are (out, in): y = x W^T + b.
PARAMS = [
    ("wte", (VP, C)), ("wpe", (MAX_T, C)),
    ("ln1_w", (L, C)), ("ln1_b", (L, C)),
    ("qkv_w", (L, 3 * C, C)), ("qkv_b", (L, 3 * C)),
    ("attproj_w", (L, C, C)), ("attproj_b", (L, C)),
    ("ln2_w", (L, C)), ("ln2_b", (L, C)),
    ("fc_w", (L, 4 * C, C)), ("fc_b", (L, 4 * C)),
    ("fcproj_w", (L, C, 4 * C)), ("fcproj_b", (L, C)),
    ("lnf_w", (C,)), ("lnf_b", (C,)),
]
DECAYED = {"qkv_w", "attproj_w", "fc_w", "fcproj_w"}

torch.set_num_threads(1)  # bit-for-bit reproducible reductions
torch.use_deterministic_algorithms(True)


def initial_params(gen):
    """Random, non-zero, float32-representable values (drawn and scaled in float32)."""
    def f32(shape, std, mean=0.0):
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        x = torch.tensor(mean, dtype=torch.float32) + torch.tensor(std, dtype=torch.float32) * x
        assert x.dtype == torch.float32 and bool((x != 0).all())
        return x

    resid = 0.02 / math.sqrt(2 * L)
    init = {"wte": (0.02, 0.0), "wpe": (0.02, 0.0),
            "ln1_w": (0.1, 1.0), "ln1_b": (0.1, 0.0), "ln2_w": (0.1, 1.0), "ln2_b": (0.1, 0.0),
            "lnf_w": (0.1, 1.0), "lnf_b": (0.1, 0.0),
            "qkv_w": (0.02, 0.0), "qkv_b": (0.02, 0.0),
            "attproj_w": (resid, 0.0), "attproj_b": (0.02, 0.0),
            "fc_w": (0.02, 0.0), "fc_b": (0.02, 0.0),
            "fcproj_w": (resid, 0.0), "fcproj_b": (0.02, 0.0)}
    return {name: f32(shape, *init[name]) for name, shape in PARAMS}


def make_batch(gen):
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    ignored = torch.randperm(B * T, generator=gen)[:2]
    targets.view(-1)[ignored] = -1
    return tokens.to(torch.int32), targets.to(torch.int32)


# ---------------------------------------------------------------- model (float64)
def layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def cross_entropy(logits, targets):
    """Mean over targets != -1 of -log softmax(logits[..., :V])[target]."""
    logp = torch.log_softmax(logits[..., :V], dim=-1).reshape(-1, V)
    t = targets.reshape(-1).long()
    keep = t != -1
    return -(logp[keep].gather(1, t[keep].unsqueeze(1))).sum() / keep.sum()


def forward(p, tokens, targets):
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = p["wte"][tokens.long()] + p["wpe"][:T]                   # (B,T,C)
    for l in range(L):
        h = layernorm(x, p["ln1_w"][l], p["ln1_b"][l])             # (B,T,C)
        qkv = h @ p["qkv_w"][l].T + p["qkv_b"][l]                  # (B,T,3C)
        q, k, v = qkv.split(C, dim=-1)                             # (B,T,C) each
        q, k, v = (z.reshape(B, T, NH, HS).transpose(1, 2) for z in (q, k, v))  # (B,NH,T,HS)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)            # (B,NH,T,T)
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)             # (B,T,C)
        x = x + y @ p["attproj_w"][l].T + p["attproj_b"][l]
        h2 = layernorm(x, p["ln2_w"][l], p["ln2_b"][l])
        m = gelu_tanh(h2 @ p["fc_w"][l].T + p["fc_b"][l])          # (B,T,4C)
        x = x + m @ p["fcproj_w"][l].T + p["fcproj_b"][l]
    logits = layernorm(x, p["lnf_w"], p["lnf_b"]) @ p["wte"].T     # (B,T,Vp)
    return logits, cross_entropy(logits, targets)


def check_building_blocks(gen):
    """The hand-written pieces agree with PyTorch's own functions."""
    x = torch.randn(5, C, generator=gen, dtype=torch.float64)
    w = torch.randn(C, generator=gen, dtype=torch.float64)
    b = torch.randn(C, generator=gen, dtype=torch.float64)
    assert torch.allclose(layernorm(x, w, b), F.layer_norm(x, (C,), w, b, LN_EPS), rtol=0, atol=1e-13)
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-14)
    lg = torch.randn(B, T, VP, generator=gen, dtype=torch.float64)
    tg = torch.randint(0, V, (B, T), generator=gen)
    tg[0, 0] = -1
    ref = F.cross_entropy(lg[..., :V].reshape(-1, V), tg.reshape(-1), ignore_index=-1)
    assert abs(cross_entropy(lg, tg).item() - ref.item()) < 1e-13


def lr_at(s):
    if s < WARMUP:
        return MAX_LR * (s + 1) / WARMUP
    if s >= DECAY_STEPS:
        return MIN_LR
    ratio = (s - WARMUP) / (DECAY_STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (MAX_LR - MIN_LR)


# ---------------------------------------------------------------- training
def train_by_hand(init, tokens, targets):
    """10 steps of clip + AdamW written out in float64; returns the record."""
    p = {n: init[n].double().clone().requires_grad_(True) for n, _ in PARAMS}
    m = {n: torch.zeros_like(p[n]) for n in p}
    v = {n: torch.zeros_like(p[n]) for n in p}
    losses, norms, lrs, snapshots = [], [], [], []
    for s in range(STEPS):
        t = s + 1
        for q in p.values():
            q.grad = None
        _, loss = forward(p, tokens, targets)
        loss.backward()
        norm = math.sqrt(sum(float((p[n].grad ** 2).sum()) for n in p))  # wte once
        coef = MAX_NORM / (norm + CLIP_EPS)
        lr = lr_at(s)
        with torch.no_grad():
            for n in p:
                g = p[n].grad * coef if coef < 1.0 else p[n].grad
                if n in DECAYED:
                    p[n].mul_(1.0 - lr * WEIGHT_DECAY)
                m[n] = BETA1 * m[n] + (1.0 - BETA1) * g
                v[n] = BETA2 * v[n] + (1.0 - BETA2) * g * g
                m_hat = m[n] / (1.0 - BETA1 ** t)
                v_hat = v[n] / (1.0 - BETA2 ** t)
                p[n].sub_(lr * m_hat / (torch.sqrt(v_hat) + ADAM_EPS))
        losses.append(loss.item())
        norms.append(norm)
        lrs.append(lr)
        snapshots.append({n: p[n].detach().clone() for n in p})
    return losses, norms, lrs, snapshots


def train_with_torch(init, tokens, targets):
    """The same run with clip_grad_norm_ and torch.optim.AdamW (two param groups)."""
    p = {n: init[n].double().clone().requires_grad_(True) for n, _ in PARAMS}
    opt = torch.optim.AdamW(
        [{"params": [p[n] for n in p if n in DECAYED], "weight_decay": WEIGHT_DECAY},
         {"params": [p[n] for n in p if n not in DECAYED], "weight_decay": 0.0}],
        lr=MAX_LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses, norms, snapshots = [], [], []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = forward(p, tokens, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(p.values()), MAX_NORM, norm_type=2.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(s)
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
        snapshots.append({n: p[n].detach().clone() for n in p})
    return losses, norms, snapshots


# ---------------------------------------------------------------- file output
NP_DTYPE = {"F64": "<f8", "F32": "<f4", "I32": "<i4"}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, dtype, array). Header in list order; data by decreasing element
    size (stable) so every tensor is aligned; header padded with spaces to a multiple of 8."""
    arrays = [(n, d, np.ascontiguousarray(np.asarray(a), dtype=NP_DTYPE[d])) for n, d, a in tensors]
    order = sorted(range(len(arrays)), key=lambda i: -arrays[i][2].itemsize)
    offsets, pos = {}, 0
    for i in order:
        offsets[i] = (pos, pos + arrays[i][2].nbytes)
        pos += arrays[i][2].nbytes
    header = {"__metadata__": metadata}
    for i, (name, dtype, a) in enumerate(arrays):
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": list(offsets[i])}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = Path(str(path) + f".tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for i in order:
            f.write(arrays[i][2].tobytes(order="C"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    gen = torch.Generator().manual_seed(SEED)
    init = initial_params(gen)
    tokens, targets = make_batch(gen)
    check_building_blocks(torch.Generator().manual_seed(SEED + 1))

    # Initial forward and backward.
    p = {n: init[n].double().clone().requires_grad_(True) for n, _ in PARAMS}
    logits, loss = forward(p, tokens, targets)
    loss.backward()
    grads = {n: p[n].grad.detach().clone() for n in p}
    assert bool(torch.isfinite(logits).all()) and math.isfinite(loss.item())
    assert float(grads["wte"][V:].abs().max()) == 0.0  # padded rows: never looked up nor scored

    losses, norms, lrs, snaps = train_by_hand(init, tokens, targets)
    t_losses, t_norms, t_snaps = train_with_torch(init, tokens, targets)
    assert losses[0] == loss.item()
    worst = 0.0
    for s in range(STEPS):
        assert abs(losses[s] - t_losses[s]) <= AGREE, (s, losses[s], t_losses[s])
        assert abs(norms[s] - t_norms[s]) <= AGREE * max(1.0, norms[s]), (s, norms[s], t_norms[s])
        for n in snaps[s]:
            diff = float((snaps[s][n] - t_snaps[s][n]).abs().max())
            assert diff <= AGREE, f"step {s} param {n}: hand AdamW and torch.optim.AdamW differ by {diff}"
            worst = max(worst, diff)
    clipped = [s for s in range(STEPS) if MAX_NORM / (norms[s] + CLIP_EPS) < 1.0]

    tensors = [("tokens", "I32", tokens.numpy()), ("targets", "I32", targets.numpy())]
    tensors += [(f"param.{n}", "F32", init[n].numpy()) for n, _ in PARAMS]
    tensors += [("logits", "F64", logits.detach().numpy()),
                ("loss", "F64", np.array([loss.item()]))]
    tensors += [(f"grad.{n}", "F64", grads[n].numpy()) for n, _ in PARAMS]
    tensors += [("losses", "F64", np.array(losses)), ("grad_norms", "F64", np.array(norms)),
                ("lrs", "F64", np.array(lrs))]
    tensors += [(f"final.{n}", "F64", snaps[-1][n].numpy()) for n, _ in PARAMS]

    config = {"model": "tiny", "n_layer": L, "n_head": NH, "d_model": C, "max_seq": MAX_T,
              "vocab": V, "vocab_padded": VP, "B": B, "T": T}
    hyper = {"ln_eps": LN_EPS, "gelu": "tanh", "steps": STEPS, "max_lr": MAX_LR, "min_lr": MIN_LR,
             "warmup": WARMUP, "decay_steps": DECAY_STEPS, "beta1": BETA1, "beta2": BETA2,
             "adam_eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY,
             "weight_decay_on": sorted(DECAYED), "max_norm": MAX_NORM, "clip_eps": CLIP_EPS,
             "ignore_index": -1}
    metadata = {"format": "loom golden v1", "generator": "tests/golden/make_gpt_tiny.py",
                "seed": str(SEED), "torch": torch.__version__, "dtype": "float64",
                "config": json.dumps(config), "hyper": json.dumps(hyper),
                "clipped_steps": json.dumps(clipped)}
    metadata.update({k: str(v) for k, v in config.items()})

    out = Path(__file__).resolve().parent / "gpt_tiny.safetensors"
    write_safetensors(out, tensors, metadata)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(tensors)} tensors)")
    print("loss0  ", loss.item())
    print("losses ", " ".join(f"{x:.6f}" for x in losses))
    print("norms  ", " ".join(f"{x:.4f}" for x in norms))
    print("lrs    ", " ".join(f"{x:.5f}" for x in lrs))
    print("clipped steps", clipped)
    print(f"hand AdamW vs torch.optim.AdamW: max |diff| over all steps and params {worst:.3e}")


if __name__ == "__main__":
    sys.exit(main())
