#pragma once
/// \file Private: vectorisable conversions between 16-bit storage and fp32, for the CPU kernels
/// that compute in fp32 on 16-bit tensors (layernorm, GELU, residual, cross-entropy, bias
/// gradients, attention heads). bf16 loops run on the raw words (core/bf16_bits.hpp), which the
/// compiler turns into SIMD shifts, adds and blends; results are bit for bit Eigen's
/// conversions, which the unit test checks over every bf16 value and over random floats.
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <loom/core/bf16_bits.hpp>

namespace loom::kernels::cpu::detail {

using loom::detail::bf16_bits_to_float;  // core/bf16_bits.hpp: on the raw words, vectorisable
using loom::detail::float_to_bf16_bits;

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

/// dst[i] = D(src[i]) for i < n between a storage type and its accumulator: a copy when D is S
/// (float, double), widen from 16-bit S to float, narrow from float to 16-bit D.
template <class D, class S>
inline void convert(D* __restrict dst, const S* __restrict src, std::ptrdiff_t n) noexcept {
  if constexpr (std::is_same_v<D, S>) {
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = src[i];
  } else if constexpr (std::is_same_v<D, float>) {
    widen(dst, src, n);
  } else {
    static_assert(std::is_same_v<S, float>, "16-bit storage converts to and from float");
    narrow(dst, src, n);
  }
}

/// Elements per stack buffer of the 16-bit paths (16 KiB of fp32): rows longer than this are
/// processed in pieces of it.
inline constexpr std::ptrdiff_t convert_chunk = 4096;

}  // namespace loom::kernels::cpu::detail
