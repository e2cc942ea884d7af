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

}  // namespace loom::nn
