#pragma once
/// \file Where each element of a rank's parameters lives in the unsharded model, and the
/// gather/scatter of whole per-parameter buffers between a layout and the single-rank layout.
/// The shard rules are the table's (nn/params.hpp): vocab/column rows split per section, row
/// columns split, replicated copies; per-layer rows split across pipeline stages by layer.
/// io::shard_tensor / io::gather_tensor apply the same rules to saved tensors.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/models/configs.hpp>
#include <loom/nn/params.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/layout.hpp>

namespace loom::nn {

/// Index, in the unsharded tensor of table row k of the single-rank model (layout<1,1>), of
/// element i of the local tensor k held by tensor-parallel rank tp_rank of pipeline stage `stage` under layout L.
/// Shard rules as io::shard_tensor: vocab/column split rows (per section: qkv's q, k, v), row split
/// columns, replicated copies; per-layer tensors of stage s start at layer s*n_layer/PP.
template <models::model_config M, parallel::layout_policy L>
constexpr std::size_t global_index(std::size_t k, int tp_rank, int stage, std::size_t i) noexcept {
  constexpr auto t = param_table<M, L>();
  const auto& s = t[k];
  const bool per_layer = s.per_layer;
  // (layers, rows, cols) views of the local and the global tensor
  const std::size_t rows = std::size_t(per_layer ? s.shape[1] : s.shape[0]);
  const std::size_t cols = std::size_t(per_layer ? s.shape[2] : s.shape[1]);
  const std::size_t grows = std::size_t(per_layer ? s.global[1] : s.global[0]);
  const std::size_t gcols = std::size_t(per_layer ? s.global[2] : s.global[1]);
  const std::size_t layer = i / (rows * cols), a = (i / cols) % rows, c = i % cols;
  const std::size_t glayer = per_layer ? std::size_t(stage) * std::size_t(s.shape[0]) + layer : 0;
  std::size_t ga = a, gc = c;
  switch (s.rule) {
    case shard::replicated: break;
    case shard::vocab:
    case shard::column: {
      const std::size_t sections = std::size_t(s.sections);
      const std::size_t part = rows / sections, gpart = grows / sections;
      ga = (a / part) * gpart + std::size_t(tp_rank) * part + a % part;
      break;
    }
    case shard::row: gc = std::size_t(tp_rank) * cols + c; break;
  }
  return (glayer * grows + ga) * gcols + gc;
}

/// Any per-parameter buffer of this rank (parameters, gradients, AdamW moments: `local` holds
/// Model::num_parameters values of type V in param_table<M, layout> order, on the host) in the
/// global shape of the single-rank loom::gpt<M, ...> (param_table<M, layout<1,1>> order), on
/// every rank of the tp x pp group. Each element of the unsharded model is written by exactly
/// one rank (the owner rule of nn::counts_in_norm: sharded tensors by every tp rank at their
/// global indices, replicated ones by tp rank 0, global rows by their owner stage), the others
/// contribute zeros, and the buffers are summed over tp, then pp (x + 0 is exact: the result is
/// bitwise the owners' values). V must be reducible (float, double, bfloat16, half). Memory:
/// one global buffer per rank. Collective over tp and pp; data-parallel replicas hold the same
/// values and need not take part. Throws loom::input_error when local has the wrong size.
template <class Model, class V, class Comm>
std::vector<V> gather_to_global(const Model& model, std::span<const V> local, Comm& tp, Comm& pp) {
  using M = typename Model::model;
  using L = typename Model::layout;
  constexpr auto global_offsets = param_offsets<M, parallel::layout<1, 1>>();
  if (local.size() != Model::num_parameters)
    throw input_error("gather_to_global: " + std::to_string(local.size()) + " values, but this rank of model " +
                      std::string(M::name) + " has " + std::to_string(Model::num_parameters) +
                      " parameters; pass a buffer laid out like model.parameters()");
  std::vector<V> global(global_offsets.back(), V(0));
  for (std::size_t k = 0; k < Model::num_tensors; ++k) {
    if (!counts_in_norm(Model::table[k], model.tp_rank(), model.stage(), L::pp)) continue;
    const std::size_t off = Model::offsets[k], n = Model::table[k].size();
    for (std::size_t i = 0; i < n; ++i)
      global[global_offsets[k] + global_index<M, L>(k, model.tp_rank(), model.stage(), i)] = local[off + i];
  }
  if constexpr (Model::TP > 1) tp.all_reduce(std::span<V>(global), parallel::reduce_op::sum);
  if constexpr (Model::PP > 1) pp.all_reduce(std::span<V>(global), parallel::reduce_op::sum);
  return global;
}

/// This rank's slices of a whole-model buffer: local[offset(p) + i] = global[global offset(p) +
/// global_index(p, tp_rank, stage, i)] for every tensor p (also those the stage does not use).
/// The inverse of gather_to_global; re-shards single-rank parameters or optimizer moments onto
/// any layout. Local, no communication. Throws loom::input_error on wrong sizes.
template <class Model, class V>
void scatter_from_global(const Model& model, std::span<const V> global, std::span<V> local) {
  using M = typename Model::model;
  using L = typename Model::layout;
  constexpr auto global_offsets = param_offsets<M, parallel::layout<1, 1>>();
  if (global.size() != global_offsets.back() || local.size() != Model::num_parameters)
    throw input_error("scatter_from_global: " + std::to_string(global.size()) + " global and " +
                      std::to_string(local.size()) + " local values for model " + std::string(M::name) + ", which has " +
                      std::to_string(global_offsets.back()) + " parameters (" + std::to_string(Model::num_parameters) +
                      " on this rank); pass the single-rank model's buffer (gather_to_global)");
  for (std::size_t k = 0; k < Model::num_tensors; ++k) {
    const std::size_t off = Model::offsets[k], n = Model::table[k].size();
    for (std::size_t i = 0; i < n; ++i)
      local[off + i] = global[global_offsets[k] + global_index<M, L>(k, model.tp_rank(), model.stage(), i)];
  }
}

/// The parameters of the whole model in the buffer order of the single-rank loom::gpt (copy them
/// into gpt::parameters() to run the unsharded model: sampling, export), on every rank of the
/// tp x pp group: gather_to_global of model.parameters() (copied to the host first).
/// Collective over tp and pp.
template <class Model, class Comm>
std::vector<typename Model::storage_t> gather_parameters(context<typename Model::device>& ctx, const Model& model,
                                                         Comm& tp, Comm& pp) {
  using S = typename Model::storage_t;
  std::vector<S> local(Model::num_parameters);
  Model::device::copy_to_host(local.data(), model.parameters().data(), local.size() * sizeof(S), ctx.stream);
  ctx.synchronize();
  return gather_to_global(model, std::span<const S>(local), tp, pp);
}

/// Sets this rank's parameters from the whole model's `global` parameters (the single-rank
/// loom::gpt buffer order, as gather_parameters returns): scatter_from_global, then a copy to
/// the device. Re-shards a single-rank checkpoint or imported weights onto any layout. Local,
/// no communication. Throws loom::input_error when global has the wrong size.
template <class Model>
void load_global_parameters(context<typename Model::device>& ctx, Model& model,
                            std::span<const typename Model::storage_t> global) {
  using S = typename Model::storage_t;
  std::vector<S> local(Model::num_parameters);
  scatter_from_global(model, global, std::span<S>(local));
  Model::device::copy_to_device(model.parameters().data(), local.data(), local.size() * sizeof(S), ctx.stream);
  ctx.synchronize();
}

}  // namespace loom::nn
