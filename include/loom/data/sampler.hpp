#pragma once
/// \file Seeded sampling of fixed-length windows from a token sequence.
#include <cstdint>
#include <span>

#include <loom/core/error.hpp>
#include <loom/core/random.hpp>

namespace loom::data {

/// Draws windows of `window` consecutive tokens at uniformly random offsets. Window j of the
/// run is a pure function of (seed, j): same seed, same batches, on any machine; the position
/// (number of windows drawn) is the whole state, so resuming is exact.
class window_sampler {
 public:
  window_sampler(std::size_t tokens, std::size_t window, std::uint64_t seed)
      : n_(tokens), window_(window), seed_(seed) {
    if (tokens < window)
      throw input_error("the data has " + std::to_string(tokens) + " tokens, fewer than one window of " +
                        std::to_string(window) + "; use more data or a shorter sequence length");
  }

  /// Fills `out` (rows of `window` ids) with the next out.size()/window windows from `src`.
  /// Precondition: out.size() % window == 0 and src.size() == tokens.
  template <class Tok>
  void next(std::span<const Tok> src, std::span<std::int32_t> out) {
    for (std::size_t r = 0; r * window_ < out.size(); ++r) {
      const std::size_t off = random_below(n_ - window_ + 1, seed_, 0, position_++);
      for (std::size_t t = 0; t < window_; ++t) out[r * window_ + t] = std::int32_t(src[off + t]);
    }
  }

  std::uint64_t position() const noexcept { return position_; }
  void set_position(std::uint64_t p) noexcept { position_ = p; }

 private:
  std::size_t n_, window_;
  std::uint64_t seed_;
  std::uint64_t position_ = 0;
};

/// Fills `out` with consecutive, non-overlapping windows of `src` starting at window
/// `first` (wrapping around) — a fixed validation set that every evaluation reuses.
template <class Tok>
void sequential_windows(std::span<const Tok> src, std::size_t window, std::size_t first, std::span<std::int32_t> out) {
  const std::size_t count = (src.size() - 1) / (window - 1);  // windows overlap by one token
  for (std::size_t r = 0; r * window < out.size(); ++r) {
    const std::size_t off = ((first + r) % count) * (window - 1);
    for (std::size_t t = 0; t < window; ++t) out[r * window + t] = std::int32_t(src[off + t]);
  }
}

}  // namespace loom::data
