#pragma once
/// \file Fused softmax + cross-entropy (CPU): loss and dlogits in one pass over the logits.
/// Stable for large logits (max subtraction, log-sum-exp in the accumulator type) and precise for
/// confident predictions (see Note [confident cross-entropy] below).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels::cpu {

using kernels::ignore_index;  // rows whose target equals it contribute no loss and no gradient

namespace detail {

/// The loss of one row of 16-bit logits (Note [confident cross-entropy]) and, when
/// write_dlogits, its gradient in place: the row is widened to fp32 a piece at a time and
/// reduced with Eigen's vectorised exp and sums (fixed order: deterministic).
template <class T>
float crossentropy_row_16(T* row, std::int32_t tgt, int V, int Vp, bool write_dlogits, float grad_scale) {
  using fmap = Eigen::Map<Eigen::ArrayXf, Eigen::Aligned64>;
  alignas(64) float xb[convert_chunk];
  auto pieces = [V](auto&& f) {
    for (std::ptrdiff_t c0 = 0; c0 < V; c0 += convert_chunk) f(c0, std::min<std::ptrdiff_t>(convert_chunk, V - c0));
  };
  float mx = -std::numeric_limits<float>::infinity();
  pieces([&](std::ptrdiff_t c0, std::ptrdiff_t len) {
    widen(xb, row + c0, len);
    mx = std::max(mx, fmap(xb, len).maxCoeff());
  });
  const float target_logit = float(row[tgt]);
  float others = 0;  // the sum without the target's term (Note [confident cross-entropy])
  pieces([&](std::ptrdiff_t c0, std::ptrdiff_t len) {
    widen(xb, row + c0, len);
    fmap x(xb, len);
    x = (x - mx).exp();
    if (tgt >= c0 && tgt < c0 + len) xb[tgt - c0] = 0;
    others += x.sum();
  });
  const bool at_max = target_logit == mx;
  const float log_sum = at_max ? std::log1p(others) : std::log(others + std::exp(target_logit - mx));
  const float loss = (mx - target_logit) + log_sum;  // at_max: exactly log_sum
  if (write_dlogits) {
    pieces([&](std::ptrdiff_t c0, std::ptrdiff_t len) {
      widen(xb, row + c0, len);
      fmap x(xb, len);
      x = ((x - mx) - log_sum).exp() * grad_scale;
      narrow(row + c0, xb, len);
    });
    // the target's p - 1 = expm1(-loss) in fp32, rounded once (keeps a tiny 1 - p)
    row[tgt] = T(std::expm1(-loss) * grad_scale);
    for (int v = V; v < Vp; ++v) row[v] = T(0);
  }
  return loss;
}

}  // namespace detail

/// For each of the N rows of logits (N,Vp), over the real vocabulary [0,V) only:
///   losses[n] = logsumexp(logits[n,:V]) - logits[n,target[n]]       (= ; 0 for ignored rows)
/// and when `write_dlogits`, overwrites the logits in place with the gradient of
///   grad_scale * sum_n losses[n]:
///   dlogits[n,v] = grad_scale * (softmax(logits[n,:V])[v] - [v == target[n]]) for v < V,
///   0 for the padded columns v >= V and for ignored rows.
/// grad_scale is 1/(number of non-ignored targets in the global batch) for a mean loss.
/// Precondition: targets in [0,V) or == ignore_index (validated at the data boundary).
/// Returns the sum of the losses, in the accumulator type. Cost: ~4 N V flops + N V exp.
///
/// Precision (Note [confident cross-entropy]). With m the row maximum and x_t the target's
/// logit, the loss is formed as
///   x_t == m:  log1p(s),  s = sum over v != t of exp(x_v - m)   (the target's term, 1, left out)
///   x_t <  m:  (m - x_t) + log(sum over v of exp(x_v - m))      (then the loss is >= log 2)
/// and the target's gradient as expm1(-loss) * grad_scale (= p_t - 1). Neither adds a quantity
/// of size |m| to the small result, so a confident prediction's loss of 1e-6 keeps its relative
/// precision: its relative error is at most about (V + d + 3) u, u the unit roundoff of the
/// accumulator (2^-24 for float) and d the largest m - x_v, whatever the size of the logits (in
/// practice a few u; the fp32 tests hold it to 1e-5 relative at V = 1003). The textbook
/// (m + log sum) - x_t in float has an absolute error of about u |m|, i.e. ~1e-6 at logits ~20.
/// The same rule is used by the vocab-parallel kernel (kernels/cpu/vocab_parallel.hpp).
template <class T>
acc_t<T> crossentropy_forward_backward(T* logits, acc_t<T>* losses, const std::int32_t* targets,
                                       int N, int V, int Vp, bool write_dlogits,
                                       acc_t<T> grad_scale) {
  using A = acc_t<T>;
  A total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; ++n) {
    T* row = logits + std::size_t(n) * Vp;
    const std::int32_t tgt = targets[n];
    if (tgt == ignore_index) {
      losses[n] = 0;
      if (write_dlogits) std::fill(row, row + Vp, T(0));
      continue;
    }
    A loss;
    if constexpr (detail::is_16bit_v<T>) {
      loss = detail::crossentropy_row_16(row, tgt, V, Vp, write_dlogits, grad_scale);
    } else {
      Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> x(row, V);
      const A target_logit = A(row[tgt]);
      const A mx = A(x.maxCoeff());
      // Note [confident cross-entropy]: the sum without the target's term when it is the maximum
      const A others = (x.head(tgt).template cast<A>() - mx).exp().sum() +
                       (x.tail(V - 1 - tgt).template cast<A>() - mx).exp().sum();
      const bool at_max = target_logit == mx;
      const A log_sum = at_max ? A(std::log1p(others)) : A(std::log(others + std::exp(target_logit - mx)));
      loss = (mx - target_logit) + log_sum;  // at_max: exactly log_sum
      if (write_dlogits) {
        x = (((x.template cast<A>() - mx) - log_sum).exp() * grad_scale).template cast<T>();
        // the target's p - 1 = expm1(-loss) in the accumulator, rounded once (keeps a tiny 1 - p)
        row[tgt] = T(std::expm1(-loss) * grad_scale);
        for (int v = V; v < Vp; ++v) row[v] = T(0);
      }
    }
    losses[n] = loss;
    total += loss;
  }
  return total;
}

}  // namespace loom::kernels::cpu
