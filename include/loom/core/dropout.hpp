#pragma once
/// \file Counter-based dropout masks: whether element i of a tensor is kept is a pure function
/// of (key, i), so backward regenerates forward's mask instead of storing it, any shard of a
/// tensor draws exactly its elements of the unsharded tensor's mask, and a resumed run draws
/// the masks of the uninterrupted one.
///
/// Inverted dropout (Srivastava et al., "Dropout: A Simple Way to Prevent Neural Networks from
/// Overfitting", JMLR 15, 2014; PyTorch `torch.nn.functional.dropout`): a kept element is
/// scaled by 1/(1-p), a dropped one is 0, so the expectation is unchanged and evaluation runs
/// without dropout. Bits: one SplitMix64 finaliser of key + i (core/random.hpp), whose top 32
/// bits are compared with round(p * 2^32): the kept fraction is exactly 1 - threshold/2^32 over
/// the 2^32 values (p rounded to a multiple of 2^-32; p < 2^-33 is off). Not the Philox stream
/// of PyTorch/cuRAND: masks are loom's own, and tests compare against PyTorch by exporting them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <loom/core/error.hpp>
#include <loom/core/random.hpp>

namespace loom {

/// One tensor's keep-mask: element i is kept iff keep(i); a kept value is multiplied by scale.
/// Trivially copyable, cheap to pass by value. The default is inactive (keep everything, scale 1).
struct dropout_mask {
  std::uint64_t key = 0;        ///< the tensor's stream (dropout_key / dropout_site_key)
  std::uint32_t threshold = 0;  ///< round(p * 2^32); 0 = inactive
  double scale = 1;             ///< 1 / (1 - p); rounded to the element type where applied

  /// True when some element may be dropped (p > 0).
  constexpr bool active() const noexcept { return threshold != 0; }
  /// Whether element i is kept (always true when inactive).
  constexpr bool keep(std::uint64_t i) const noexcept {
    return std::uint32_t(splitmix64(key + i) >> 32) >= threshold;
  }
  /// The factor element i is multiplied by: scale if kept, 0 if dropped.
  template <class A>
  constexpr A factor(std::uint64_t i) const noexcept {
    return keep(i) ? A(scale) : A(0);
  }
};

/// Throws loom::input_error unless 0 <= p < 1 (NaN included). `what` names the setting (e.g.
/// "--dropout") so the message tells the user which flag to change. Allocates nothing unless it
/// throws (the model calls it every forward).
inline void check_dropout_probability(double p, const char* what) {
  if (!(p >= 0.0 && p < 1.0)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", p);
    throw input_error(std::string(what) + " " + text +
                      " is not a dropout probability: it must satisfy 0 <= p < 1 (0 turns dropout off, "
                      "0.1 is GPT-2's value)");
  }
}

/// The mask of drop probability p over stream `key`. Throws loom::input_error unless 0 <= p < 1.
inline dropout_mask make_dropout_mask(double p, std::uint64_t key) {
  check_dropout_probability(p, "dropout probability");
  const double t = std::round(p * 4294967296.0);
  if (t <= 0) return {};
  return {key, std::uint32_t(std::min(t, 4294967295.0)), 1.0 / (1.0 - p)};
}

/// The key of one forward pass: (seed, optimizer step, micro-batch index). Micro-batch indices
/// count over the data-parallel group (dp rank * micro-batches per rank + local index), so the
/// masks of a run do not depend on how its global batch is split.
constexpr std::uint64_t dropout_key(std::uint64_t seed, std::uint64_t step, std::uint64_t micro) noexcept {
  return random_bits(seed ^ 0x64726f706f7574ULL, step, micro);  // "dropout": apart from init's streams
}

/// The key of one tensor of a forward pass: `site` names the place (nn::dropout_site), `layer`
/// the global layer index (0 for the embedding).
constexpr std::uint64_t dropout_site_key(std::uint64_t pass_key, std::uint64_t site, std::uint64_t layer) noexcept {
  return random_bits(pass_key, site, layer);
}

/// Attention-probability dropout of one attention call (PyTorch's
/// `scaled_dot_product_attention(..., dropout_p=p)`, Megatron's attention_dropout): after the
/// softmax, probability (b, h, i, j) is kept with probability 1-p and then scaled by 1/(1-p),
/// dropped (0) otherwise; the normaliser is the undropped row sum, as in PyTorch.
/// The keep flag is mask.keep(((b * heads + head_offset + h) * T + i) * T + j) for batch b, local
/// head h, query i, key j of a (B, NH, T) call: keyed by the GLOBAL head, so the heads a
/// tensor-parallel rank owns draw exactly the single-rank model's masks. Nothing is stored:
/// backward regenerates each tile's mask. Default: inactive (no dropout).
struct attention_dropout {
  dropout_mask mask;    ///< the layer's mask (dropout_site_key); inactive = no dropout
  int head_offset = 0;  ///< global index of this call's head 0 (tp_rank * NH/TP)
  int heads = 0;        ///< global head count (NH of the unsharded model); 0 = this call's NH
};

/// Whether probability (b, h, i, j) of a call with NH local heads and sequence length T is kept
/// under `d` (the function the kernels evaluate; for tests and exports). b in [0, B), h in
/// [0, NH), i, j in [0, T); always true when d is inactive.
inline bool attention_dropout_keep(const attention_dropout& d, int NH, int T, int b, int h, int i, int j) noexcept {
  const std::uint64_t heads = std::uint64_t(d.heads > 0 ? d.heads : NH);
  return d.mask.keep(((std::uint64_t(b) * heads + std::uint64_t(d.head_offset + h)) * std::uint64_t(T) +
                      std::uint64_t(i)) * std::uint64_t(T) + std::uint64_t(j));
}

}  // namespace loom
