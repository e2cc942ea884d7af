#pragma once
/// \file Private helpers of loom/io/safetensors.hpp: the safetensors dtype table, the C++ type
/// of each dtype, and IEEE half / bfloat16 -> float decoding. Not a public header.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <loom/core/bf16_bits.hpp>

namespace loom::io::detail {

/// Bytes per element of a safetensors dtype string, or 0 when the dtype is unknown.
/// Source: the dtype enum of huggingface/safetensors (safetensors/src/tensor.rs).
constexpr std::size_t dtype_size(std::string_view dtype) noexcept {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2")
    return 1;
  return 0;
}

/// The list printed in "unknown dtype" messages.
inline constexpr std::string_view known_dtypes =
    "F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2";

/// The safetensors dtype that stores a C++ element type exactly ("" when there is none).
template <class T>
constexpr std::string_view dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, double>) return "F64";
  else if constexpr (std::is_same_v<U, float>) return "F32";
  else if constexpr (std::is_same_v<U, bool>) return "BOOL";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) return "I64";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) return "I32";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 2) return "I16";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1) return "I8";
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 8) return "U64";
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 4) return "U32";
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 2) return "U16";
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 1) return "U8";
  else return "";
}

/// IEEE 754 binary16 bits -> float, exact for every input (subnormals, +-0, +-inf, NaN payload).
inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

/// bfloat16 bits -> float: exact (core/bf16_bits.hpp).
inline float bfloat16_to_float(std::uint16_t b) noexcept { return loom::detail::bf16_bits_to_float(b); }

}  // namespace loom::io::detail
