#pragma once
/// \file Rotary position embedding (RoPE), rotate-half convention, forward and backward (CPU).
/// Source: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
/// arXiv:2104.09864, eq. 34; the rotate-half pairing (i, i + hd/2) and the frequencies of Hugging
/// Face's LlamaRotaryEmbedding and apply_rotary_pos_emb.
#include <cmath>
#include <cstddef>
#include <string>

#include <loom/core/error.hpp>
#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

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

namespace detail {
/// The rotation of rope_forward by the table's angles times `sign` (+1 forward, -1 its inverse).
template <class T>
void rope_rotate(T* x, const acc_t<T>* cos, const acc_t<T>* sin, acc_t<T> sign, int B, int Tn, int heads, int hd,
                 std::size_t ld) {
  using A = acc_t<T>;
  const int half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < B * Tn; ++r) {
    const int t = r % Tn;
    const A* c = cos + std::size_t(t) * half;
    const A* s = sin + std::size_t(t) * half;
    for (int h = 0; h < heads; ++h) {
      T* v = x + std::size_t(r) * ld + std::size_t(h) * hd;
      for (int i = 0; i < half; ++i) {
        const A a = A(v[i]), b = A(v[i + half]), si = sign * s[i];
        v[i] = T(a * c[i] - b * si);
        v[i + half] = T(b * c[i] + a * si);
      }
    }
  }
}
}  // namespace detail

/// Rotates `heads` heads of hd values in place in every token row of x, by the angles of the
/// row's position (rows are (B, T) in order: row b*T + t has position t):
///   x[i]        = x[i] cos - x[i + hd/2] sin
///   x[i + hd/2] = x[i + hd/2] cos + x[i] sin        for i < hd/2,
/// in the accumulator type, rounded once. x: B*T rows of `ld` elements; the heads are the first
/// heads*hd of each row (pass x + offset for k inside a fused qkv row). cos, sin: rope_table of
/// at least T positions. Cost: 6 B T heads hd/2 flops.
template <class T>
void rope_forward(T* x, const acc_t<T>* cos, const acc_t<T>* sin, int B, int Tn, int heads, int hd, std::size_t ld) {
  detail::rope_rotate(x, cos, sin, acc_t<T>(1), B, Tn, heads, hd, ld);
}

/// Backward of rope_forward, in place: the rotation's transpose (the rotation by minus the
/// angles) applied to the gradient dx of the rotated values (same layout and tables), which gives
/// the gradient of the values before rotation:
///   d[i] = g[i] cos + g[i + hd/2] sin,  d[i + hd/2] = g[i + hd/2] cos - g[i] sin.
template <class T>
void rope_backward(T* dx, const acc_t<T>* cos, const acc_t<T>* sin, int B, int Tn, int heads, int hd, std::size_t ld) {
  detail::rope_rotate(dx, cos, sin, acc_t<T>(-1), B, Tn, heads, hd, ld);
}

}  // namespace loom::kernels::cpu
