#pragma once
/// \file Fused AdamW update and the global gradient norm (CPU).
/// Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", arXiv:1711.05101;
/// semantics of torch.optim.AdamW (decay applied as p *= 1 - lr*wd before the Adam step).
#include <cmath>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

namespace detail {
/// The AdamW element update shared by adamw_update and adamw_update_master, with the step's
/// constants computed once: bias corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t and the
/// decoupled decay factor 1 - lr * weight_decay.
template <class M>
struct adamw_element {
  M lr, beta1, beta2, eps, grad_scale, bc1, bc2, decay;
  adamw_element(M lr_, M beta1_, M beta2_, M eps_, M weight_decay, M grad_scale_, long t)
      : lr(lr_), beta1(beta1_), beta2(beta2_), eps(eps_), grad_scale(grad_scale_),
        bc1(M(1) - std::pow(beta1_, M(t))), bc2(M(1) - std::pow(beta2_, M(t))), decay(M(1) - lr_ * weight_decay) {}
  /// Updates m and v in place from the raw gradient g (scaled by grad_scale here) and returns
  /// the new value of the parameter p.
  M operator()(M p, M g, M& m, M& v) const {
    g *= grad_scale;
    const M mi = beta1 * m + (M(1) - beta1) * g;
    const M vi = beta2 * v + (M(1) - beta2) * g * g;
    m = mi;
    v = vi;
    return p * decay - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
  }
};
}  // namespace detail

/// One AdamW step over n contiguous parameters; t is the 1-based step count.
///   param (n) updated in place; m, v (n) updated in place (first/second moments);
///   grad (n) read, multiplied by grad_scale first (the clip coefficient, 1 when not clipping).
/// Computed in M: param[i] = T(update(M(param[i]))) — adamw_update_master with the parameters
/// as their own masters. Cost: ~15 n flops; memory bound.
template <class T, class M>
void adamw_update(T* param, M* m, M* v, const T* grad, std::size_t n, M lr, M beta1, M beta2,
                  M eps, M weight_decay, M grad_scale, long t) {
  const detail::adamw_element<M> step(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) param[i] = T(step(M(param[i]), M(grad[i]), m[i], v[i]));
}

/// One AdamW step on fp32 master weights (mixed precision): the same update as adamw_update,
/// applied to `master`, then param[i] = T(master[i]) (round to nearest even). The parameters
/// are only ever a rounding of the masters, so updates smaller than the storage's resolution
/// accumulate in the masters instead of being lost (Micikevicius et al., "Mixed Precision
/// Training", arXiv:1710.03740, §3.1).
///   param (n) = ; master, m, v (n) updated in place; grad (n, type G, fp32 for 16-bit storage)
///   read and multiplied by grad_scale (clip coefficient / loss scale). Cost: ~16 n flops.
template <class T, class M, class G>
void adamw_update_master(T* param, M* master, M* m, M* v, const G* grad, std::size_t n, M lr, M beta1, M beta2,
                         M eps, M weight_decay, M grad_scale, long t) {
  const detail::adamw_element<M> step(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) {
    master[i] = step(master[i], M(grad[i]), m[i], v[i]);
    param[i] = T(master[i]);
  }
}

/// dst[i] = D(src[i]) for n values (casts between storage and master copies).
template <class D, class S>
void cast(D* dst, const S* src, std::size_t n) {
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) dst[i] = D(src[i]);
}

/// True when none of the n values is NaN or infinite.
template <class T>
bool all_finite(const T* x, std::size_t n) {
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) ok = ok && std::isfinite(double(x[i]));
  return ok;
}

/// Sum of squares of n values, accumulated in double in a fixed order (deterministic across
/// runs and thread counts: fixed-size chunks, each summed in 16 interleaved lanes (element i
/// into lane i mod 16, which vectorises) added in lane order, chunk partials added serially).
template <class T>
double sum_of_squares(const T* x, std::size_t n) {
  constexpr std::size_t chunk = 1 << 14;
  const std::size_t nchunks = (n + chunk - 1) / chunk;
  double total = 0;
  // partial sums per chunk, combined in chunk order
  std::size_t done = 0;
  while (done < nchunks) {
    constexpr std::size_t group = 64;
    double part[group];
    const std::size_t g = nchunks - done < group ? nchunks - done : group;
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t c = 0; c < std::ptrdiff_t(g); ++c) {
      const std::size_t lo = (done + c) * chunk, hi = lo + chunk < n ? lo + chunk : n;
      double lane[16] = {};
      std::size_t i = lo;
      for (; i + 16 <= hi; i += 16)
#pragma GCC unroll 16
        for (std::size_t k = 0; k < 16; ++k) lane[k] += double(x[i + k]) * double(x[i + k]);
      for (std::size_t k = 0; i < hi; ++i, ++k) lane[k] += double(x[i]) * double(x[i]);
      double s = 0;
      for (const double l : lane) s += l;
      part[c] = s;
    }
    for (std::size_t c = 0; c < g; ++c) total += part[c];
    done += g;
  }
  return total;
}

}  // namespace loom::kernels::cpu
