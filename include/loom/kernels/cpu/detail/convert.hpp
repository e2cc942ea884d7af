#pragma once
/// \file Private: vectorisable conversions between 16-bit storage and fp32, for the CPU kernels
/// that compute in fp32 on 16-bit tensors (layernorm, GELU, residual, cross-entropy, bias
/// gradients). Element by element, Eigen::bfloat16's conversions do not vectorise (the
/// float-to-bf16 one branches on NaN); these loops are written on the raw bits so the compiler
/// turns them into SIMD shifts, adds and blends. Results are bit for bit those of Eigen's
/// conversions (round to nearest even; NaN becomes the quiet NaN 0x7FC0 with its sign), which
/// the unit test checks over every bf16 value and over random floats.
#include <Eigen/Core>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace loom::kernels::cpu::detail {

/// bf16 bits to float: the 16 bits are the float's upper half.
inline float bf16_bits_to_float(std::uint16_t b) noexcept { return std::bit_cast<float>(std::uint32_t(b) << 16); }

/// float to bf16 bits, round to nearest even; NaN to the quiet NaN of the same sign
/// (Eigen's float_to_bfloat16_rtne<false>). Branch-free, so a loop of it vectorises.
inline std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 31) ? 0xFFC0u : 0x7FC0u;
  return std::uint16_t(f != f ? quiet_nan : rounded);
}

/// True for the storage types these conversions serve (the kernels' 16-bit paths).
template <class T>
inline constexpr bool is_16bit_v = std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Eigen::half>;

/// dst[i] = float(src[i]) for i < n; T is float, Eigen::bfloat16 or Eigen::half.
template <class T>
inline void widen(float* __restrict dst, const T* __restrict src, std::ptrdiff_t n) noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i].value);
  } else {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

/// dst[i] = T(src[i]) for i < n, rounded to nearest even (T as for widen).
template <class T>
inline void narrow(T* __restrict dst, const float* __restrict src, std::ptrdiff_t n) noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i].value = float_to_bf16_bits(src[i]);
  } else {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = T(src[i]);
  }
}

/// dst[i] = A(src[i]) for i < n: widen for 16-bit T, a copy when T is already A (float, double).
template <class A, class T>
inline void load_acc(A* __restrict dst, const T* __restrict src, std::ptrdiff_t n) noexcept {
  if constexpr (std::is_same_v<A, T>) {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    static_assert(std::is_same_v<A, float>, "16-bit storage accumulates in float");
    widen(dst, src, n);
  }
}

/// dst[i] = T(src[i]) for i < n: narrow for 16-bit T, a copy when T is A.
template <class T, class A>
inline void store_acc(T* __restrict dst, const A* __restrict src, std::ptrdiff_t n) noexcept {
  if constexpr (std::is_same_v<A, T>) {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    static_assert(std::is_same_v<A, float>, "16-bit storage accumulates in float");
    narrow(dst, src, n);
  }
}

/// Elements per stack buffer of the 16-bit paths (16 KiB of fp32): rows longer than this are
/// processed in pieces of it.
inline constexpr std::ptrdiff_t convert_chunk = 4096;

}  // namespace loom::kernels::cpu::detail
