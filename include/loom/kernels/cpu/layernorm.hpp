#pragma once
/// \file LayerNorm over the last dimension, forward and backward (CPU).
/// Source: Ba, Kiros, Hinton, "Layer Normalization", arXiv:1607.06450; backward as in llm.c.
#include <cmath>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out = (x - mean) * rstd * w + b, per row; biased variance, rstd = 1/sqrt(var + eps).
///   out (N,C) =; mean (N) =; rstd (N) = (statistics in the accumulator type);
///   inp (N,C); w (C); b (C).  Cost: ~7 N C flops.
template <class T>
void layernorm_forward(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* inp, const T* w,
                       const T* b, int N, int C, acc_t<T> eps = acc_t<T>(1e-5)) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + std::size_t(n) * C;
    A m = 0;
    for (int c = 0; c < C; ++c) m += A(x[c]);
    m /= C;
    A v = 0;
    for (int c = 0; c < C; ++c) {
      const A d = A(x[c]) - m;
      v += d * d;
    }
    v /= C;
    const A s = A(1) / std::sqrt(v + eps);
    T* o = out + std::size_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = T((A(x[c]) - m) * s * A(w[c]) + A(b[c]));
    mean[n] = m;
    rstd[n] = s;
  }
}

/// Backward of layernorm_forward.
///   dinp (N,C) += (it sits on the residual stream); dw (C) +=; db (C) += (type G: fp32 for
///   16-bit storage, Note [gradient precision] in matmul.hpp);
///   dout (N,C); inp (N,C); w (C); mean, rstd (N) as saved by forward.
///   dw/db are reduced over rows in a fixed order (deterministic). Cost: ~12 N C flops.
template <class T, class G = T>
void layernorm_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                        const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* d = dout + std::size_t(n) * C;
    const T* x = inp + std::size_t(n) * C;
    T* dx = dinp + std::size_t(n) * C;
    const A m = mean[n], s = rstd[n];
    A dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const A norm = (A(x[c]) - m) * s;
      const A dnorm = A(w[c]) * A(d[c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const A norm = (A(x[c]) - m) * s;
      const A dnorm = A(w[c]) * A(d[c]);
      dx[c] = T(A(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
  // parameter gradients: parallel over channels, serial over rows (fixed order)
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = c0 + 16 < C ? c0 + 16 : C;
    A sw[16] = {}, sb[16] = {};
    for (int n = 0; n < N; ++n) {
      const T* d = dout + std::size_t(n) * C;
      const T* x = inp + std::size_t(n) * C;
      for (int c = c0; c < c1; ++c) {
        sw[c - c0] += (A(x[c]) - mean[n]) * rstd[n] * A(d[c]);
        sb[c - c0] += A(d[c]);
      }
    }
    for (int c = c0; c < c1; ++c) {
      dw[c] = G(A(dw[c]) + sw[c - c0]);
      db[c] = G(A(db[c]) + sb[c - c0]);
    }
  }
}

}  // namespace loom::kernels::cpu
