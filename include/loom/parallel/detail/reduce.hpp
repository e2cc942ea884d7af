#pragma once
/// \file Private: element-wise reduction kernels shared by the communication backends.
///
/// Reductions run block by block through an accumulator of type accum_t<T> (float for the 16-bit
/// types) that stays in L1: acc = src_0; acc op= src_1; ...; acc op= src_{n-1}; [acc /= n]; then
/// acc is rounded to T once and copied to every destination. The source order is the caller's
/// (rank order), so every rank and every run gets bitwise the same result.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/core/bf16_bits.hpp>
#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>

namespace loom::parallel::detail {

template <class T>
struct accum {
  using type = T;
};
template <>
struct accum<Eigen::bfloat16> {
  using type = float;
};
template <>
struct accum<Eigen::half> {
  using type = float;
};
/// Accumulator type of a reduction over T: float for bf16/fp16, T otherwise.
template <class T>
using accum_t = typename accum<T>::type;

// bf16 <-> fp32 on the raw words, vectorisable (core/bf16_bits.hpp)
using loom::detail::bf16_bits_to_float;
using loom::detail::float_to_bf16_bits;

/// The elements as the loops read them: bf16 as its raw uint16 words (Eigen::bfloat16 is a
/// standard-layout struct whose only member is that word), everything else unchanged.
template <class T>
using lane_t = std::conditional_t<std::is_same_v<T, Eigen::bfloat16>, std::uint16_t, T>;
template <class T>
inline const lane_t<T>* lanes(const T* p) noexcept {
  return reinterpret_cast<const lane_t<T>*>(p);
}
template <class T>
inline lane_t<T>* lanes(T* p) noexcept {
  return reinterpret_cast<lane_t<T>*>(p);
}

/// Lane -> accumulator and accumulator -> lane conversions.
template <class A, class L>
inline A widen(L v) noexcept {
  if constexpr (std::is_same_v<L, std::uint16_t>) return bf16_bits_to_float(v);
  else return static_cast<A>(v);
}
template <class L, class A>
inline L narrow(A v) noexcept {
  if constexpr (std::is_same_v<L, std::uint16_t>) return float_to_bf16_bits(v);
  else return static_cast<L>(v);
}

/// Elements per accumulator block: 8 KiB of float, so acc plus one source block stay in L1.
inline constexpr std::size_t reduce_block = 2048;

/// Short name of an element type for messages and call matching ("f32", "bf16", "i64"; "raw"
/// for other trivially copyable types, told apart by their size).
template <class T>
constexpr const char* dtype_name() noexcept {
  if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, double>) return "f64";
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bf16";
  else if constexpr (std::is_same_v<T, Eigen::half>) return "f16";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "i32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "i64";
  else return "raw";
}

/// Throws input_error when `op` is not defined for T (avg on integers).
template <class T>
void check_op(reduce_op op, std::string_view api) {
  if constexpr (std::is_integral_v<T>) {
    if (op == reduce_op::avg)
      throw input_error(std::string(api) + ": reduce_op::avg is not defined for integer elements (" +
                        std::string(dtype_name<T>()) + "); use reduce_op::sum and divide where you need to");
  }
}

/// acc[i] = src[i] converted to A. N > 0: compile-time length (vectorizes); N == 0: use n.
template <std::size_t N, class A, class T>
inline void load_block(A* __restrict acc, const T* __restrict src_elems, std::size_t n) {
  const std::size_t len = N ? N : n;
  const auto* __restrict src = lanes(src_elems);
  for (std::size_t i = 0; i < len; ++i) acc[i] = widen<A>(src[i]);
}

/// acc[i] = acc[i] op src[i], with op one of sum (avg sums), max, min.
template <std::size_t N, class A, class T>
inline void combine_block(A* __restrict acc, const T* __restrict src_elems, std::size_t n, reduce_op op) {
  const std::size_t len = N ? N : n;
  const auto* __restrict src = lanes(src_elems);
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      if constexpr (std::is_integral_v<A>) {  // wrap modulo 2^bits instead of signed overflow
        using U = std::make_unsigned_t<A>;
        for (std::size_t i = 0; i < len; ++i)
          acc[i] = static_cast<A>(static_cast<U>(acc[i]) + static_cast<U>(src[i]));
      } else {
        for (std::size_t i = 0; i < len; ++i) acc[i] += widen<A>(src[i]);
      }
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < len; ++i) {
        const A v = widen<A>(src[i]);
        acc[i] = v > acc[i] ? v : acc[i];
      }
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < len; ++i) {
        const A v = widen<A>(src[i]);
        acc[i] = v < acc[i] ? v : acc[i];
      }
      break;
  }
}

/// acc[i] /= divisor (exact IEEE division, not a multiply by the reciprocal).
template <std::size_t N, class A>
inline void divide_block(A* __restrict acc, A divisor, std::size_t n) {
  const std::size_t len = N ? N : n;
  for (std::size_t i = 0; i < len; ++i) acc[i] /= divisor;
}

/// dst[i] = T(acc[i]) (round to nearest even for the 16-bit types).
template <std::size_t N, class T, class A>
inline void store_block(T* __restrict dst_elems, const A* __restrict acc, std::size_t n) {
  const std::size_t len = N ? N : n;
  auto* __restrict dst = lanes(dst_elems);
  for (std::size_t i = 0; i < len; ++i) dst[i] = narrow<lane_t<T>>(acc[i]);
}

template <std::size_t N, class T>
inline void reduce_one_block(const T* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t offset,
                             std::size_t n, reduce_op op, int avg_divisor) {
  using A = accum_t<T>;
  alignas(64) A acc[reduce_block];
  load_block<N>(acc, srcs[0] + offset, n);
  for (int j = 1; j < nsrc; ++j) combine_block<N>(acc, srcs[j] + offset, n, op);
  if constexpr (!std::is_integral_v<A>) {
    if (op == reduce_op::avg) divide_block<N>(acc, static_cast<A>(avg_divisor), n);
  }
  if constexpr (std::is_same_v<A, T>) {
    for (int j = 0; j < ndst; ++j) std::memcpy(dsts[j] + offset, acc, n * sizeof(T));
  } else {
    alignas(64) lane_t<T> rounded[reduce_block];
    store_block<N>(rounded, acc, n);
    for (int j = 0; j < ndst; ++j) std::memcpy(dsts[j] + offset, rounded, n * sizeof(T));
  }
}

/// Elements per tile of the fused path: 256 bytes of float accumulator, all sources read in one
/// loop, the tile then stored to every destination with fixed-size (inlined) copies.
inline constexpr std::size_t reduce_tile = 64;

/// The fused path of reduce_into for NS = 2..4 floating-point sources and sum/avg: per tile,
/// t = ((s0 + s1) + s2) + s3 in accum_t<T> with all NS streams read by one loop, [t /= divisor],
/// rounded once, copied to each destination. Same operations in the same order as the block path
/// (bitwise equal results), but one pass instead of NS + ndst passes over an L1 block: measured
/// 1.8x faster for two 16 MiB float buffers on one core (Zen 4, bench_allreduce). Handles whole
/// tiles only; returns the number of elements done.
template <int NS, bool Avg, class T>
std::size_t reduce_tiles(const T* const* srcs, T* const* dsts, int ndst, std::size_t count, int avg_divisor) {
  using A = accum_t<T>;
  using Ln = lane_t<T>;
  std::size_t i0 = 0;
  for (; i0 + reduce_tile <= count; i0 += reduce_tile) {
    alignas(64) A t[reduce_tile];
    const Ln* __restrict s0 = lanes(srcs[0] + i0);
    const Ln* __restrict s1 = lanes(srcs[1] + i0);
    if constexpr (NS == 2) {
      for (std::size_t k = 0; k < reduce_tile; ++k) t[k] = widen<A>(s0[k]) + widen<A>(s1[k]);
    } else if constexpr (NS == 3) {
      const Ln* __restrict s2 = lanes(srcs[2] + i0);
      for (std::size_t k = 0; k < reduce_tile; ++k) t[k] = (widen<A>(s0[k]) + widen<A>(s1[k])) + widen<A>(s2[k]);
    } else {
      static_assert(NS == 4);
      const Ln* __restrict s2 = lanes(srcs[2] + i0);
      const Ln* __restrict s3 = lanes(srcs[3] + i0);
      for (std::size_t k = 0; k < reduce_tile; ++k)
        t[k] = ((widen<A>(s0[k]) + widen<A>(s1[k])) + widen<A>(s2[k])) + widen<A>(s3[k]);
    }
    if constexpr (Avg)
      for (std::size_t k = 0; k < reduce_tile; ++k) t[k] /= static_cast<A>(avg_divisor);
    if constexpr (std::is_same_v<A, T>) {
      for (int j = 0; j < ndst; ++j) std::memcpy(dsts[j] + i0, t, sizeof(t));
    } else {
      alignas(64) Ln r[reduce_tile];
      for (std::size_t k = 0; k < reduce_tile; ++k) r[k] = narrow<Ln>(t[k]);
      for (int j = 0; j < ndst; ++j) std::memcpy(dsts[j] + i0, r, sizeof(r));
    }
  }
  return i0;
}

template <class T>
std::size_t reduce_fused(const T* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t count, reduce_op op,
                         int avg_divisor) {
  if constexpr (std::is_floating_point_v<accum_t<T>>) {
    const bool avg = op == reduce_op::avg;
    if (op != reduce_op::sum && !avg) return 0;
    switch (nsrc) {
      case 2: return avg ? reduce_tiles<2, true>(srcs, dsts, ndst, count, avg_divisor)
                         : reduce_tiles<2, false>(srcs, dsts, ndst, count, avg_divisor);
      case 3: return avg ? reduce_tiles<3, true>(srcs, dsts, ndst, count, avg_divisor)
                         : reduce_tiles<3, false>(srcs, dsts, ndst, count, avg_divisor);
      case 4: return avg ? reduce_tiles<4, true>(srcs, dsts, ndst, count, avg_divisor)
                         : reduce_tiles<4, false>(srcs, dsts, ndst, count, avg_divisor);
      default: return 0;
    }
  } else {
    return 0;
  }
}

/// For i in [0, count): v = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i] (left to right, in
/// accum_t<T>), divided by avg_divisor when op == avg, rounded to T and written to dsts[j][i] for
/// every j. Sources may alias destinations element for element (in-place all-reduce): every block
/// (tile) is read completely before it is written. Sum/avg of 2..4 floating-point sources take
/// the fused tile path (reduce_tiles), the rest and the tail the block path; results are the same.
template <class T>
void reduce_into(const T* const* srcs, int nsrc, T* const* dsts, int ndst, std::size_t count, reduce_op op,
                 int avg_divisor) {
  const std::size_t done = reduce_fused(srcs, nsrc, dsts, ndst, count, op, avg_divisor);
  if (done) {
    if (done == count) return;
    std::vector<const T*> s(static_cast<std::size_t>(nsrc));
    std::vector<T*> d(static_cast<std::size_t>(ndst));
    for (int j = 0; j < nsrc; ++j) s[std::size_t(j)] = srcs[j] + done;
    for (int j = 0; j < ndst; ++j) d[std::size_t(j)] = dsts[j] + done;
    reduce_one_block<0>(s.data(), nsrc, d.data(), ndst, 0, count - done, op, avg_divisor);  // tail < one tile
    return;
  }
  std::size_t offset = 0;
  for (; offset + reduce_block <= count; offset += reduce_block)
    reduce_one_block<reduce_block>(srcs, nsrc, dsts, ndst, offset, reduce_block, op, avg_divisor);
  if (offset < count) reduce_one_block<0>(srcs, nsrc, dsts, ndst, offset, count - offset, op, avg_divisor);
}

/// [lo, hi) of part `part` when `count` elements are cut into `parts` nearly equal parts whose
/// boundaries fall on 64-byte multiples (no false sharing between writers of neighbouring parts).
template <class T>
std::pair<std::size_t, std::size_t> partition(std::size_t count, int parts, int part) {
  constexpr std::size_t align = sizeof(T) >= 64 ? 1 : 64 / sizeof(T);
  const std::size_t per_raw = (count + static_cast<std::size_t>(parts) - 1) / static_cast<std::size_t>(parts);
  const std::size_t per = (per_raw + align - 1) / align * align;
  const std::size_t lo = std::min(count, per * static_cast<std::size_t>(part));
  const std::size_t hi = std::min(count, lo + per);
  return {lo, hi};
}

}  // namespace loom::parallel::detail
