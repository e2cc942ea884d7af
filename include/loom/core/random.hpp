#pragma once
/// \file Counter-based random numbers: value i of stream s under seed k is a pure function
/// f(k, s, i). Used for initialisation (a tensor-parallel rank can draw exactly its slice of
/// the global tensor without drawing the rest) and for data sampling (reproducible batches).
/// Hash: SplitMix64 finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014). Not cryptographic.
#include <cmath>
#include <cstdint>

namespace loom {

/// SplitMix64 finaliser: a bijective 64-bit mix.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// 64 random bits for (seed, stream, index).
constexpr std::uint64_t random_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) + index);
}

/// Uniform double in [0, 1) with 53 random bits.
constexpr double random_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept {
  return double(random_bits(seed, stream, index) >> 11) * 0x1.0p-53;
}

/// Standard normal N(0,1) for (seed, stream, index), Box-Muller on two independent uniforms.
inline double random_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept {
  const double u1 = 1.0 - random_uniform(seed, stream, 2 * index);  // (0, 1]
  const double u2 = random_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Uniform integer in [0, n) for (seed, stream, index) (Lemire's multiply-shift; n > 0).
constexpr std::uint64_t random_below(std::uint64_t n, std::uint64_t seed, std::uint64_t stream,
                                     std::uint64_t index) noexcept {
  return std::uint64_t((unsigned __int128)random_bits(seed, stream, index) * n >> 64);
}

}  // namespace loom
