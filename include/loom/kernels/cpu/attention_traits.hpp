#pragma once
/// \file Tuning numbers of the fused CPU attention kernel, one specialization per head size
/// (ThunderKittens-style traits; STYLE §3.8). The kernel never branches on the head size:
/// kernels/cpu/attention_fused.hpp dispatches a run-time head size to the specialization
/// listed in attention_tuned_head_dims, or to the generic traits otherwise.
///
/// Tile sizes were chosen with `bench_attention --tiles --T 256,1024` (one thread, CPU time,
/// fp32, B·NH = 12) on a 2-core AVX-512 AMD EPYC (1 MiB L2 per core); see docs/attention.md.
/// 64 x 64 is within noise (±5 % on that shared machine) of the best everywhere; 32-row tiles
/// lose 10-30 % (more GEMM calls, more packing); 64 x 128 is 4-6 % faster for HD 64 in every
/// run, so HD 64 uses it. A query tile is block_q rows of q, dO and dq; a key tile is block_k
/// rows of k, v, dk and dv; one (query tile, key tile) pair touches about
///   (2 block_q + 4 block_k) HD + 2 block_q block_k   accumulator elements
/// (64 KiB .. 192 KiB in fp32), which stays in L2.
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
  static constexpr int block_k = 128;
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
