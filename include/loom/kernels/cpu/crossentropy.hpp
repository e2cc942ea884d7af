#pragma once
/// \file Fused softmax + cross-entropy (CPU): loss and dlogits in one pass over the logits.
/// Stable for large logits (max subtraction, log-sum-exp in the accumulator type).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels::cpu {

using kernels::ignore_index;  // rows whose target equals it contribute no loss and no gradient

/// For each of the N rows of logits (N,Vp), over the real vocabulary [0,V) only:
///   losses[n] = logsumexp(logits[n,:V]) - logits[n,target[n]]       (= ; 0 for ignored rows)
/// and when `write_dlogits`, overwrites the logits in place with the gradient of
///   grad_scale * sum_n losses[n]:
///   dlogits[n,v] = grad_scale * (softmax(logits[n,:V])[v] - [v == target[n]]) for v < V,
///   0 for the padded columns v >= V and for ignored rows.
/// grad_scale is 1/(number of non-ignored targets in the global batch) for a mean loss.
/// Precondition: targets in [0,V) or == ignore_index (validated at the data boundary).
/// Returns the sum of the losses, in the accumulator type. Cost: ~4 N V flops + N V exp.
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
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> x(row, V);
    const A target_logit = A(row[tgt]);
    const A mx = A(x.maxCoeff());
    const A lse = mx + std::log((x.template cast<A>() - mx).exp().sum());
    const A loss = lse - target_logit;
    losses[n] = loss;
    total += loss;
    if (write_dlogits) {
      x = ((x.template cast<A>() - lse).exp() * grad_scale).template cast<T>();
      // the target's (p - 1) in the accumulator, rounded once (matters for 16-bit storage)
      row[tgt] = T((std::exp(target_logit - lse) - A(1)) * grad_scale);
      for (int v = V; v < Vp; ++v) row[v] = T(0);
    }
  }
  return total;
}

}  // namespace loom::kernels::cpu
