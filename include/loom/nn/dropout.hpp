#pragma once
/// \file Where and with which random stream nn::transformer applies dropout during training.
///
/// GPT-2 / Megatron-LM places (Radford et al. 2019; Megatron's `hidden_dropout` and
/// `attention_dropout`), all with one probability p:
///   embedding           after token + position embedding, before the first block
///   attention           on the attention probabilities, inside the fused kernel
///   attention_residual  on the attention output projection, before its residual add
///   mlp_residual        on the MLP output projection, before its residual add
/// Inverted dropout (Srivastava et al. 2014; PyTorch F.dropout): kept values scaled by 1/(1-p).
///
/// Note [dropout masks are regenerated]: every mask is counter-based (core/dropout.hpp): the
/// keep flag of an element is a hash of (seed, optimizer step, global micro-batch index, site,
/// global layer, element index), where the element index is the position in the unsharded
/// tensor ((b, t, channel) for the residual streams, (b, global head, query, key) for the
/// attention probabilities). Backward recomputes the same flags instead of storing a mask:
/// storing would cost one byte per element (B·T·C per stream and layer, B·NH·T² for the
/// attention probabilities — the memory the fused kernel exists to avoid), recomputing costs
/// one 64-bit hash per element, which is small next to the GEMMs around it. Consequences:
/// a resumed run draws the masks of the uninterrupted run (nothing to checkpoint but the step);
/// tensor-parallel ranks draw identical masks for replicated tensors (the residual streams,
/// the embedding output) and each its own slice for the heads it owns, so TP > 1 equals TP = 1;
/// pipeline stages use global layer indices, so PP > 1 equals PP = 1.
#include <cstdint>

#include <loom/core/dropout.hpp>

namespace loom::nn {

/// The places dropout applies (the `site` of dropout_site_key).
enum class dropout_site : std::uint64_t { embedding = 1, attention = 2, attention_residual = 3, mlp_residual = 4 };

/// The dropout of one forward pass: probability p in [0, 1) and the pass key (dropout_key).
/// The default is off. Evaluation and sampling pass the default.
struct dropout_state {
  double p = 0;           ///< drop probability; 0 = off
  std::uint64_t key = 0;  ///< dropout_key(seed, step, global micro-batch index)

  /// True when this pass drops anything (p > 0).
  bool active() const noexcept { return p > 0; }
  /// The mask of one site and global layer (0 for the embedding). Throws loom::input_error
  /// unless 0 <= p < 1.
  dropout_mask mask(dropout_site site, int layer) const {
    return make_dropout_mask(p, dropout_site_key(key, std::uint64_t(site), std::uint64_t(layer)));
  }
};

/// The dropout of one optimizer step's micro-batches: micro-batch i of this rank runs with
/// at(i) = {p, dropout_key(seed, step, first_micro + i)}. first_micro = dp_rank * grad_accum makes
/// the index global over the data-parallel group. The default is off.
struct dropout_plan {
  double p = 0;              ///< drop probability in [0, 1)
  std::uint64_t seed = 0;    ///< the run's dropout seed
  std::uint64_t step = 0;    ///< optimizer step (the trainer's step_count())
  std::uint64_t first_micro = 0;  ///< global index of this rank's micro-batch 0

  /// The dropout of local micro-batch `micro` (0-based) of the step; off when p is 0.
  dropout_state at(int micro) const noexcept {
    if (!(p > 0)) return {};
    return {p, dropout_key(seed, step, first_micro + std::uint64_t(micro))};
  }
};

}  // namespace loom::nn
