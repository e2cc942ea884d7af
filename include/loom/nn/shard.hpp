#pragma once
/// \file Where each element of a rank's parameters lives in the unsharded model, and the
/// gather/scatter of whole per-parameter buffers between a layout and the single-rank layout.
/// The shard rules are the table's (models/params.hpp): vocab/column rows split per section, row
/// columns split, replicated copies; per-layer rows split across pipeline stages by layer.
/// shard_geometry is the one description of that mapping; io::shard_tensor / io::gather_tensor
/// apply it to saved tensors.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/models/configs.hpp>
#include <loom/models/params.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/core/layout.hpp>

namespace loom::nn {

/// How one parameter tensor maps onto ranks: the one description of the shard geometry, used
/// by the model (initialisation, gather/scatter), the checkpoint's resharding (io/checkpoint)
/// and the tests. A tensor is viewed as (layers, rows, cols): per-layer tensors have layers =
/// n_layer (split across pipeline stages, stage s holding layers [s*n/pp, (s+1)*n/pp)), the
/// others layers = 1 (held whole by every stage). Tensor parallelism splits rows (shard::vocab
/// and shard::column; a column tensor with `sections` = 3, qkv, splits each of its q, k, v
/// sections so a rank owns whole heads of all three: Megatron-LM's ColumnParallelLinear on a
/// fused QKV) or cols (shard::row: RowParallelLinear), or replicates. Sections may differ in
/// size: section q holds rows * parts[q] / (sum of parts) rows (grouped-query attention's qkv:
/// parts {n_head, n_kv_head, n_kv_head}).
struct shard_geometry {
  models::shard rule = models::shard::replicated;
  bool per_layer = false;
  long layers = 1, rows = 1, cols = 1;  ///< the logical (unsharded) shape
  int sections = 1;
  std::array<int, 3> parts{1, 1, 1};   ///< relative section sizes (the first `sections` count)
  constexpr std::size_t logical_elems() const noexcept { return std::size_t(layers) * rows * cols; }
  /// Sum of the first `sections` parts.
  constexpr long part_sum() const noexcept {
    long n = 0;
    for (int q = 0; q < sections && q < 3; ++q) n += parts[std::size_t(q)];
    return n;
  }
  /// Logical rows of section q.
  constexpr long section_rows(int q) const noexcept { return rows / part_sum() * parts[std::size_t(q)]; }
  /// First logical row of section q.
  constexpr long section_begin(int q) const noexcept {
    long r = 0;
    for (int j = 0; j < q; ++j) r += section_rows(j);
    return r;
  }
};

/// The geometry of table row s of a table made for `pp` pipeline stages (param_table<M,
/// layout<TP, pp>>: its `global` shape is unsplit across tp but holds one stage's layers).
constexpr shard_geometry geometry_of(const models::param_spec& s, int pp) noexcept {
  shard_geometry g;
  g.rule = s.rule;
  g.per_layer = s.per_layer;
  if (g.per_layer) {
    g.layers = s.global[0] * pp;
    g.rows = s.global[1];
    g.cols = s.ndim == 3 ? s.global[2] : 1;
  } else {
    g.rows = s.global[0];
    g.cols = s.ndim == 2 ? s.global[1] : 1;
  }
  g.sections = s.sections;
  g.parts = s.parts;
  return g;
}

/// Whether degrees (tp, pp) split a tensor of geometry g evenly (layers by pp, each section's
/// rows or the columns by tp).
constexpr bool splits(const shard_geometry& g, int tp, int pp) noexcept {
  if (tp < 1 || pp < 1 || (g.per_layer && g.layers % pp != 0)) return false;
  switch (g.rule) {
    case models::shard::replicated: return true;
    case models::shard::row: return g.cols % tp == 0;
    case models::shard::vocab:
    case models::shard::column: {
      if (g.sections < 1 || g.sections > 3 || g.part_sum() < 1 || g.rows % g.part_sum() != 0) return false;
      for (int q = 0; q < g.sections; ++q)
        if (g.parts[std::size_t(q)] < 1 || g.section_rows(q) % tp != 0) return false;
      return true;
    }
  }
  return false;
}

/// Index, in the logical tensor of geometry g, of element i of the local tensor held by
/// tensor-parallel rank tp_rank of pipeline stage `stage` under degrees (tp, pp). Requires
/// splits(g, tp, pp). The element form of for_each_shard_run (tests check they agree).
constexpr std::size_t global_index(const shard_geometry& g, int tp, int pp, int tp_rank, int stage,
                                   std::size_t i) noexcept {
  const bool sharded_rows = g.rule == models::shard::vocab || g.rule == models::shard::column;
  const std::size_t rows = std::size_t(sharded_rows ? g.rows / tp : g.rows);
  const std::size_t cols = std::size_t(g.rule == models::shard::row ? g.cols / tp : g.cols);
  const std::size_t layers = std::size_t(g.per_layer ? g.layers / pp : g.layers);
  const std::size_t layer = i / (rows * cols), a = (i / cols) % rows, c = i % cols;
  const std::size_t glayer = g.per_layer ? std::size_t(stage) * layers + layer : 0;
  std::size_t ga = a, gc = c;
  if (sharded_rows) {
    std::size_t q = 0, local0 = 0;  // section of local row a, and its first local row
    while (q + 1 < std::size_t(g.sections) && a >= local0 + std::size_t(g.section_rows(int(q)) / tp))
      local0 += std::size_t(g.section_rows(int(q++)) / tp);
    const std::size_t part = std::size_t(g.section_rows(int(q)) / tp);
    ga = std::size_t(g.section_begin(int(q))) + std::size_t(tp_rank) * part + (a - local0);
  } else if (g.rule == models::shard::row) {
    gc = std::size_t(tp_rank) * cols + c;
  }
  return (glayer * std::size_t(g.rows) + ga) * std::size_t(g.cols) + gc;
}

/// Index, in the unsharded tensor of table row k of the single-rank model (layout<1,1>), of
/// element i of the local tensor k held by tensor-parallel rank tp_rank of pipeline stage
/// `stage` under layout L: global_index on the row's geometry.
template <models::model_config M, parallel::layout_policy L>
constexpr std::size_t global_index(std::size_t k, int tp_rank, int stage, std::size_t i) noexcept {
  constexpr auto t = models::param_table<M, L>();
  return global_index(geometry_of(t[k], L::pp), L::tp, L::pp, tp_rank, stage, i);
}

/// Calls f(logical_offset, local_offset, count) for every contiguous run of elements of rank
/// (tp_rank, stage)'s shard of a tensor of geometry g under degrees (tp, pp), in local order.
/// Throws loom::input_error when the degrees do not split the tensor (splits()).
template <class F>
void for_each_shard_run(const shard_geometry& g, int tp, int pp, int tp_rank, int stage, F&& f) {
  if (!splits(g, tp, pp))
    throw input_error("cannot split a (" + std::to_string(g.layers) + ", " + std::to_string(g.rows) + ", " +
                      std::to_string(g.cols) + ") tensor over tp = " + std::to_string(tp) + ", pp = " +
                      std::to_string(pp) + "; choose degrees that divide the model (see models::fits)");
  const long layers = g.per_layer ? g.layers / pp : g.layers;
  const long first_layer = g.per_layer ? stage * layers : 0;
  std::size_t local = 0;
  for (long l = 0; l < layers; ++l) {
    const std::size_t base = std::size_t(first_layer + l) * g.rows * g.cols;
    switch (g.rule) {
      case models::shard::replicated:
        f(base, local, std::size_t(g.rows) * g.cols);
        local += std::size_t(g.rows) * g.cols;
        break;
      case models::shard::vocab:
      case models::shard::column: {
        for (int q = 0; q < g.sections; ++q) {
          const long part = g.section_rows(q) / tp;
          const std::size_t row0 = std::size_t(g.section_begin(q)) + std::size_t(tp_rank) * part;
          f(base + row0 * g.cols, local, std::size_t(part) * g.cols);
          local += std::size_t(part) * g.cols;
        }
        break;
      }
      case models::shard::row: {
        const long part = g.cols / tp;
        for (long i = 0; i < g.rows; ++i) {
          f(base + std::size_t(i) * g.cols + std::size_t(tp_rank) * part, local, std::size_t(part));
          local += std::size_t(part);
        }
        break;
      }
    }
  }
}

/// Elements of one rank's shard of a tensor of geometry g under degrees (tp, pp) (the same on
/// every rank). Throws loom::input_error when the degrees do not split the tensor.
inline std::size_t shard_elems(const shard_geometry& g, int tp, int pp) {
  std::size_t n = 0;
  for_each_shard_run(g, tp, pp, 0, 0, [&](std::size_t, std::size_t, std::size_t c) { n += c; });
  return n;
}

/// Any per-parameter buffer of this rank (parameters, gradients, AdamW moments: `local` holds
/// Model::num_parameters values of type V in param_table<M, layout> order, on the host) in the
/// global shape of the single-rank loom::nn::transformer<M, ...> (param_table<M, layout<1,1>> order), on
/// every rank of the tp x pp group. Each element of the unsharded model is written by exactly
/// one rank (the owner rule of models::counts_in_norm: sharded tensors by every tp rank at their
/// global indices, replicated ones by tp rank 0, global rows by their owner stage), the others
/// contribute zeros, and the buffers are summed over tp, then pp (x + 0 is exact: the result is
/// bitwise the owners' values). V must be reducible (float, double, bfloat16, half). Memory:
/// one global buffer per rank. Collective over tp and pp; data-parallel replicas hold the same
/// values and need not take part. Throws loom::input_error when local has the wrong size.
template <class Model, class V, class Comm>
std::vector<V> gather_to_global(const Model& model, std::span<const V> local, Comm& tp, Comm& pp) {
  using M = typename Model::model;
  using L = typename Model::layout;
  constexpr auto global_offsets = models::param_offsets<M, parallel::layout<1, 1>>();
  if (local.size() != Model::num_parameters)
    throw input_error("gather_to_global: " + std::to_string(local.size()) + " values, but this rank of model " +
                      std::string(M::name) + " has " + std::to_string(Model::num_parameters) +
                      " parameters; pass a buffer laid out like model.parameters()");
  std::vector<V> global(global_offsets.back(), V(0));
  for (std::size_t k = 0; k < Model::num_tensors; ++k) {
    if (!models::counts_in_norm(Model::table[k], model.tp_rank(), model.stage(), L::pp)) continue;
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
  constexpr auto global_offsets = models::param_offsets<M, parallel::layout<1, 1>>();
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

/// The parameters of the whole model in the buffer order of the single-rank loom::nn::transformer (copy them
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
/// loom::nn::transformer buffer order, as gather_parameters returns): scatter_from_global, then a copy to
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
