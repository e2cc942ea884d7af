#pragma once
/// \file Tuning numbers of the fused CPU attention kernel, one specialization per head size
/// (ThunderKittens-style traits; STYLE §3.8). The kernel never branches on the head size:
/// kernels/cpu/attention_fused.hpp dispatches a run-time head size to the specialization
/// listed in attention_tuned_head_dims, or to the generic traits otherwise.
///
/// Tile sizes were chosen with bench/bench_attention (`--tiles`) on a 2-core AMD EPYC (Zen 4,
/// 32 KiB L1d, 1 MiB L2), fp32, B·NH = 12, T = 1024; see docs/attention.md. A query tile is
/// block_q rows of q, dO and dq; a key tile is block_k rows of k, v, dk and dv; the per-thread
/// working set of one (query tile, key tile) pair is about
///   (2 block_q + 4 block_k) HD + 2 block_q block_k   accumulator elements,
/// which these choices keep within L2 (64 KiB .. 160 KiB in fp32).
#include <algorithm>
#include <utility>

namespace loom::kernels::cpu {

/// Tiles for any head size not listed below; the head size is a run-time value.
///   head_dim  compile-time head size, 0 = known only at run time
///   block_q   query rows per tile (forward work item; backward inner loop)
///   block_k   key rows per tile (forward inner loop; backward work item)
template <int HeadDim>
struct attention_traits {
  static constexpr int head_dim = 0;
  static constexpr int block_q = 64;
  static constexpr int block_k = 64;
};

template <>
struct attention_traits<32> {
  static constexpr int head_dim = 32;
  static constexpr int block_q = 64;
  static constexpr int block_k = 64;
};

template <>
struct attention_traits<64> {
  static constexpr int head_dim = 64;
  static constexpr int block_q = 64;
  static constexpr int block_k = 64;
};

template <>
struct attention_traits<80> {
  static constexpr int head_dim = 80;
  static constexpr int block_q = 64;
  static constexpr int block_k = 64;
};

template <>
struct attention_traits<128> {
  static constexpr int head_dim = 128;
  static constexpr int block_q = 64;
  static constexpr int block_k = 64;
};

/// Head sizes with a compile-time specialization (their inner loops are unrolled for HD).
using attention_tuned_head_dims = std::integer_sequence<int, 32, 64, 80, 128>;

namespace detail {
template <int... D>
consteval int max_tile_elems(std::integer_sequence<int, D...>) {
  return std::max({attention_traits<0>::block_q * attention_traits<0>::block_k,
                   (attention_traits<D>::block_q * attention_traits<D>::block_k)...});
}
}  // namespace detail

/// Largest block_q * block_k over all traits: the size of one per-thread score tile.
inline constexpr int attention_max_tile_elems = detail::max_tile_elems(attention_tuned_head_dims{});

}  // namespace loom::kernels::cpu
