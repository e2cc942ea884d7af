#pragma once
/// \file LayerNorm over the last dimension, forward and backward (CPU).
/// Source: Ba, Kiros, Hinton, "Layer Normalization", arXiv:1607.06450; backward as in llm.c.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>

namespace loom::kernels::cpu {

namespace detail {

using fmap = Eigen::Map<Eigen::ArrayXf, Eigen::Aligned64>;

/// Calls f(c0, len) for the pieces of a row of C values, convert_chunk at a time.
template <class F>
inline void for_row_pieces(int C, F&& f) {
  for (std::ptrdiff_t c0 = 0; c0 < C; c0 += convert_chunk) f(c0, std::min<std::ptrdiff_t>(convert_chunk, C - c0));
}

/// layernorm_forward for 16-bit storage: each row is widened to fp32 a piece at a time and
/// reduced with Eigen's vectorised sums (fixed order: deterministic).
template <class T>
void layernorm_forward_16(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b, int N, int C,
                          float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + std::size_t(n) * C;
    T* o = out + std::size_t(n) * C;
    alignas(64) float xb[convert_chunk], wb[convert_chunk], bb[convert_chunk];
    float m = 0, v = 0;
    for_row_pieces(C, [&](std::ptrdiff_t c0, std::ptrdiff_t len) {
      widen(xb, x + c0, len);
      m += fmap(xb, len).sum();
    });
    m /= C;
    for_row_pieces(C, [&](std::ptrdiff_t c0, std::ptrdiff_t len) {
      widen(xb, x + c0, len);
      v += (fmap(xb, len) - m).square().sum();
    });
    v /= C;
    const float s = 1.0f / std::sqrt(v + eps);
    for_row_pieces(C, [&](std::ptrdiff_t c0, std::ptrdiff_t len) {
      widen(xb, x + c0, len);
      widen(wb, w + c0, len);
      widen(bb, b + c0, len);
      fmap(xb, len) = (fmap(xb, len) - m) * s * fmap(wb, len) + fmap(bb, len);
      narrow(o + c0, xb, len);
    });
    mean[n] = m;
    rstd[n] = s;
  }
}

/// layernorm_backward for 16-bit storage (fp32 arithmetic, pieces widened as in the forward).
template <class T, class G>
void layernorm_backward_16(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w, const float* mean,
                           const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* d = dout + std::size_t(n) * C;
    const T* x = inp + std::size_t(n) * C;
    T* dx = dinp + std::size_t(n) * C;
    const float m = mean[n], s = rstd[n];
    alignas(64) float xb[convert_chunk], db16[convert_chunk], wb[convert_chunk], gb[convert_chunk];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for_row_pieces(C, [&](std::ptrdiff_t c0, std::ptrdiff_t len) {
      widen(xb, x + c0, len);
      widen(db16, d + c0, len);
      widen(wb, w + c0, len);
      const auto dnorm = fmap(wb, len) * fmap(db16, len);
      dnorm_mean += dnorm.sum();
      dnorm_norm_mean += (dnorm * ((fmap(xb, len) - m) * s)).sum();
    });
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for_row_pieces(C, [&](std::ptrdiff_t c0, std::ptrdiff_t len) {
      widen(xb, x + c0, len);
      widen(db16, d + c0, len);
      widen(wb, w + c0, len);
      const auto norm = (fmap(xb, len) - m) * s;
      const auto dnorm = fmap(wb, len) * fmap(db16, len);
      widen(gb, dx + c0, len);
      fmap(gb, len) += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      narrow(dx + c0, gb, len);
    });
  }
  // parameter gradients: parallel over blocks of 16 channels, serial over rows (fixed order)
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int len = std::min(16, C - c0);
    alignas(64) float sw[16] = {}, sb[16] = {}, xv[16], dv[16];
    for (int n = 0; n < N; ++n) {
      widen(xv, inp + std::size_t(n) * C + c0, len);
      widen(dv, dout + std::size_t(n) * C + c0, len);
      const float m = mean[n], s = rstd[n];
      for (int k = 0; k < len; ++k) {
        sw[k] += (xv[k] - m) * s * dv[k];
        sb[k] += dv[k];
      }
    }
    for (int k = 0; k < len; ++k) {
      dw[c0 + k] = G(float(dw[c0 + k]) + sw[k]);
      db[c0 + k] = G(float(db[c0 + k]) + sb[k]);
    }
  }
}

}  // namespace detail

/// out = (x - mean) * rstd * w + b, per row; biased variance, rstd = 1/sqrt(var + eps).
///   out (N,C) =; mean (N) =; rstd (N) = (statistics in the accumulator type);
///   inp (N,C); w (C); b (C).  Cost: ~7 N C flops.
template <class T>
void layernorm_forward(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* inp, const T* w,
                       const T* b, int N, int C, acc_t<T> eps = acc_t<T>(1e-5)) {
  if constexpr (detail::is_16bit_v<T>) {
    detail::layernorm_forward_16(out, mean, rstd, inp, w, b, N, C, eps);
  } else {
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
}

/// Backward of layernorm_forward.
///   dinp (N,C) += (it sits on the residual stream); dw (C) +=; db (C) += (type G: fp32 for
///   16-bit storage, Note [gradient precision] in matmul.hpp);
///   dout (N,C); inp (N,C); w (C); mean, rstd (N) as saved by forward.
///   dw/db are reduced over rows in a fixed order (deterministic). Cost: ~12 N C flops.
template <class T, class G = T>
void layernorm_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                        const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  if constexpr (detail::is_16bit_v<T>) {
    detail::layernorm_backward_16(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  } else {
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
}

}  // namespace loom::kernels::cpu
