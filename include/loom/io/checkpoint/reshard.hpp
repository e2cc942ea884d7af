#pragma once
/// \file Resharding of saved tensors between layouts: pure functions over nn::shard_geometry
/// (nn/shard.hpp, the one description of how a tensor maps onto ranks). See docs/checkpoint.md
/// "Resharding".
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/models/configs.hpp>
#include <loom/models/params.hpp>
#include <loom/nn/shard.hpp>
#include <loom/core/layout.hpp>

namespace loom::io {

using nn::shard_elems;
using nn::shard_geometry;

/// The geometry of table row k for model M (nn::geometry_of of the unsplit table's row).
template <models::model_config M>
constexpr shard_geometry geometry_of(std::size_t k) {
  constexpr auto t = models::param_table<M, parallel::layout<1, 1>>();
  return nn::geometry_of(t[k], 1);
}

/// The logical (whole-model) shape of table row k for model M, as recorded in manifests.
template <models::model_config M>
std::vector<std::int64_t> logical_shape(std::size_t k) {
  constexpr auto t = models::param_table<M, parallel::layout<1, 1>>();
  const auto& s = t[k];
  return std::vector<std::int64_t>(s.global.begin(), s.global.begin() + s.ndim);
}

/// The shard of tensor `logical` (row-major, g.logical_elems() elements of elem_size bytes)
/// held by tensor-parallel rank tp_rank of pipeline stage pp_rank under degrees (tp, pp).
/// Pure function. Throws loom::input_error when the sizes or degrees do not fit.
inline std::vector<std::byte> shard_tensor(const shard_geometry& g, std::size_t elem_size,
                                           std::span<const std::byte> logical, int tp, int pp, int tp_rank,
                                           int pp_rank) {
  if (logical.size() != g.logical_elems() * elem_size)
    throw input_error("shard_tensor: the logical tensor has " + std::to_string(logical.size()) + " bytes, not " +
                      std::to_string(g.logical_elems() * elem_size) + "; pass the whole tensor");
  std::vector<std::byte> out(shard_elems(g, tp, pp) * elem_size);
  nn::for_each_shard_run(g, tp, pp, tp_rank, pp_rank, [&](std::size_t from, std::size_t to, std::size_t n) {
    std::memcpy(out.data() + to * elem_size, logical.data() + from * elem_size, n * elem_size);
  });
  return out;
}

/// The logical tensor assembled from the shards of all ranks under degrees (tp, pp):
/// shard(tp_rank, pp_rank) returns that rank's bytes. Replicated pieces are taken from tensor
/// rank 0 (and, for tensors every stage holds whole, from stage 0). Inverse of shard_tensor.
template <class ShardFn>
std::vector<std::byte> gather_tensor(const shard_geometry& g, std::size_t elem_size, ShardFn&& shard, int tp,
                                     int pp) {
  std::vector<std::byte> out(g.logical_elems() * elem_size);
  const int stages = g.per_layer ? pp : 1;
  const int tps = g.rule == models::shard::replicated ? 1 : tp;
  for (int s = 0; s < stages; ++s)
    for (int r = 0; r < tps; ++r) {
      const std::span<const std::byte> src = shard(r, s);
      if (src.size() != shard_elems(g, tp, pp) * elem_size)
        throw input_error("gather_tensor: the shard of tp rank " + std::to_string(r) + ", stage " + std::to_string(s) +
                          " has " + std::to_string(src.size()) + " bytes, not " +
                          std::to_string(shard_elems(g, tp, pp) * elem_size) + "; the checkpoint does not match the layout");
      nn::for_each_shard_run(g, tp, pp, r, s, [&](std::size_t to, std::size_t from, std::size_t n) {
        std::memcpy(out.data() + to * elem_size, src.data() + from * elem_size, n * elem_size);
      });
    }
  return out;
}

/// Reshards one tensor from degrees (tp_a, pp_a) to (tp_b, pp_b): out[pp][tp] = the shard of
/// rank (tp, pp) under the new degrees. Pure function: shard_tensor(gather_tensor(...)).
template <class ShardFn>
std::vector<std::vector<std::vector<std::byte>>> reshard_tensor(const shard_geometry& g, std::size_t elem_size,
                                                                  ShardFn&& shard, int tp_a, int pp_a, int tp_b,
                                                                  int pp_b) {
  const auto logical = gather_tensor(g, elem_size, shard, tp_a, pp_a);
  std::vector<std::vector<std::vector<std::byte>>> out;
  out.resize(std::size_t(pp_b));
  for (int s = 0; s < pp_b; ++s)
    for (int r = 0; r < tp_b; ++r) out[std::size_t(s)].push_back(shard_tensor(g, elem_size, logical, tp_b, pp_b, r, s));
  return out;
}

}  // namespace loom::io
