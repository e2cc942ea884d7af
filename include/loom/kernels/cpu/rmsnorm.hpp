#pragma once
/// \file RMSNorm over the last dimension, forward and backward (CPU).
/// Source: Zhang & Sennrich, "Root Mean Square Layer Normalization", arXiv:1910.07467, eq. 4;
/// as in Hugging Face's LlamaRMSNorm (statistics in fp32, no bias, no mean subtraction).
#include <cmath>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out = x * rstd * w per row, rstd = 1/sqrt(mean(x^2) + eps).
///   out (N,C) =; rstd (N) = (in the accumulator type); inp (N,C); w (C).
/// Computed in the accumulator type and rounded once (Hugging Face rounds x * rstd to the
/// storage type before multiplying by w: up to one more rounding there). Cost: ~4 N C flops.
template <class T>
void rmsnorm_forward(T* out, acc_t<T>* rstd, const T* inp, const T* w, int N, int C, acc_t<T> eps) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + std::size_t(n) * C;
    A ss = 0;
    for (int c = 0; c < C; ++c) ss += A(x[c]) * A(x[c]);
    const A s = A(1) / std::sqrt(ss / A(C) + eps);
    T* o = out + std::size_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = T(A(x[c]) * s * A(w[c]));
    rstd[n] = s;
  }
}

/// Backward of rmsnorm_forward. With xhat = x * rstd and g = dout * w:
///   dinp (N,C) += rstd * (g - xhat * mean(g * xhat))   (+=: it sits on the residual stream)
///   dw (C)     += sum over rows of dout * xhat           (type G: fp32 for 16-bit storage)
/// dout (N,C); inp (N,C); w (C); rstd (N) as saved by forward. dw is reduced over rows in a fixed
/// order (deterministic). Cost: ~8 N C flops.
template <class T, class G = T>
void rmsnorm_backward(T* dinp, G* dw, const T* dout, const T* inp, const T* w, const acc_t<T>* rstd, int N, int C) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* d = dout + std::size_t(n) * C;
    const T* x = inp + std::size_t(n) * C;
    T* dx = dinp + std::size_t(n) * C;
    const A s = rstd[n];
    A gx = 0;
    for (int c = 0; c < C; ++c) gx += A(d[c]) * A(w[c]) * A(x[c]) * s;
    gx /= A(C);
    for (int c = 0; c < C; ++c) dx[c] = T(A(dx[c]) + s * (A(d[c]) * A(w[c]) - A(x[c]) * s * gx));
  }
  // parameter gradient: parallel over channels, serial over rows (fixed order)
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = c0 + 16 < C ? c0 + 16 : C;
    A sw[16] = {};
    for (int n = 0; n < N; ++n) {
      const T* d = dout + std::size_t(n) * C;
      const T* x = inp + std::size_t(n) * C;
      for (int c = c0; c < c1; ++c) sw[c - c0] += A(d[c]) * A(x[c]) * rstd[n];
    }
    for (int c = c0; c < c1; ++c) dw[c] = G(A(dw[c]) + sw[c - c0]);
  }
}

}  // namespace loom::kernels::cpu
