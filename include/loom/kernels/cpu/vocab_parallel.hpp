#pragma once
/// \file The local (per tensor-parallel rank) pieces of the vocab-parallel embedding and the
/// vocab-parallel softmax cross-entropy (CPU). The communication between the pieces is in
/// loom/parallel/tensor_parallel.hpp; these functions never communicate.
///
/// A rank owns the `rows` consecutive vocabulary entries [begin, begin + rows) of the padded
/// vocabulary (Megatron-LM's VocabParallelEmbedding / vocab_parallel_cross_entropy split).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels::cpu {

/// out[n,:] = (begin <= tokens[n] < begin+rows ? wte_local[tokens[n]-begin,:] : 0)
///            + (wpe ? wpe[n % Tn,:] : 0)
///   out (B*Tn, C) written (=); tokens (B,Tn) int32 (any value: foreign ids give zero rows);
///   wte_local (rows, C); wpe (>= Tn, C) or null. Summed over ranks (with wpe on one rank only)
///   this is encoder_forward. Cost: B*Tn*C adds.
template <class T>
void embedding_shard_forward(T* out, const std::int32_t* tokens, const T* wte_local, const T* wpe, int B, int Tn,
                             int C, int begin, int rows) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      T* o = out + (std::size_t(b) * Tn + t) * C;
      const int local = tokens[b * Tn + t] - begin;
      const T* e = local >= 0 && local < rows ? wte_local + std::size_t(local) * C : nullptr;
      const T* p = wpe ? wpe + std::size_t(t) * C : nullptr;
      for (int c = 0; c < C; ++c)
        o[c] = T((e ? acc_t<T>(e[c]) : acc_t<T>(0)) + (p ? acc_t<T>(p[c]) : acc_t<T>(0)));
    }
}

/// dwte_local[tokens[n]-begin,:] += dout[n,:] for the tokens this rank owns;
/// dwpe[n % Tn,:] += dout[n,:] when dwpe is not null.
///   dwte_local (rows, C) +=, dwpe (>= Tn, C) +=, dout (B*Tn, C). G is the parameter-gradient
///   type (kernels::gradient_t: fp32 for 16-bit T), summed in acc_t<T>. Serial over tokens,
///   parallel over channels: a fixed summation order, deterministic (as encoder_backward).
template <class T, class G>
void embedding_shard_backward(G* dwte_local, G* dwpe, const T* dout, const std::int32_t* tokens, int B, int Tn,
                              int C, int begin, int rows) {
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = std::min(c0 + 16, C);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t) {
        const T* d = dout + (std::size_t(b) * Tn + t) * C;
        const int local = tokens[b * Tn + t] - begin;
        if (local >= 0 && local < rows) {
          G* e = dwte_local + std::size_t(local) * C;
          for (int c = c0; c < c1; ++c) e[c] = G(acc_t<T>(e[c]) + acc_t<T>(d[c]));
        }
        if (dwpe) {
          G* p = dwpe + std::size_t(t) * C;
          for (int c = c0; c < c1; ++c) p[c] = G(acc_t<T>(p[c]) + acc_t<T>(d[c]));
        }
      }
  }
}

/// Number of real (non-padding) vocabulary columns among a shard's [begin, begin+rows):
/// clamp(V - begin, 0, rows).
constexpr int real_columns(int V, int begin, int rows) noexcept { return std::clamp(V - begin, 0, rows); }

/// Step 1 of the vocab-parallel cross-entropy: row_max[n] = max of logits_local[n, :valid]
/// (= ; -inf when the shard has no real column, 0 for ignored rows), valid = real_columns.
///   logits_local (N, rows); targets (N) global ids or ignore_index.
template <class T>
void vocab_shard_max(acc_t<T>* row_max, const T* logits_local, const std::int32_t* targets, int N, int rows,
                     int valid) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + std::size_t(n) * rows;
    A mx = -std::numeric_limits<A>::infinity();
    if (targets[n] == ignore_index) mx = 0;
    else
      for (int v = 0; v < valid; ++v) mx = std::max(mx, A(row[v]));
    row_max[n] = mx;
  }
}

/// Step 2: given the global row maxima, stats[n] = sum over real local columns of
/// exp(logit - row_max[n]), leaving out the target's column when this shard owns the target and
/// its logit equals row_max[n] (Note [confident cross-entropy] in kernels/cpu/crossentropy.hpp),
/// and stats[N+n] = the target's logit if this shard owns the target, else 0 (both =, 0 for
/// ignored rows). Summed over ranks: the softmax denominator (minus the target's term 1 when
/// the target is the maximum) and the target logit.
template <class T>
void vocab_shard_sums(acc_t<T>* stats, const T* logits_local, const acc_t<T>* row_max, const std::int32_t* targets,
                      int N, int rows, int valid, int begin) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + std::size_t(n) * rows;
    A sum = 0, tgt = 0;
    if (targets[n] != ignore_index) {
      const int local = targets[n] - begin;
      const bool owns = local >= 0 && local < valid;
      if (owns) tgt = A(row[local]);
      const int skip = owns && tgt == row_max[n] ? local : -1;
      for (int v = 0; v < valid; ++v)
        if (v != skip) sum += std::exp(A(row[v]) - row_max[n]);
    }
    stats[n] = sum;
    stats[std::size_t(N) + n] = tgt;
  }
}

/// Step 3: with the global statistics (stats as summed over ranks; m = row_max[n], x_t =
/// stats[N+n]), writes
///   losses[n] = log1p(stats[n])                  if x_t == m (stats[n]: the sum without the target)
///             = (m - x_t) + log(stats[n])        otherwise   (= ; 0 for ignored rows)
/// (Note [confident cross-entropy]: a loss of 1e-6 keeps its relative precision, bound as in
/// crossentropy_forward_backward) and, when write_dlogits, overwrites logits_local with
///   grad_scale * (softmax - [column is the target]), the target's entry as expm1(-loss) * grad_scale,
/// on real columns, 0 on padding columns and ignored rows. Returns the sum of the losses, added
/// serially in row order after the parallel loop: bitwise the same on every tp rank and in every
/// run whatever OpenMP team size each rank gets (an OpenMP reduction's partial sums follow the
/// team size: with OMP_NUM_THREADS=2 the tp ranks of one step reported losses 1 ulp apart).
template <class T>
acc_t<T> vocab_shard_finish(T* logits_local, acc_t<T>* losses, const acc_t<T>* row_max, const acc_t<T>* stats,
                            const std::int32_t* targets, int N, int rows, int valid, int begin, bool write_dlogits,
                            acc_t<T> grad_scale) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = logits_local + std::size_t(n) * rows;
    if (targets[n] == ignore_index) {
      losses[n] = 0;
      if (write_dlogits) std::fill(row, row + rows, T(0));
      continue;
    }
    const A mx = row_max[n], target_logit = stats[std::size_t(N) + n];
    const A log_sum = target_logit == mx ? A(std::log1p(stats[n])) : A(std::log(stats[n]));
    const A loss = (mx - target_logit) + log_sum;
    losses[n] = loss;
    if (write_dlogits) {
      for (int v = 0; v < valid; ++v) row[v] = T(std::exp((A(row[v]) - mx) - log_sum) * grad_scale);
      for (int v = valid; v < rows; ++v) row[v] = T(0);
      const int local = targets[n] - begin;
      if (local >= 0 && local < valid) row[local] = T(std::expm1(-loss) * grad_scale);
    }
  }
  A total = 0;
  for (int n = 0; n < N; ++n) total += losses[n];  // ignored rows hold 0
  return total;
}

}  // namespace loom::kernels::cpu
