#pragma once
/// \file bfloat16 <-> float on the raw 16-bit words, written so loops of them vectorise (Eigen's
/// scalar conversion does not: its float-to-bf16 branches on NaN). The same results as Eigen's:
/// widening is exact; narrowing rounds to nearest even and maps NaN to the quiet NaN 0x7FC0 /
/// 0xFFC0 of the same sign (Eigen's float_to_bfloat16_rtne<false>). Used by the CPU kernels'
/// 16-bit paths, the communicators' reductions and the weight readers.
#include <bit>
#include <cstdint>

namespace loom::detail {

/// bfloat16 bits -> float: bfloat16 is the upper half of a binary32, so this is exact.
inline float bf16_bits_to_float(std::uint16_t b) noexcept { return std::bit_cast<float>(std::uint32_t{b} << 16); }

/// float bits -> bfloat16 bits, round to nearest even, NaN to the quiet NaN of the same sign.
/// Branch- and compare-free so that GCC vectorises it with plain SSE2:
///   rounded  round to nearest even: add 0x7FFF plus the lowest kept bit, drop 16 bits
///   nan      quiet NaN with the input's sign
///   mask     all ones iff |u| > infinity (NaN): the sign of 0x7F800000 - |u|, spread by >>
inline std::uint16_t float_bits_to_bf16_bits(std::uint32_t u) noexcept {
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = ((u >> 16) & 0x8000u) | 0x7FC0u;
  const auto mask = static_cast<std::uint32_t>(static_cast<std::int32_t>(0x7F800000u - (u & 0x7FFFFFFFu)) >> 31);
  return static_cast<std::uint16_t>(rounded ^ ((rounded ^ nan) & mask));
}

/// float -> bfloat16 bits (float_bits_to_bf16_bits of its bits).
inline std::uint16_t float_to_bf16_bits(float f) noexcept { return float_bits_to_bf16_bits(std::bit_cast<std::uint32_t>(f)); }

}  // namespace loom::detail
