#pragma once
/// \file The compile-time parameter table of a GPT (llm.c's ParameterTensors, as data).
///
/// One row per parameter tensor, in a fixed order; all rows of one rank live in one
/// contiguous buffer, addressed by the row's offset. Shapes are the per-rank (local) shapes
/// after the tensor-parallel split; `global` keeps the logical shape so checkpoints can be
/// resharded. Linear weights are (out, in) like torch.nn.Linear.
#include <array>
#include <cstddef>
#include <string_view>

#include <loom/models/configs.hpp>
#include <loom/parallel/layout.hpp>

namespace loom::nn {

/// Parameter tensors, in buffer order.
enum class param : int {
  wte, wpe, ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b,
  ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b, lnf_w, lnf_b, count
};
inline constexpr int num_param_tensors = int(param::count);

/// How a tensor is split across tensor-parallel ranks (Megatron-LM semantics).
enum class shard : unsigned char {
  replicated,  ///< identical on every tp rank (LayerNorm, row-parallel bias, position embedding)
  column,      ///< output rows split (qkv, fc1: ColumnParallelLinear)
  row,         ///< input columns split (attention proj, fc2: RowParallelLinear)
  vocab,       ///< vocabulary rows split (VocabParallelEmbedding / tied LM head)
};

/// How a parameter is initialised (GPT-2, Radford et al. 2019; llm.c/nanoGPT practice).
enum class init : unsigned char { normal, residual_normal, ones, zeros };

/// One row of the table. shape[0] is the per-stage layer count for per-layer tensors.
struct param_spec {
  std::string_view name;
  int ndim;                       ///< 1..3
  std::array<long, 3> shape;      ///< local (per-rank) shape, unused dims = 1
  std::array<long, 3> global;     ///< logical shape across tp ranks (same layer count)
  bool decay;                     ///< receives AdamW weight decay by default
  shard rule;
  init how;
  constexpr std::size_t size() const { return std::size_t(shape[0]) * shape[1] * shape[2]; }
};

/// The table for model M under layout L (layers per pipeline stage = n_layer / pp).
template <models::model_config M, parallel::layout_policy L>
consteval std::array<param_spec, num_param_tensors> param_table() {
  (void)parallel::fits<L, M>();
  constexpr long C = M::d_model, Vp = M::vocab_padded, Ls = M::n_layer / L::pp, tp = L::tp;
  using enum shard;
  using enum init;
  return {{
      {"wte", 2, {Vp / tp, C, 1}, {Vp, C, 1}, false, vocab, normal},
      {"wpe", 2, {M::max_seq, C, 1}, {M::max_seq, C, 1}, false, replicated, normal},
      {"ln1_w", 2, {Ls, C, 1}, {Ls, C, 1}, false, replicated, ones},
      {"ln1_b", 2, {Ls, C, 1}, {Ls, C, 1}, false, replicated, zeros},
      {"qkv_w", 3, {Ls, 3 * C / tp, C}, {Ls, 3 * C, C}, true, column, normal},
      {"qkv_b", 2, {Ls, 3 * C / tp, 1}, {Ls, 3 * C, 1}, false, column, zeros},
      {"attproj_w", 3, {Ls, C, C / tp}, {Ls, C, C}, true, row, residual_normal},
      {"attproj_b", 2, {Ls, C, 1}, {Ls, C, 1}, false, replicated, zeros},
      {"ln2_w", 2, {Ls, C, 1}, {Ls, C, 1}, false, replicated, ones},
      {"ln2_b", 2, {Ls, C, 1}, {Ls, C, 1}, false, replicated, zeros},
      {"fc_w", 3, {Ls, 4 * C / tp, C}, {Ls, 4 * C, C}, true, column, normal},
      {"fc_b", 2, {Ls, 4 * C / tp, 1}, {Ls, 4 * C, 1}, false, column, zeros},
      {"fcproj_w", 3, {Ls, C, 4 * C / tp}, {Ls, C, 4 * C}, true, row, residual_normal},
      {"fcproj_b", 2, {Ls, C, 1}, {Ls, C, 1}, false, replicated, zeros},
      {"lnf_w", 1, {C, 1, 1}, {C, 1, 1}, false, replicated, ones},
      {"lnf_b", 1, {C, 1, 1}, {C, 1, 1}, false, replicated, zeros},
  }};
}

/// Element offsets of each table row in the parameter buffer, plus the total at the end.
template <models::model_config M, parallel::layout_policy L>
consteval std::array<std::size_t, num_param_tensors + 1> param_offsets() {
  constexpr auto t = param_table<M, L>();
  std::array<std::size_t, num_param_tensors + 1> off{};
  for (int i = 0; i < num_param_tensors; ++i) off[i + 1] = off[i] + t[i].size();
  return off;
}

/// Number of parameters of the whole (unsharded) model; `with_position` false excludes wpe,
/// which is the N of the MFU formula (Kaplan et al. 2020, "Scaling Laws", §2.1).
template <models::model_config M>
consteval std::size_t parameter_count(bool with_position = true) {
  constexpr std::size_t C = M::d_model, L = M::n_layer;
  const std::size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return std::size_t(M::vocab_padded) * C + (with_position ? std::size_t(M::max_seq) * C : 0) + L * per_layer + 2 * C;
}

static_assert(param_offsets<models::gpt2_small, parallel::ddp>().back() == parameter_count<models::gpt2_small>());

}  // namespace loom::nn
