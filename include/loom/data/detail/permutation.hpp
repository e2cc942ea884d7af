#pragma once
/// \file A keyed pseudo-random permutation of [0, n) computed in O(1) time and memory.
///
/// Private to loom::data. Used for the per-epoch window shuffle: permutation(i) is evaluated
/// on demand, so a shuffle over billions of windows needs no table, and resuming at any
/// position costs nothing. Construction: a 4-round balanced Feistel network over the
/// smallest even-bit domain 2^b >= n, with "cycle walking" (re-encrypt until the value falls
/// below n), which restricts a permutation of [0, 2^b) to one of [0, n) (Black & Rogaway,
/// "Ciphers with arbitrary finite domains", CT-RSA 2002). Since 2^b < 4n, the expected walk
/// is under 4 steps. Round function: SplitMix64 (Steele, Lea, Flood, OOPSLA 2014).
/// Not cryptographic; it only needs to shuffle well and be reproducible on every platform.
#include <cstdint>

namespace loom::data::detail {

/// SplitMix64 finaliser: a bijective 64-bit mix.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class permutation {
 public:
  permutation() = default;
  /// A permutation of [0, n) determined by `key` (n >= 1).
  constexpr permutation(std::uint64_t n, std::uint64_t key) noexcept : n_(n) {
    int bits = 2;
    while (bits < 64 && (std::uint64_t(1) << bits) < n) bits += 2;
    half_ = bits / 2;
    mask_ = (std::uint64_t(1) << half_) - 1;
    for (int r = 0; r < rounds; ++r) keys_[r] = mix64(key + 0x632be59bd9b4e019ULL * std::uint64_t(r + 1));
  }
  constexpr std::uint64_t size() const noexcept { return n_; }
  /// The image of i (< size()).
  constexpr std::uint64_t operator()(std::uint64_t i) const noexcept {
    std::uint64_t x = encrypt(i);
    while (x >= n_) x = encrypt(x);
    return x;
  }

 private:
  static constexpr int rounds = 4;
  constexpr std::uint64_t encrypt(std::uint64_t x) const noexcept {
    std::uint64_t l = x >> half_, r = x & mask_;
    for (int k = 0; k < rounds; ++k) {
      const std::uint64_t t = l ^ (mix64(r ^ keys_[k]) & mask_);
      l = r;
      r = t;
    }
    return (l << half_) | r;
  }
  std::uint64_t n_ = 1, mask_ = 1;
  int half_ = 1;
  std::uint64_t keys_[rounds] = {};
};

}  // namespace loom::data::detail
