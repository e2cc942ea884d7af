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
#include <loom/kernels/rope_table.hpp>

namespace loom::kernels::cpu {

using kernels::rope_table;  // kernels/rope_table.hpp: the (T, hd/2) cos/sin table, on the host

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
