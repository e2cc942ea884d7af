#pragma once
/// \file Causal multi-head self-attention, unfused reference (CPU): materialises the
/// (T,T) probability matrix of every (batch, head) and keeps it for backward.
/// Source: Vaswani et al., "Attention Is All You Need", arXiv:1706.03762, eq. (1).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include <loom/kernels/cpu/common.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace loom::kernels::cpu {

/// Forward.
///   out  (B,T,C) written (=), heads concatenated in channel order h*HD ... (h+1)*HD-1
///   att  (B,NH,T,T) written (=): softmax probabilities, zero above the diagonal (saved)
///   qkv  (B,T,3C): [q | k | v], each C wide, head h at channels [h*HD, (h+1)*HD)
/// Math: out = softmax(mask(q k^T / sqrt(HD))) v.  Cost: 4 B NH T^2 HD flops (twice the
/// causal minimum: the reference computes the full square).  Extra memory: B NH T^2.
template <class T>
void attention_forward(T* out, acc_t<T>* att, const T* qkv, int B, int Tn, int C, int NH) {
  using A = acc_t<T>;
  const int HD = C / NH;
  const A scale = A(1) / std::sqrt(A(HD));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const T* base = qkv + std::size_t(b) * Tn * 3 * C + std::size_t(h) * HD;
      csmap<T> q(base, Tn, HD, Eigen::OuterStride<>(3 * C));
      csmap<T> k(base + C, Tn, HD, Eigen::OuterStride<>(3 * C));
      csmap<T> v(base + 2 * C, Tn, HD, Eigen::OuterStride<>(3 * C));
      A* p = att + (std::size_t(b) * NH + h) * Tn * Tn;
      map<A> P(p, Tn, Tn);
      P.noalias() = (q.template cast<A>() * k.template cast<A>().transpose()) * scale;
      for (int t = 0; t < Tn; ++t) {
        A* row = p + std::size_t(t) * Tn;
        A mx = -std::numeric_limits<A>::infinity();
        for (int s = 0; s <= t; ++s) mx = std::max(mx, row[s]);
        Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>> r(row, t + 1);
        r = (r - mx).exp();
        r *= A(1) / r.sum();
        for (int s = t + 1; s < Tn; ++s) row[s] = 0;
      }
      smap<T> y(out + std::size_t(b) * Tn * C + std::size_t(h) * HD, Tn, HD, Eigen::OuterStride<>(C));
      y.noalias() = (P * v.template cast<A>()).template cast<T>();
    }
}

/// Backward.
///   dqkv (B,T,3C) written (=);  dout (B,T,C);  qkv, att as in forward;
///   scratch: at least threads * T*T accumulator elements (dP of one (b,h) per thread).
/// Math: dV = P^T dY; dP = dY V^T; dS = P .* (dP - rowsum(dP .* P)); dQ = dS K s; dK = dS^T Q s.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const acc_t<T>* att,
                        acc_t<T>* scratch, int B, int Tn, int C, int NH) {
  using A = acc_t<T>;
  const int HD = C / NH;
  const A scale = A(1) / std::sqrt(A(HD));
#pragma omp parallel
  {
#ifdef _OPENMP
    A* dp = scratch + std::size_t(omp_get_thread_num()) * Tn * Tn;
#else
    A* dp = scratch;
#endif
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h) {
        const std::size_t off = std::size_t(b) * Tn * 3 * C + std::size_t(h) * HD;
        csmap<T> q(qkv + off, Tn, HD, Eigen::OuterStride<>(3 * C));
        csmap<T> k(qkv + off + C, Tn, HD, Eigen::OuterStride<>(3 * C));
        csmap<T> v(qkv + off + 2 * C, Tn, HD, Eigen::OuterStride<>(3 * C));
        smap<T> dq(dqkv + off, Tn, HD, Eigen::OuterStride<>(3 * C));
        smap<T> dk(dqkv + off + C, Tn, HD, Eigen::OuterStride<>(3 * C));
        smap<T> dv(dqkv + off + 2 * C, Tn, HD, Eigen::OuterStride<>(3 * C));
        csmap<T> dy(dout + std::size_t(b) * Tn * C + std::size_t(h) * HD, Tn, HD, Eigen::OuterStride<>(C));
        cmap<A> P(att + (std::size_t(b) * NH + h) * Tn * Tn, Tn, Tn);
        map<A> dP(dp, Tn, Tn);
        dv.noalias() = (P.transpose() * dy.template cast<A>()).template cast<T>();
        dP.noalias() = dy.template cast<A>() * v.template cast<A>().transpose();
        for (int t = 0; t < Tn; ++t) {
          A* d = dp + std::size_t(t) * Tn;
          const A* pr = att + ((std::size_t(b) * NH + h) * Tn + t) * Tn;
          A dot = 0;
          for (int s = 0; s <= t; ++s) dot += d[s] * pr[s];
          for (int s = 0; s <= t; ++s) d[s] = pr[s] * (d[s] - dot) * scale;
          for (int s = t + 1; s < Tn; ++s) d[s] = 0;
        }
        dq.noalias() = (dP * k.template cast<A>()).template cast<T>();
        dk.noalias() = (dP.transpose() * q.template cast<A>()).template cast<T>();
      }
  }
}

}  // namespace loom::kernels::cpu
