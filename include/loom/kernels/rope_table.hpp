#pragma once
/// \file The rotary position embedding's angle table, computed on the host for every device.
/// Source: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
/// arXiv:2104.09864, eq. 34; the frequencies of Hugging Face's LlamaRotaryEmbedding.
#include <cmath>
#include <cstddef>
#include <string>

#include <loom/core/error.hpp>

namespace loom::kernels {

/// The rotation angles' cosines and sines, (T, hd/2) each, for positions 0..T-1:
///   angle(t, i) = t * theta^(-2i/hd),  i < hd/2
/// in the accumulator type A as Hugging Face computes them for float (inverse frequencies
/// 1 / theta^(2i/hd) in A, then t * inv_freq in A). Throws loom::input_error unless hd is even
/// and positive, T >= 0 and theta > 1.
template <class A>
void rope_table(A* cos_out, A* sin_out, int T, int hd, A theta) {
  if (hd <= 0 || hd % 2 != 0 || T < 0 || !(theta > A(1)))
    throw input_error("rope_table: head size " + std::to_string(hd) + ", " + std::to_string(T) + " positions, theta " +
                      std::to_string(double(theta)) + "; needs an even head size > 0, T >= 0 and theta > 1 (Llama: 10000)");
  const int half = hd / 2;
  for (int i = 0; i < half; ++i) {
    const A inv_freq = A(1) / std::pow(theta, A(2 * i) / A(hd));
    for (int t = 0; t < T; ++t) {
      const A angle = A(t) * inv_freq;
      cos_out[std::size_t(t) * half + i] = std::cos(angle);
      sin_out[std::size_t(t) * half + i] = std::sin(angle);
    }
  }
}

}  // namespace loom::kernels
