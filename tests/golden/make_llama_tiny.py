#!/usr/bin/python3
"""Golden reference for loom's Llama on the model `llama_tiny`: forward, backward and 10 AdamW steps.

Writes tests/golden/llama_tiny.safetensors (next to this script). Everything is computed in
float64 with PyTorch autograd from float32-representable initial values, like make_gpt_tiny.py.
The layers are written as Hugging Face's LlamaForCausalLM defines them (modeling_llama.py:
LlamaRMSNorm, LlamaRotaryEmbedding + apply_rotary_pos_emb with rotate_half, repeat_kv, LlamaMLP,
no biases, untied lm_head), in plain torch so that no transformers package is needed:

  x = embed_tokens[tokens]
  per layer l:  h = RMSNorm(x; ln1_w[l])                           x * rsqrt(mean(x^2) + eps) * w
                q, k, v = h q_proj^T, h k_proj^T, h v_proj^T       NH query heads, KV key/value heads
                q, k = q cos + rotate_half(q) sin, k the same      theta 10000, positions 0..T-1
                k, v = repeat_kv(k, v, NH / KV)                    query head h reads kv head h // (NH/KV)
                y = causal softmax(q k^T / sqrt(HD)) v
                x = x + y o_proj^T
                x = x + (silu(h2 gate^T) * (h2 up^T)) down^T       h2 = RMSNorm(x; ln2_w[l])
  logits = RMSNorm(x; lnf_w) lm_head^T                             (B,T,Vp)
  loss = mean over targets != -1 of cross-entropy(logits[..., :V], targets)
  then 10 steps of global-norm clipping + warm-up/cosine lr + AdamW (decay on the four
  projections) as make_gpt_tiny.py.

Tensors are stored under loom's names and layout (models::param_table for models::llama): qkv_w is
[q_proj; k_proj; v_proj] stacked by rows, fc_w is [gate_proj; up_proj], fcproj_w is down_proj.
The initial parameters are also stored as LlamaForCausalLM's state dict, "hf.<name>" (e.g.
hf.model.layers.0.self_attn.k_proj.weight; embedding and head without loom's padding rows), for
the import test.
Run with the Debian interpreter that has python3-torch:  /usr/bin/python3 make_llama_tiny.py
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# The schedule, optimizer settings and file writer are make_gpt_tiny.py's (same STEPS, lr, betas).
from make_gpt_tiny import (ADAM_EPS, BETA1, BETA2, CLIP_EPS, MAX_LR, MAX_NORM, STEPS, WEIGHT_DECAY, lr_at,
                           write_safetensors)

SEED = 11
L, NH, KV, C, H, MAX_T, V, VP = 2, 6, 2, 24, 14, 16, 61, 64  # loom::models::llama_tiny
HD = C // NH                                                  # head size 4
THETA, EPS = 10000.0, 1e-5
B, T = 3, 13
AGREE = 1e-12

PARAMS = [
    ("wte", (VP, C)),
    ("ln1_w", (L, C)),
    ("qkv_w", (L, (NH + 2 * KV) * HD, C)),
    ("attproj_w", (L, C, C)),
    ("ln2_w", (L, C)),
    ("fc_w", (L, 2 * H, C)),
    ("fcproj_w", (L, C, H)),
    ("lnf_w", (C,)),
    ("lm_head", (VP, C)),
]
DECAYED = {"qkv_w", "attproj_w", "fc_w", "fcproj_w"}

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


def initial_params(gen):
    """Random, non-zero, float32-representable values (norm gains around 1)."""
    def f32(shape, std, mean=0.0):
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        x = torch.tensor(mean, dtype=torch.float32) + torch.tensor(std, dtype=torch.float32) * x
        assert bool((x != 0).all())
        return x

    resid = 0.02 / math.sqrt(2 * L)
    init = {"wte": (0.3, 0.0), "lm_head": (0.05, 0.0),
            "ln1_w": (0.1, 1.0), "ln2_w": (0.1, 1.0), "lnf_w": (0.1, 1.0),
            "qkv_w": (0.2, 0.0), "attproj_w": (resid * 4, 0.0),
            "fc_w": (0.2, 0.0), "fcproj_w": (resid * 4, 0.0)}
    return {name: f32(shape, *init[name]) for name, shape in PARAMS}


def make_batch(gen):
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    ignored = torch.randperm(B * T, generator=gen)[:2]
    targets.view(-1)[ignored] = -1
    return tokens.to(torch.int32), targets.to(torch.int32)


# ---------------------------------------------------------------- model (float64), as modeling_llama.py
def rms_norm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rotary_cos_sin():
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.int64).double() / HD))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, HD/2)
    emb = torch.cat((freqs, freqs), dim=-1)                                     # (T, HD)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, kv, t, hd = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)


def cross_entropy(logits, targets):
    logp = torch.log_softmax(logits[..., :V], dim=-1).reshape(-1, V)
    t = targets.reshape(-1).long()
    keep = t != -1
    return -(logp[keep].gather(1, t[keep].unsqueeze(1))).sum() / keep.sum()


def forward(p, tokens, targets):
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    cos, sin = rotary_cos_sin()
    x = p["wte"][tokens.long()]
    for l in range(L):
        h = rms_norm(x, p["ln1_w"][l])
        q_w, k_w, v_w = p["qkv_w"][l].split([NH * HD, KV * HD, KV * HD], dim=0)
        q = (h @ q_w.T).reshape(B, T, NH, HD).transpose(1, 2)   # (B,NH,T,HD)
        k = (h @ k_w.T).reshape(B, T, KV, HD).transpose(1, 2)   # (B,KV,T,HD)
        v = (h @ v_w.T).reshape(B, T, KV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, NH // KV), repeat_kv(v, NH // KV)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attproj_w"][l].T
        h2 = rms_norm(x, p["ln2_w"][l])
        gate_w, up_w = p["fc_w"][l].split([H, H], dim=0)
        x = x + (F.silu(h2 @ gate_w.T) * (h2 @ up_w.T)) @ p["fcproj_w"][l].T
    logits = rms_norm(x, p["lnf_w"]) @ p["lm_head"].T
    return logits, cross_entropy(logits, targets)


def check_building_blocks(gen):
    """The hand-written pieces agree with PyTorch's own functions and with their definitions."""
    x = torch.randn(5, C, generator=gen, dtype=torch.float64)
    w = torch.randn(C, generator=gen, dtype=torch.float64)
    ref = x / torch.sqrt((x * x).sum(-1, keepdim=True) / C + EPS) * w
    assert torch.allclose(rms_norm(x, w), ref, rtol=0, atol=1e-13)
    assert torch.allclose(F.silu(x), x * torch.sigmoid(x), rtol=0, atol=1e-15)
    # rotate-half RoPE is a rotation of the pairs (i, i + HD/2) by t * theta^(-2i/HD)
    cos, sin = rotary_cos_sin()
    q = torch.randn(T, HD, generator=gen, dtype=torch.float64)
    r = q * cos + rotate_half(q) * sin
    for t in (0, 5, T - 1):
        for i in range(HD // 2):
            a = t * THETA ** (-2.0 * i / HD)
            x1, x2 = q[t, i].item(), q[t, i + HD // 2].item()
            assert abs(r[t, i].item() - (x1 * math.cos(a) - x2 * math.sin(a))) < 1e-14
            assert abs(r[t, i + HD // 2].item() - (x2 * math.cos(a) + x1 * math.sin(a))) < 1e-14


def hf_state_dict(p):
    """LlamaForCausalLM's state-dict names and shapes for loom's tensors p."""
    sd = {"model.embed_tokens.weight": p["wte"][:V]}
    for l in range(L):
        pre = f"model.layers.{l}."
        q_w, k_w, v_w = p["qkv_w"][l].split([NH * HD, KV * HD, KV * HD], dim=0)
        gate_w, up_w = p["fc_w"][l].split([H, H], dim=0)
        sd.update({pre + "input_layernorm.weight": p["ln1_w"][l],
                   pre + "self_attn.q_proj.weight": q_w, pre + "self_attn.k_proj.weight": k_w,
                   pre + "self_attn.v_proj.weight": v_w, pre + "self_attn.o_proj.weight": p["attproj_w"][l],
                   pre + "post_attention_layernorm.weight": p["ln2_w"][l],
                   pre + "mlp.gate_proj.weight": gate_w, pre + "mlp.up_proj.weight": up_w,
                   pre + "mlp.down_proj.weight": p["fcproj_w"][l]})
    sd["model.norm.weight"] = p["lnf_w"]
    sd["lm_head.weight"] = p["lm_head"][:V]
    return sd


def train_with_torch(init, tokens, targets):
    """10 steps of clip_grad_norm_ + torch.optim.AdamW (two param groups) in float64."""
    p = {n: init[n].double().clone().requires_grad_(True) for n, _ in PARAMS}
    opt = torch.optim.AdamW(
        [{"params": [p[n] for n in p if n in DECAYED], "weight_decay": WEIGHT_DECAY},
         {"params": [p[n] for n in p if n not in DECAYED], "weight_decay": 0.0}],
        lr=MAX_LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses, norms, lrs = [], [], []
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
        lrs.append(lr_at(s))
    return losses, norms, lrs, {n: p[n].detach().clone() for n in p}


def main():
    gen = torch.Generator().manual_seed(SEED)
    init = initial_params(gen)
    tokens, targets = make_batch(gen)
    check_building_blocks(torch.Generator().manual_seed(SEED + 1))

    p = {n: init[n].double().clone().requires_grad_(True) for n, _ in PARAMS}
    logits, loss = forward(p, tokens, targets)
    loss.backward()
    grads = {n: p[n].grad.detach().clone() for n in p}
    assert bool(torch.isfinite(logits).all()) and math.isfinite(loss.item())
    assert float(grads["wte"][V:].abs().max()) == 0.0 and float(grads["lm_head"][V:].abs().max()) == 0.0

    losses, norms, lrs, final = train_with_torch(init, tokens, targets)
    assert abs(losses[0] - loss.item()) <= AGREE
    clipped = [s for s in range(STEPS) if MAX_NORM / (norms[s] + CLIP_EPS) < 1.0]

    tensors = [("tokens", "I32", tokens.numpy()), ("targets", "I32", targets.numpy())]
    tensors += [(f"param.{n}", "F32", init[n].numpy()) for n, _ in PARAMS]
    tensors += [("logits", "F64", logits.detach().numpy()), ("loss", "F64", np.array([loss.item()]))]
    tensors += [(f"grad.{n}", "F64", grads[n].numpy()) for n, _ in PARAMS]
    tensors += [("losses", "F64", np.array(losses)), ("grad_norms", "F64", np.array(norms)),
                ("lrs", "F64", np.array(lrs))]
    tensors += [(f"final.{n}", "F64", final[n].numpy()) for n, _ in PARAMS]
    tensors += [(f"hf.{n}", "F32", t.contiguous().numpy()) for n, t in hf_state_dict(init).items()]

    config = {"model": "llama_tiny", "n_layer": L, "n_head": NH, "n_kv_head": KV, "d_model": C,
              "d_ff": H, "max_seq": MAX_T, "vocab": V, "vocab_padded": VP, "B": B, "T": T,
              "rope_theta": THETA, "rms_norm_eps": EPS}
    metadata = {"format": "loom golden v1", "generator": "tests/golden/make_llama_tiny.py",
                "seed": str(SEED), "torch": torch.__version__, "dtype": "float64",
                "config": json.dumps(config), "clipped_steps": json.dumps(clipped)}
    out = Path(__file__).resolve().parent / "llama_tiny.safetensors"
    write_safetensors(out, tensors, metadata)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(tensors)} tensors)")
    print("loss0  ", loss.item())
    print("losses ", " ".join(f"{x:.6f}" for x in losses))
    print("norms  ", " ".join(f"{x:.4f}" for x in norms))
    print("clipped steps", clipped)


if __name__ == "__main__":
    sys.exit(main())
