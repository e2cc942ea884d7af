#!/usr/bin/env python3
"""PyTorch reference for bench_step: one GPT-2 or Llama training step (forward, backward, clip, AdamW).

    /usr/bin/python3 bench/reference/torch_step.py --vocab 8192 --seq 256 --width 384 \
        --layers 6 --heads 6 --batch 8 --precision bf16 --steps 5 --threads 2
    ... --arch llama --kv-heads 2 --ffn 512      # a Llama of those sizes

The model is GPT-2 as loom builds it (pre-norm blocks, GELU with the tanh approximation,
learned position embeddings, LM head tied to the token embedding, no dropout) written the
usual PyTorch way (nn.Linear, F.layer_norm); the optimizer is torch.optim.AdamW with weight
decay on the four weight matrices of each block and clip_grad_norm_(1.0), as loom's trainer.
fp32 runs as is; bf16 runs under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's mixed
precision: fp32 weights, bf16 matmuls through oneDNN). Debian 12's PyTorch 1.13 has no
scaled_dot_product_attention, so attention is the explicit softmax(mask(q k^T)/sqrt(d)) v.
--arch llama is Hugging Face's LlamaForCausalLM written the same way (RMSNorm, rotate-half RoPE,
grouped-query attention with repeat_interleave'd keys and values, SwiGLU, no biases, untied head).

Prints one line that bench_step parses:
    torch_step tokens_per_s=<median over the timed steps> ms_per_step=<median> torch=<version>
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fcproj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(C // self.heads))
        y = s.masked_fill(mask[:T, :T], float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.T
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv_heads, d // heads
        self.ln1 = RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = RMSNorm(d)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        h = self.ln1(x)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = q * cos[:T] + rotate_half(q) * sin[:T], k * cos[:T] + rotate_half(k) * sin[:T]
        k, v = (t.repeat_interleave(self.heads // self.kv, dim=1) for t in (k, v))
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        y = s.masked_fill(mask[:T, :T], float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h2 = self.ln2(x)
        return x + self.down(F.silu(self.gate(h2)) * self.up(h2))


class Llama(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads, kv_heads, ffn):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, kv_heads, ffn) for _ in range(layers))
        self.lnf = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(seq).float()[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, self.mask, self.cos, self.sin)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="llama: SwiGLU hidden width (0: 4 x width)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: PyTorch's default)")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.arch == "llama":
        model = Llama(a.vocab, a.seq, a.width, a.layers, a.heads, a.kv_heads or a.heads, a.ffn or 4 * a.width)
        matrices = ("q.weight", "k.weight", "v.weight", "proj.weight", "gate.weight", "up.weight", "down.weight")
    else:
        model = GPT(a.vocab, a.seq, a.width, a.layers, a.heads)
        matrices = ("qkv.weight", "proj.weight", "fc.weight")
    decayed = [p for n, p in model.named_parameters() if n.endswith(matrices)]
    others = [p for n, p in model.named_parameters() if not n.endswith(matrices)]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    step()  # warm-up: allocations, oneDNN primitive creation
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        ms.append((time.perf_counter() - t0) * 1e3)
        if not math.isfinite(loss):
            raise SystemExit(f"torch_step: loss {loss} is not finite")
    med = statistics.median(ms)
    print(f"torch_step tokens_per_s={a.batch * a.seq / med * 1e3:.1f} ms_per_step={med:.2f} torch={torch.__version__}",
          flush=True)


if __name__ == "__main__":
    main()
