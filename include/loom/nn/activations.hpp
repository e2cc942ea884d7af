#pragma once
/// \file The compile-time activation table of a GPT for micro-batch B and sequence T.
///
/// Everything the forward pass saves for backward, plus the backward scratch, lives in two
/// contiguous buffers allocated once (no allocation inside the training step): one of the
/// storage type S, one of the accumulator type A (LayerNorm statistics, attention saved
/// state, per-token losses). The attention implementation decides its saved size, so the
/// table — and the memory the trainer reports — changes with the choice (reference keeps
/// B·NH·T² probabilities per layer).
#include <array>
#include <cstddef>

#include <loom/models/configs.hpp>

namespace loom::nn {

/// Sizes (elements) of the activation table for model M on one rank, capacity (B, T).
/// `attn_saved` is the attention kernel's saved elements per layer, `attn_scratch` its
/// backward scratch, both in the accumulator type.
struct activation_sizes {
  // storage-type tensors
  std::size_t encoded, ln1, qkv, atty, residual2, ln2, fch, fch_gelu, residual3, lnf, logits;
  std::size_t proj_out, dres, dln, dqkv, datty, dfch, dfch_gelu;  // scratch (not per layer)
  // accumulator-type tensors
  std::size_t ln_stats, att, losses, attn_scratch;
  std::size_t storage_total, acc_total;
};

template <models::model_config M>
constexpr activation_sizes activation_table(std::size_t B, std::size_t T, std::size_t attn_saved,
                                            std::size_t attn_scratch) {
  const std::size_t C = M::d_model, L = M::n_layer, BT = B * T;
  activation_sizes s{};
  s.encoded = BT * C;
  s.ln1 = L * BT * C;
  s.qkv = L * BT * 3 * C;
  s.atty = L * BT * C;
  s.residual2 = L * BT * C;
  s.ln2 = L * BT * C;
  s.fch = L * BT * 4 * C;
  s.fch_gelu = L * BT * 4 * C;
  s.residual3 = L * BT * C;
  s.lnf = BT * C;
  s.logits = BT * std::size_t(M::vocab_padded);
  s.proj_out = BT * C;
  s.dres = BT * C;
  s.dln = BT * C;
  s.dqkv = BT * 3 * C;
  s.datty = BT * C;
  s.dfch = BT * 4 * C;
  s.dfch_gelu = BT * 4 * C;
  s.ln_stats = (2 * L + 1) * 2 * BT;  // mean and rstd of ln1, ln2 per layer, and lnf
  s.att = L * attn_saved;
  s.losses = BT;
  s.attn_scratch = attn_scratch;
  s.storage_total = s.encoded + s.ln1 + s.qkv + s.atty + s.residual2 + s.ln2 + s.fch + s.fch_gelu +
                    s.residual3 + s.lnf + s.logits + s.proj_out + s.dres + s.dln + s.dqkv + s.datty +
                    s.dfch + s.dfch_gelu;
  s.acc_total = s.ln_stats + s.att + s.losses + s.attn_scratch;
  return s;
}

}  // namespace loom::nn
