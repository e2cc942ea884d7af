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

/// Sizes (elements) of the activation table of one rank, capacity (B, T): per-layer tensors
/// hold `layers` (this stage's) layers. Storage-type tensors first, then accumulator-type ones.
struct activation_sizes {
  // storage-type tensors
  std::size_t encoded, ln1, qkv, atty, residual2, ln2, fch, fch_gelu, residual3, lnf, logits;
  std::size_t proj_out, dres, dln, dqkv, datty, dfch, dfch_gelu;  // scratch (not per layer)
  // accumulator-type tensors
  std::size_t ln_stats, att, losses, ce_scratch, attn_scratch;
  std::size_t storage_total, acc_total;
};

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
};

/// The activation table for dims d (nn::transformer::activations).
constexpr activation_sizes activation_table(const activation_dims& d) {
  const std::size_t C = d.C, L = d.layers, BT = d.B * d.T;
  activation_sizes s{};
  s.encoded = BT * C;
  s.ln1 = L * BT * C;
  s.qkv = L * BT * d.qkv;
  s.atty = L * BT * d.att_out;
  s.residual2 = L * BT * C;
  s.ln2 = L * BT * C;
  s.fch = L * BT * d.mlp_in;
  s.fch_gelu = L * BT * d.hidden;
  s.residual3 = L * BT * C;
  s.lnf = BT * C;
  s.logits = BT * d.logits;
  s.proj_out = BT * C;
  s.dres = BT * C;
  s.dln = BT * C;
  s.dqkv = BT * d.qkv;
  s.datty = BT * d.att_out;
  s.dfch = BT * d.mlp_in;
  s.dfch_gelu = BT * d.hidden;
  s.ln_stats = (2 * L + 1) * 2 * BT;  // mean and rstd of ln1, ln2 per layer, and lnf (RMSNorm: rstd only)
  s.att = L * d.attn_saved;
  s.losses = BT;
  s.ce_scratch = d.ce_scratch;
  s.attn_scratch = d.attn_scratch;
  s.storage_total = s.encoded + s.ln1 + s.qkv + s.atty + s.residual2 + s.ln2 + s.fch + s.fch_gelu +
                    s.residual3 + s.lnf + s.logits + s.proj_out + s.dres + s.dln + s.dqkv + s.datty +
                    s.dfch + s.dfch_gelu;
  s.acc_total = s.ln_stats + s.att + s.losses + s.ce_scratch + s.attn_scratch;
  return s;
}

}  // namespace loom::nn
