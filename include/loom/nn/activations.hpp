#pragma once
/// \file The activation table of one rank of a model for micro-batch B and sequence T.
///
/// Everything the forward pass saves for backward, plus the backward scratch, lives in two
/// contiguous buffers allocated once (no allocation inside the training step): one of the
/// storage type S, one of the accumulator type A (LayerNorm statistics, attention saved
/// state, per-token losses). The attention implementation decides its saved size, so the
/// table — and the memory the trainer reports — changes with the choice (reference keeps
/// B·NH·T² probabilities per layer).
#include <array>
#include <cstddef>


namespace loom::nn {

/// Activation recomputation (train_gpt --recompute), after Megatron-LM's
/// --recompute-granularity (Korthikanti et al., "Reducing Activation Recomputation in Large
/// Transformer Models", 2022):
///   none       every block keeps what its backward reads;
///   selective  the attention core's output and the MLP activation's output are not kept: the
///              backward reruns the attention forward (from the kept q, k, v) and the activation
///              (from the kept fc output) of one block at a time, into one block's slot;
///   full       only each block's input is kept (the previous block's output): the backward reruns
///              the whole block's forward into one block's slot before the block's backward.
/// The rerun kernels see the same inputs as the first forward, so losses and gradients are
/// bitwise those of `none` (dropout masks are regenerated from their keys, nn/dropout.hpp).
enum class recompute { none, selective, full };

/// "none", "selective", "full".
constexpr const char* recompute_name(recompute r) noexcept {
  return r == recompute::full ? "full" : r == recompute::selective ? "selective" : "none";
}

/// Sizes (elements) of the activation table of one rank, capacity (B, T): per-layer tensors
/// hold `layers` (this stage's) layers. Storage-type tensors first, then accumulator-type ones.
struct activation_sizes {
  // storage-type tensors
  std::size_t encoded, ln1, qkv, atty, residual2, ln2, fch, fch_gelu, residual3, lnf, logits;
  std::size_t proj_out, dres, dln, dqkv, datty, dfch, dfch_gelu;  // scratch (not per layer)
  // accumulator-type tensors
  std::size_t ln_stats, att, losses, ce_scratch, attn_scratch;
  std::size_t storage_total, acc_total;
  /// One layer's slice of the per-layer tensors: (B·T, C) ones (ln1, res2, ln2, res3), qkv, the
  /// attention output, fc, the MLP activation, one norm's statistics, the attention's saved state.
  struct {
    std::size_t C, qkv, atty, fch, fchg, stats, att;
  } layer;
};

/// n rounded up to a multiple of 64 elements: every tensor and every layer's slice of the table
/// starts 64-element aligned (64 bytes or more for any element type) from a 64-byte-aligned
/// buffer. So a tensor starts at the same alignment whichever recompute mode places it, and
/// kernels whose rounding depends on alignment (a vector loop's peeled head) give the same bits.
constexpr std::size_t padded(std::size_t n) noexcept { return (n + 63) / 64 * 64; }

/// The widths an activation table is built from (per rank: a tensor-parallel rank holds its
/// slices). `attn_saved` is the attention kernel's saved elements per layer, `attn_scratch` its
/// backward scratch, `ce_scratch` the vocab-parallel cross-entropy's, all in the accumulator type.
struct activation_dims {
  std::size_t B = 1, T = 1, layers = 1;
  std::size_t C = 1;        ///< model width (the residual stream)
  std::size_t qkv = 3;      ///< qkv projection outputs ((NH + 2 KV) C / NH / TP; 3 C / TP without GQA)
  std::size_t att_out = 1;  ///< attention output width (C / TP)
  std::size_t mlp_in = 4;   ///< fc outputs: the MLP hidden width, twice it for SwiGLU (gate and up), / TP
  std::size_t hidden = 4;   ///< MLP hidden width after the activation (d_ff / TP; 4 C / TP for GPT-2)
  std::size_t logits = 1;   ///< vocabulary columns (Vp / TP)
  std::size_t attn_saved = 0, attn_scratch = 0, ce_scratch = 0;
  recompute mode = recompute::none;  ///< which per-layer tensors have one block's slot only
};

/// Layers of a block's saved tensors under recompute mode r: `layers` when kept for every block,
/// 1 (one block's slot, rewritten by the rerun) when recomputed. `rerun_by_selective`: the
/// tensor is an output of the attention core or of the MLP activation.
constexpr std::size_t kept_layers(recompute r, std::size_t layers, bool rerun_by_selective) noexcept {
  if (r == recompute::full || (r == recompute::selective && rerun_by_selective)) return layers > 0 ? 1 : 0;
  return layers;
}

/// The activation table for dims d (nn::transformer::activations). Under recompute, a block's
/// saved tensors hold one block's slot (kept_layers); its output (residual3) is kept per layer.
constexpr activation_sizes activation_table(const activation_dims& d) {
  const std::size_t C = d.C, L = d.layers, BT = d.B * d.T;
  const std::size_t Lk = kept_layers(d.mode, L, false), Lr = kept_layers(d.mode, L, true);
  activation_sizes s{};
  s.layer = {padded(BT * C),           padded(BT * d.qkv),    padded(BT * d.att_out), padded(BT * d.mlp_in),
             padded(BT * d.hidden),    padded(2 * BT),        padded(d.attn_saved)};
  s.encoded = s.layer.C;
  s.ln1 = Lk * s.layer.C;
  s.qkv = Lk * s.layer.qkv;
  s.atty = Lr * s.layer.atty;
  s.residual2 = Lk * s.layer.C;
  s.ln2 = Lk * s.layer.C;
  s.fch = Lk * s.layer.fch;
  s.fch_gelu = Lr * s.layer.fchg;
  s.residual3 = L * s.layer.C;
  s.lnf = s.layer.C;
  s.logits = padded(BT * d.logits);
  s.proj_out = s.layer.C;
  s.dres = s.layer.C;
  s.dln = s.layer.C;
  s.dqkv = s.layer.qkv;
  s.datty = s.layer.atty;
  s.dfch = s.layer.fch;
  s.dfch_gelu = s.layer.fchg;
  s.ln_stats = (1 + 2 * Lk) * s.layer.stats;  // mean and rstd of lnf, then of ln1, ln2 per kept layer (RMSNorm: rstd only)
  s.att = Lr * s.layer.att;  // the attention's saved state: rewritten by the attention's rerun
  s.losses = padded(BT);
  s.ce_scratch = padded(d.ce_scratch);
  s.attn_scratch = padded(d.attn_scratch);
  s.storage_total = s.encoded + s.ln1 + s.qkv + s.atty + s.residual2 + s.ln2 + s.fch + s.fch_gelu +
                    s.residual3 + s.lnf + s.logits + s.proj_out + s.dres + s.dln + s.dqkv + s.datty +
                    s.dfch + s.dfch_gelu;
  s.acc_total = s.ln_stats + s.att + s.losses + s.ce_scratch + s.attn_scratch;
  return s;
}

/// Every activation tensor's start in a table, in buffer order (per-layer tensors: their whole
/// layer range); S the storage type, A the accumulator type. cap = B*T of the table.
template <class S, class A>
struct activation_pointers {
  S *encoded, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3, *lnf, *logits;
  S *proj_out, *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu;
  A *ln_stats, *att, *losses, *ce_scratch, *attn_scratch;
  std::size_t cap;
};

/// What one block saves for its backward (STYLE §3.6), pointers into the table: ln1 (N,C) and its
/// mean/rstd st1 (2 x cap; RMSNorm: rstd only, in the second half), qkv (N,QKV; q and k after
/// RoPE), the attention's saved state att and output atty (N,C/TP), res2 (N,C), ln2 (N,C) and
/// st2, fch (N,mlp_in) / fchg (N,hidden) before and after the activation, res3 (N,C).
template <class S, class A>
struct block_pointers {
  S *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3;
  A *st1, *st2, *att;
  std::size_t cap;
};

/// The tensors of a table of sizes z laid out over the storage buffer s (z.storage_total
/// elements) and the accumulator buffer a (z.acc_total), in activation_sizes' order.
template <class S, class A>
activation_pointers<S, A> carve(const activation_sizes& z, S* s, A* a, std::size_t cap) noexcept {
  activation_pointers<S, A> p{};
  p.cap = cap;
  auto take = [&s](std::size_t n) { S* r = s; s += n; return r; };
  p.encoded = take(z.encoded); p.ln1 = take(z.ln1); p.qkv = take(z.qkv);
  p.atty = take(z.atty); p.residual2 = take(z.residual2); p.ln2 = take(z.ln2);
  p.fch = take(z.fch); p.fch_gelu = take(z.fch_gelu); p.residual3 = take(z.residual3);
  p.lnf = take(z.lnf); p.logits = take(z.logits); p.proj_out = take(z.proj_out);
  p.dres = take(z.dres); p.dln = take(z.dln); p.dqkv = take(z.dqkv);
  p.datty = take(z.datty); p.dfch = take(z.dfch); p.dfch_gelu = take(z.dfch_gelu);
  auto acc = [&a](std::size_t n) { A* r = a; a += n; return r; };
  p.ln_stats = acc(z.ln_stats); p.att = acc(z.att); p.losses = acc(z.losses);
  p.ce_scratch = acc(z.ce_scratch); p.attn_scratch = acc(z.attn_scratch);
  return p;
}

/// Block l's saved state in table p (sizes z, recompute mode r): its own slices, or for the
/// tensors r does not keep the one slot the rerun rewrites (layer 0's place); res3 is always l's.
/// The final norm's statistics come first in ln_stats, then each kept block's two norms'.
template <class S, class A>
block_pointers<S, A> block_of(const activation_sizes& z, const activation_pointers<S, A>& p, recompute r,
                              int l) noexcept {
  const std::size_t i = r == recompute::full ? 0 : std::size_t(l);  // kept per layer
  const std::size_t k = r == recompute::none ? std::size_t(l) : 0;   // rerun by selective
  const auto& y = z.layer;
  return {p.ln1 + i * y.C,        p.qkv + i * y.qkv,   p.atty + k * y.atty,
          p.residual2 + i * y.C,  p.ln2 + i * y.C,     p.fch + i * y.fch,
          p.fch_gelu + k * y.fchg, p.residual3 + std::size_t(l) * y.C,
          p.ln_stats + y.stats + (2 * i) * y.stats, p.ln_stats + y.stats + (2 * i + 1) * y.stats,
          p.att + k * y.att, p.cap};
}

}  // namespace loom::nn
