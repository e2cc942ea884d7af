#pragma once
/// \file Causal multi-head self-attention, fused (flash-style) CPU kernel: tiled over queries
/// and keys with an online softmax, so the (T,T) score matrix never exists; forward keeps
/// only the per-row log-sum-exp, backward recomputes the scores tile by tile.
///
/// Source: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
/// Partitioning", arXiv:2307.08691, Algorithm 1 (forward) and Algorithm 2 (backward);
/// Dao et al., "FlashAttention", arXiv:2205.14135, §3.1 (online softmax, recomputation).
/// Layout and math are those of attention_reference.hpp; tile sizes come from
/// attention_traits.hpp. See docs/attention.md for the design and the measured speed.
///
/// Note [fused attention storage]: the kernel accumulates in place in `out` and `dqkv`, so the
/// storage type must be its own accumulator type (float or double); bfloat16 and half go
/// through the *_16 entry points (Note [fused attention in 16-bit storage]).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/dropout.hpp>
#include <loom/core/error.hpp>
#include <loom/kernels/cpu/attention_traits.hpp>
#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/attention_bf16.hpp>
#include <loom/kernels/cpu/detail/attention_fma.hpp>
#include <loom/kernels/cpu/detail/attention_shape.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/cpu/detail/workspace.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace loom::kernels::cpu {

namespace detail {

/// Forward of one query tile [i0, i0+bq) of head (b, h): streams every causally visible key
/// tile, keeps running row maxima m and sums l (online softmax), accumulates the unnormalised
/// output in place in `out`, then normalises it and writes lse = m + log(l).
/// s: block_q * block_k scratch for the score tile.
template <class Tr, class A>
void forward_tile(A* out, A* lse, const A* qkv, const attention_shape<A>& p, int b, int h, int i0, A* s) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  constexpr int HD = Tr::head_dim == 0 ? Eigen::Dynamic : Tr::head_dim;
  const int bq = std::min(BQ, p.T - i0);
  const Eigen::OuterStride<> ld(p.ld()), ldo(p.C);
  chead_rows<A, HD> q(qkv + p.q_at(b, h, i0), bq, p.hd, ld);
  head_rows<A, HD> o(out + p.out_at(b, h, i0), bq, p.hd, ldo);
  o.setZero();
  A m[BQ], l[BQ];
  std::fill_n(m, bq, neg_inf<A>);
  std::fill_n(l, bq, A(0));
  const int kend = i0 + bq;  // causal: no query of the tile sees a key >= kend
  for (int j0 = 0; j0 < kend; j0 += BK) {
    const int bk = std::min(BK, kend - j0);
    chead_rows<A, HD> k(qkv + p.k_at(b, h, j0), bk, p.hd, ld);
    chead_rows<A, HD> v(qkv + p.v_at(b, h, j0), bk, p.hd, ld);
    map<A> sc(s, bq, bk);
    sc.noalias() = p.scale * (q * k.transpose());
    online_softmax_rows(s, bk, bq, bk, bk, i0, j0, p, b, h, m, l, o.data(), p.C);
    o.noalias() += sc * v;
  }
  for (int r = 0; r < bq; ++r) {
    if (l[r] > A(0)) {
      o.row(r) *= A(1) / l[r];
      lse[p.row_at(b, h, i0 + r)] = m[r] + std::log(l[r]);
    } else {  // every key padded: zero output; +inf makes every backward probability 0
      o.row(r).setZero();
      lse[p.row_at(b, h, i0 + r)] = std::numeric_limits<A>::infinity();
    }
  }
}

/// Which gradients a (query tile, key tile) pair adds to.
enum pair_grads : unsigned { pair_dq = 1u, pair_dkv = 2u };

/// Backward of one (query tile [i0, i0+bq), key tile [j0, j0+bk)) pair of head (b, h):
///   P = exp(scale q k^T - lse) (recomputed), dP = dO v^T, dS = P .* (dP - D) * scale,
///   dv += P^T dO and dk += dS^T q (pair_dkv),  dq += dS k (pair_dq);
/// with dropout (p.drop active) P .* F replaces P in dv and F .* dP replaces dP in dS, F the
/// regenerated keep factors.
/// D: (T) = rowsum(dO .* O) of this head. s, dp: block_q * block_k scratch each.
template <class Tr, class A>
void backward_pair(A* dqkv, const A* dout, const A* qkv, const A* lse, const A* D, const attention_shape<A>& p, int b,
                   int h, int i0, int j0, A* s, A* dp, unsigned grads) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  constexpr int HD = Tr::head_dim == 0 ? Eigen::Dynamic : Tr::head_dim;
  const int bq = std::min(BQ, p.T - i0);
  const int bk = std::min(BK, i0 + bq - j0);  // keys after the tile's last query get nothing from it
  const Eigen::OuterStride<> ld(p.ld()), ldo(p.C);
  const std::size_t qi = p.q_at(b, h, i0), kj = p.k_at(b, h, j0), vj = p.v_at(b, h, j0);
  chead_rows<A, HD> q(qkv + qi, bq, p.hd, ld), k(qkv + kj, bk, p.hd, ld), v(qkv + vj, bk, p.hd, ld);
  chead_rows<A, HD> dy(dout + p.out_at(b, h, i0), bq, p.hd, ldo);
  map<A> P(s, bq, bk), dS(dp, bq, bk);
  P.noalias() = p.scale * (q * k.transpose());
  const std::uint8_t* pad = p.padding(b, j0);
  for (int r = 0; r < bq; ++r)
    probability_row(s + std::size_t(r) * bk, causal_prefix(i0 + r, j0, bk), bk, lse[p.row_at(b, h, i0 + r)], pad);
  if (p.drop.active()) {
    // with the keep factors F (0 or 1/(1-p)): O = (P .* F) V, so dV += (P .* F)^T dO and
    // dS = P .* (F .* dO V^T - D); D = rowsum(dO .* O) is unchanged (FlashAttention, Alg. 2)
    dS.noalias() = dy * v.transpose();
    for (int r = 0; r < bq; ++r) {
      const std::uint64_t base = p.drop_row(b, h, i0 + r) + std::uint64_t(j0);
      for (int c = 0; c < bk; ++c) {
        const A f = p.drop.template factor<A>(base + std::uint64_t(c));
        dS(r, c) = P(r, c) * (dS(r, c) * f - D[i0 + r]) * p.scale;
        P(r, c) *= f;
      }
    }
    if (grads & pair_dkv) head_rows<A, HD>(dqkv + vj, bk, p.hd, ld).noalias() += P.transpose() * dy;
  } else {
    if (grads & pair_dkv) head_rows<A, HD>(dqkv + vj, bk, p.hd, ld).noalias() += P.transpose() * dy;
    dS.noalias() = dy * v.transpose();
    for (int r = 0; r < bq; ++r) dS.row(r) = (P.row(r).array() * (dS.row(r).array() - D[i0 + r]) * p.scale).matrix();
  }
  if (grads & pair_dkv) head_rows<A, HD>(dqkv + kj, bk, p.hd, ld).noalias() += dS.transpose() * q;
  if (grads & pair_dq) head_rows<A, HD>(dqkv + qi, bq, p.hd, ld).noalias() += dS * k;
}

/// D[t] = rowsum(dO .* O) for the rows [i0, i0+bq) of head (b, h), into D (indexed by t).
/// With out == null, O is not available and D is recomputed as rowsum(P .* F .* dP) (F the
/// dropout keep factors, 1 without dropout) over the
/// visible key tiles (the same number: sum_s P_ts dO_t.v_s = dO_t.O_t), costing about one
/// extra forward pass.
template <class Tr, class A>
void delta_tile(A* D, const A* dout, const A* out, const A* qkv, const A* lse, const attention_shape<A>& p, int b, int h,
                int i0, A* s, A* dp) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  constexpr int HD = Tr::head_dim == 0 ? Eigen::Dynamic : Tr::head_dim;
  const int bq = std::min(BQ, p.T - i0);
  const Eigen::OuterStride<> ld(p.ld()), ldo(p.C);
  chead_rows<A, HD> dy(dout + p.out_at(b, h, i0), bq, p.hd, ldo);
  if (out) {
    chead_rows<A, HD> o(out + p.out_at(b, h, i0), bq, p.hd, ldo);
    for (int r = 0; r < bq; ++r) D[i0 + r] = dy.row(r).dot(o.row(r));
    return;
  }
  chead_rows<A, HD> q(qkv + p.q_at(b, h, i0), bq, p.hd, ld);
  std::fill_n(D + i0, bq, A(0));
  for (int j0 = 0; j0 < i0 + bq; j0 += BK) {
    const int bk = std::min(BK, i0 + bq - j0);
    chead_rows<A, HD> k(qkv + p.k_at(b, h, j0), bk, p.hd, ld), v(qkv + p.v_at(b, h, j0), bk, p.hd, ld);
    map<A> P(s, bq, bk), dP(dp, bq, bk);
    P.noalias() = p.scale * (q * k.transpose());
    const std::uint8_t* pad = p.padding(b, j0);
    for (int r = 0; r < bq; ++r)
      probability_row(s + std::size_t(r) * bk, causal_prefix(i0 + r, j0, bk), bk, lse[p.row_at(b, h, i0 + r)], pad);
    if (p.drop.active())
      for (int r = 0; r < bq; ++r) apply_dropout(s + std::size_t(r) * bk, bk, p, b, h, i0 + r, j0);
    dP.noalias() = dy * v.transpose();
    for (int r = 0; r < bq; ++r) D[i0 + r] += P.row(r).dot(dP.row(r));
  }
}

/// Zeroes rows [t0, t0+n) of one head's slice at `off` (q, k or v part) of dqkv.
template <class A>
void zero_head_rows(A* dqkv, const attention_shape<A>& p, std::size_t off, int n) {
  for (int r = 0; r < n; ++r) std::fill_n(dqkv + off + std::size_t(r) * p.ld(), p.hd, A(0));
}

inline int thread_id() noexcept {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline int thread_count() noexcept {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

template <class Tr, class A>
void fused_forward(A* out, A* lse, const A* qkv, const attention_shape<A>& p) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int nq = (p.T + BQ - 1) / BQ;
  const long heads = long(p.B) * p.NH, items = heads * nq;
  // Work item = (query tile, head); the most expensive (last) query tiles go first.
#pragma omp parallel
  {
    alignas(64) A s[BQ * BK];
#pragma omp for schedule(dynamic, 1)
    for (long it = 0; it < items; ++it) {
      const int qt = nq - 1 - int(it / heads), bh = int(it % heads);
      forward_tile<Tr>(out, lse, qkv, p, bh / p.NH, bh % p.NH, qt * BQ, s);
    }
  }
}

template <class Tr, class A>
void fused_backward(A* dqkv, const A* dout, const A* qkv, const A* out, const A* lse, A* scratch,
                    const attention_shape<A>& p) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int nq = (p.T + BQ - 1) / BQ, nk = (p.T + BK - 1) / BK;
  const int threads = thread_count();
  const int heads = p.B * p.NH, kv_items = p.B * p.nkv();
  A* tiles = scratch + std::size_t(threads) * p.T;
#pragma omp parallel
  {
    const int tid = thread_id();
    A* s = tiles + std::size_t(tid) * 2 * BQ * BK;  // BQ * BK <= attention_max_tile_elems
    A* dp = s + BQ * BK;
    if (kv_items >= threads || heads >= threads) {
      // One key/value head per work item (with its group of query heads, one after the other:
      // their dk, dv add up in place): key tiles outer (dk, dv of a tile complete before the
      // next), query tiles inner, dq accumulated in place. D lives in this thread's T elements.
      A* D = scratch + std::size_t(tid) * p.T;
#pragma omp for schedule(dynamic, 1)
      for (int kv = 0; kv < kv_items; ++kv) {
        const int b = kv / p.nkv(), h0 = kv % p.nkv() * p.group();
        zero_head_rows(dqkv, p, p.k_at(b, h0, 0), p.T);
        zero_head_rows(dqkv, p, p.v_at(b, h0, 0), p.T);
        for (int h = h0; h < h0 + p.group(); ++h) {
          zero_head_rows(dqkv, p, p.q_at(b, h, 0), p.T);
          for (int i0 = 0; i0 < p.T; i0 += BQ) delta_tile<Tr>(D, dout, out, qkv, lse, p, b, h, i0, s, dp);
          for (int j0 = 0; j0 < p.T; j0 += BK)
            for (int i0 = j0 / BQ * BQ; i0 < p.T; i0 += BQ)
              backward_pair<Tr>(dqkv, dout, qkv, lse, D, p, b, h, i0, j0, s, dp, pair_dq | pair_dkv);
        }
      }
    } else {
      // Fewer heads than threads: split each head into tiles. Three conflict-free passes:
      // D per query tile; dk, dv per key tile (of a key/value head, its query heads in turn); dq
      // per query tile (recomputing P and dP). D of head bh lives at scratch + bh*T (heads <
      // threads, so it fits).
#pragma omp for schedule(dynamic, 1)
      for (int it = 0; it < heads * nq; ++it) {
        const int bh = it % heads, i0 = (it / heads) * BQ;
        delta_tile<Tr>(scratch + std::size_t(bh) * p.T, dout, out, qkv, lse, p, bh / p.NH, bh % p.NH, i0, s, dp);
      }
#pragma omp for schedule(dynamic, 1)
      for (int it = 0; it < kv_items * nk; ++it) {
        const int kv = it % kv_items, j0 = (it / kv_items) * BK, b = kv / p.nkv(), h0 = kv % p.nkv() * p.group();
        const int bk = std::min(BK, p.T - j0);
        zero_head_rows(dqkv, p, p.k_at(b, h0, j0), bk);
        zero_head_rows(dqkv, p, p.v_at(b, h0, j0), bk);
        for (int h = h0; h < h0 + p.group(); ++h)
          for (int i0 = j0 / BQ * BQ; i0 < p.T; i0 += BQ)
            backward_pair<Tr>(dqkv, dout, qkv, lse, scratch + (std::size_t(b) * p.NH + h) * p.T, p, b, h, i0, j0, s,
                              dp, pair_dkv);
      }
#pragma omp for schedule(dynamic, 1)
      for (int it = 0; it < heads * nq; ++it) {
        const int qt = nq - 1 - it / heads, bh = it % heads, i0 = qt * BQ, b = bh / p.NH, h = bh % p.NH;
        zero_head_rows(dqkv, p, p.q_at(b, h, i0), std::min(BQ, p.T - i0));
        for (int j0 = 0; j0 < i0 + std::min(BQ, p.T - i0); j0 += BK)
          backward_pair<Tr>(dqkv, dout, qkv, lse, scratch + std::size_t(bh) * p.T, p, b, h, i0, j0, s, dp, pair_dq);
      }
    }
  }
}

/// Calls f(attention_traits<HD>{}) for a tuned head size, f(attention_traits<0>{}) otherwise.
template <class F>
void with_attention_traits(int hd, F&& f) {
  [&]<int... D>(std::integer_sequence<int, D...>) {
    const bool tuned = ((hd == D && (f(attention_traits<D>{}), true)) || ...);
    if (!tuned) f(attention_traits<0>{});
  }(attention_tuned_head_dims{});
}

template <class A>
attention_shape<A> checked_shape(const char* what, int B, int Tn, int C, int NH, const std::uint8_t* key_padding,
                                 const attention_dropout& drop = {}, int kv_heads = 0) {
  if (B < 0 || Tn < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    throw input_error(std::string(what) + ": invalid shape B=" + std::to_string(B) + " T=" + std::to_string(Tn) +
                      " C=" + std::to_string(C) + " NH=" + std::to_string(NH) +
                      "; B and T must be >= 0, C and NH > 0, and NH must divide C");
  const int heads = drop.heads > 0 ? drop.heads : NH;
  if (drop.head_offset < 0 || drop.head_offset + NH > heads)
    throw input_error(std::string(what) + ": dropout heads [" + std::to_string(drop.head_offset) + ", " +
                      std::to_string(drop.head_offset + NH) + ") lie outside the model's " + std::to_string(heads) +
                      " heads; pass head_offset = tp_rank * NH/TP and heads = NH of the unsharded model");
  if (kv_heads < 0 || (kv_heads > 0 && NH % kv_heads != 0))
    throw input_error(std::string(what) + ": " + std::to_string(kv_heads) + " key/value heads for " +
                      std::to_string(NH) + " query heads; grouped-query attention needs a count that divides the "
                      "query heads (0: as many as the query heads)");
  const int hd = C / NH;
  return {B, Tn, C, NH, hd, A(1) / std::sqrt(A(hd)), key_padding, drop.mask, 0, drop.head_offset, heads, kv_heads};
}

/// Copies head h of batch b of a (B,T,C) tensor (out, dout) into a (T, HD) fp32 block.
template <class T>
void gather_head(float* dst, const T* src, const attention_shape<float>& p, int b, int h) {
  for (int t = 0; t < p.T; ++t) widen(dst + std::size_t(t) * p.hd, src + p.out_at(b, h, t), p.hd);
}

/// The inverse of gather_head: rounds the fp32 block to T into head h of batch b.
template <class T>
void scatter_head(T* dst, const float* src, const attention_shape<float>& p, int b, int h) {
  for (int t = 0; t < p.T; ++t) narrow(dst + p.out_at(b, h, t), src + std::size_t(t) * p.hd, p.hd);
}

/// Copies query head h of batch b and the key and value head it reads out of qkv into a
/// (T, 3 HD) fp32 block [q | k | v] (the layout of one_head's problem).
template <class T>
void gather_qkv(float* dst, const T* qkv, const attention_shape<float>& p, int b, int h) {
  for (int t = 0; t < p.T; ++t) {
    float* d = dst + std::size_t(t) * 3 * p.hd;
    widen(d, qkv + p.q_at(b, h, t), p.hd);
    widen(d + p.hd, qkv + p.k_at(b, h, t), p.hd);
    widen(d + 2 * p.hd, qkv + p.v_at(b, h, t), p.hd);
  }
}

/// Head h of batch b as a (1, T, HD) problem with one head, for the fp32 tile kernels; its
/// dropout mask coordinates stay those of (b, h) in the whole call.
inline attention_shape<float> one_head(const attention_shape<float>& p, int b, int h) {
  return {1,      p.T,          p.hd, 1, p.hd, p.scale, p.key_padding ? p.key_padding + std::size_t(b) * p.T : nullptr,
          p.drop, p.batch0 + b, p.head0 + h, p.heads};
}

template <class Tr, class T>
void fused_forward_gathered(T* out, float* lse, const T* qkv, const attention_shape<float>& p) {
  if (attention_fma_usable(p.hd)) return fused_forward_fma<Tr>(out, lse, qkv, p);  // Note [fp32 attention products]
  constexpr int BQ = Tr::block_q;
  const int heads = p.B * p.NH;
  const std::size_t th = std::size_t(p.T) * p.hd;
  // Every thread takes its workspace before the dynamic loop, whether or not it gets an item,
  // so the first call grows all of them and later calls allocate nothing.
#pragma omp parallel
  {
    float* w = thread_workspace(4 * th + attention_max_tile_elems);
    float *q = w, *o = w + 3 * th, *s = w + 4 * th;
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < heads; ++bh) {
      const int b = bh / p.NH, h = bh % p.NH;
      gather_qkv(q, qkv, p, b, h);
      const auto p1 = one_head(p, b, h);
      for (int i0 = 0; i0 < p.T; i0 += BQ) forward_tile<Tr>(o, lse + std::size_t(bh) * p.T, q, p1, 0, 0, i0, s);
      scatter_head(out, o, p, b, h);
    }
  }
}

/// Backward per key/value head (the query heads of its group in turn): each query head's dq is
/// rounded once; dk and dv are summed over the group in fp32 and rounded once.
template <class Tr, class T>
void fused_backward_gathered(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                       const attention_shape<float>& p) {
  if (attention_fma_usable(p.hd)) return fused_backward_fma<Tr>(dqkv, dout, qkv, out, lse, p);
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int kv_items = p.B * p.nkv();
  const std::size_t th = std::size_t(p.T) * p.hd;
#pragma omp parallel
  {
    float* w = thread_workspace(11 * th + p.T + 2 * std::size_t(attention_max_tile_elems));  // as in forward
    float *q = w, *dq = w + 3 * th, *dy = w + 6 * th, *o = w + 7 * th, *dk = w + 8 * th, *dv = w + 9 * th;
    float *D = w + 10 * th, *s = D + p.T, *dp = s + attention_max_tile_elems;
#pragma omp for schedule(dynamic, 1)
    for (int kv = 0; kv < kv_items; ++kv) {
      const int b = kv / p.nkv(), h0 = kv % p.nkv() * p.group();
      for (int h = h0; h < h0 + p.group(); ++h) {
        gather_qkv(q, qkv, p, b, h);
        gather_head(dy, dout, p, b, h);
        if (out) gather_head(o, out, p, b, h);
        std::fill_n(dq, 3 * th, 0.0f);
        const auto p1 = one_head(p, b, h);
        const float* l = lse + (std::size_t(b) * p.NH + h) * p.T;
        for (int i0 = 0; i0 < p.T; i0 += BQ) delta_tile<Tr>(D, dy, out ? o : nullptr, q, l, p1, 0, 0, i0, s, dp);
        for (int j0 = 0; j0 < p.T; j0 += BK)
          for (int i0 = j0 / BQ * BQ; i0 < p.T; i0 += BQ)
            backward_pair<Tr>(dq, dy, q, l, D, p1, 0, 0, i0, j0, s, dp, pair_dq | pair_dkv);
        for (int t = 0; t < p.T; ++t) {  // dq of head h; dk, dv of the group summed in fp32
          const float* g = dq + std::size_t(t) * 3 * p.hd;
          narrow(dqkv + p.q_at(b, h, t), g, p.hd);
          float *k = dk + std::size_t(t) * p.hd, *v = dv + std::size_t(t) * p.hd;
          for (int i = 0; i < p.hd; ++i) {
            k[i] = h == h0 ? g[p.hd + i] : k[i] + g[p.hd + i];
            v[i] = h == h0 ? g[2 * p.hd + i] : v[i] + g[2 * p.hd + i];
          }
        }
      }
      for (int t = 0; t < p.T; ++t) {
        narrow(dqkv + p.k_at(b, h0, t), dk + std::size_t(t) * p.hd, p.hd);
        narrow(dqkv + p.v_at(b, h0, t), dv + std::size_t(t) * p.hd, p.hd);
      }
    }
  }
}

}  // namespace detail

/// Note [fused attention in 16-bit storage]: for bfloat16 and half storage the fused kernel
/// runs head by head, one thread per (batch, head) (backward: per (batch, key/value head), whose
/// group of query heads runs in turn and sums dk, dv in fp32), so B·NH should be >= the thread
/// count (true for every model config here). Three implementations (attention_products),
/// chosen per machine at run time by `automatic`:
///  - amx_bf16 (bfloat16 storage, a CPU with AMX-BF16, HD a multiple of 32; the default there):
///    the tile products take bf16 operands and accumulate in fp32 on AMX tiles (TDPBF16PS,
///    Note [AMX attention products] in detail/attention_amx.hpp), P and dS rounded to bf16 per
///    tile as FlashAttention-2 does on GPUs; the online softmax, the log-sum-exp and every
///    accumulator stay fp32 (Note [bf16 attention products] in detail/attention_bf16.hpp, with
///    its error bound).
///  - bf16_dot (bfloat16 storage, a CPU with AVX512-BF16, HD a multiple of 16): the same
///    operands and roundings on VDPBF16PS; the default where the CPU has no AMX and its
///    VDPBF16PS unit outruns its fp32 FMA (AMD Zen 4/5: detail::bf16_unit_faster_than_fp32).
///    Workspace per thread (both bf16 kinds): 3 T HD / 2 + one tile floats in forward,
///    13 T HD / 2 + T + 3.5 tiles in backward (T padded to 128).
///  - fp32 (half storage, other CPUs, other head sizes, or asked for): the head's q, k, v (and
///    dO, O) are gathered into fp32 blocks and run the float path's tile kernels (the AVX-512
///    FMA products of Note [fp32 attention products] where the CPU has AVX-512F and HD is a
///    multiple of 16); the only roundings are the 16-bit inputs and outputs themselves.
///    Workspace per thread: 3 T HD + one tile + block_q HD floats in forward, 8 T HD + T + two
///    tiles in backward (T padded to 128) on the FMA products; (4 T HD + one tile) and (11 T HD
///    + T + two tiles) otherwise.
/// Workspaces are kept per thread across calls.

/// Which products the 16-bit fused attention runs (Note [fused attention in 16-bit storage]).
enum class attention_products {
  automatic,  ///< attention_products_default<T>(HD): the fastest that runs on this machine
  fp32,       ///< operands widened to fp32, the float path's tiles (one rounding: the outputs)
  bf16_dot,   ///< bf16 operands, fp32 accumulation (VDPBF16PS); input_error where unavailable
  amx_bf16,   ///< bf16 operands, fp32 accumulation on AMX tiles; input_error where unavailable
};

/// True when attention_products::bf16_dot can run for storage T and head size hd on this CPU
/// (run-time check: cpuid, as the bf16 GEMM).
template <class T>
bool attention_bf16_dot_available(int hd) noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return detail::attention_bf16_usable(hd);
  return false;
}

/// True when attention_products::amx_bf16 can run for storage T and head size hd on this CPU
/// (run-time check: cpuid and the OS's grant of the AMX tile state).
template <class T>
bool attention_amx_available(int hd) noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return detail::attention_amx_usable(hd);
  return false;
}

/// What attention_products::automatic runs for storage T and head size hd on this machine:
/// amx_bf16 where it runs; else bf16_dot where it runs and the CPU's VDPBF16PS unit outruns its
/// fp32 FMA units (on the Intel Xeons without AMX it is half their rate, and the fp32 products
/// measured faster: bench/bench_attention --bf16); else fp32.
template <class T>
attention_products attention_products_default(int hd) noexcept {
  if (attention_amx_available<T>(hd)) return attention_products::amx_bf16;
  if (attention_bf16_dot_available<T>(hd) && detail::bf16_unit_faster_than_fp32()) return attention_products::bf16_dot;
  return attention_products::fp32;
}

namespace detail {
/// Resolves `automatic` for storage T and head size hd; throws when bf16_dot or amx_bf16 is
/// asked for and cannot run.
template <class T>
attention_products resolve_products(attention_products products, int hd, const char* what) {
  if (products == attention_products::bf16_dot && !attention_bf16_dot_available<T>(hd))
    throw input_error(std::string(what) + ": attention_products::bf16_dot needs bfloat16 storage, a head size that is a "
                      "multiple of 16 (got " + std::to_string(hd) + ") and a CPU with AVX512-BF16; use automatic");
  if (products == attention_products::amx_bf16 && !attention_amx_available<T>(hd))
    throw input_error(std::string(what) + ": attention_products::amx_bf16 needs bfloat16 storage, a head size that is a "
                      "multiple of 32 (got " + std::to_string(hd) + ") and a CPU with AMX-BF16; use automatic");
  return products == attention_products::automatic ? attention_products_default<T>(hd) : products;
}
}  // namespace detail

/// Forward for 16-bit storage T (bfloat16, half): as attention_fused_forward below, with the
/// log-sum-exp in fp32; `products` picks the implementation (default: the fastest available).
/// See Note [fused attention in 16-bit storage].
template <class T>
void attention_fused_forward_16(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH,
                                const std::uint8_t* key_padding = nullptr, const attention_dropout& drop = {},
                                int kv_heads = 0, attention_products products = attention_products::automatic) {
  const auto p = detail::checked_shape<float>("attention_fused_forward", B, Tn, C, NH, key_padding, drop, kv_heads);
  const auto run = detail::resolve_products<T>(products, p.hd, "attention_fused_forward");
  if (B == 0 || Tn == 0) return;
  detail::with_attention_traits(p.hd, [&]<class Tr>(Tr) {
    if constexpr (std::is_same_v<T, Eigen::bfloat16>)
      if (run != attention_products::fp32)
        return detail::fused_forward_bf16<Tr>(out, lse, qkv, p, run == attention_products::amx_bf16);
    detail::fused_forward_gathered<Tr>(out, lse, qkv, p);
  });
}

/// Backward for 16-bit storage T: as attention_fused_backward below (out may be null), no
/// scratch argument (per-thread workspace); `products` as in the forward (it need not match).
/// See Note [fused attention in 16-bit storage].
template <class T>
void attention_fused_backward_16(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int Tn,
                                 int C, int NH, const std::uint8_t* key_padding = nullptr,
                                 const attention_dropout& drop = {}, int kv_heads = 0,
                                 attention_products products = attention_products::automatic) {
  const auto p = detail::checked_shape<float>("attention_fused_backward", B, Tn, C, NH, key_padding, drop, kv_heads);
  const auto run = detail::resolve_products<T>(products, p.hd, "attention_fused_backward");
  if (B == 0 || Tn == 0) return;
  detail::with_attention_traits(p.hd, [&]<class Tr>(Tr) {
    if constexpr (std::is_same_v<T, Eigen::bfloat16>)
      if (run != attention_products::fp32)
        return detail::fused_backward_bf16<Tr>(dqkv, dout, qkv, out, lse, p, run == attention_products::amx_bf16);
    detail::fused_backward_gathered<Tr>(dqkv, dout, qkv, out, lse, p);
  });
}

/// Scratch elements (accumulator type) attention_fused_backward needs for `threads` OpenMP
/// threads and sequence length T: T per thread for D, plus two score tiles per thread.
constexpr std::size_t attention_fused_scratch_elems(std::size_t threads, std::size_t Tn) {
  return threads * (Tn + 2 * std::size_t(attention_max_tile_elems));
}

/// Forward.
///   out          (B,T,C) written (=), heads concatenated as in attention_forward
///   lse          (B,NH,T) written (=): log-sum-exp of each scaled, masked score row
///                (+inf for a row with no visible key) — the only saved state
///   qkv          (B,T,3C) [q | k | v], head h at channels [h*HD, (h+1)*HD); with kv_heads > 0
///                (grouped-query attention) (B,T,(NH + 2 kv_heads) HD) [q: NH heads | k | v:
///                kv_heads heads each], query head h reading key/value head h / (NH/kv_heads);
///                the repeated keys and values are never materialised
///   kv_heads     key/value heads, dividing NH; 0 (default) = NH
///   key_padding  (B,T) or null; non-zero marks a padded key no query attends to (PyTorch's
///                key_padding_mask convention). A query with no visible key gets out = 0.
///   drop         attention-probability dropout (attention_dropout); default none
/// Math: out = (softmax(mask(q k^T / sqrt(HD))) .* F) v, causal, as attention_forward; F = 1
/// without dropout, else the keep factors 0 or 1/(1-p) of attention_dropout_keep (Srivastava
/// et al. 2014; PyTorch scaled_dot_product_attention's dropout_p). lse is that of the
/// undropped scores.
/// Parallel with OpenMP: float storage with B NH >= threads runs head by head, each head's q,
/// k, v gathered into a contiguous per-thread workspace (allocated on the first call and kept;
/// sizes in Note [fused attention in 16-bit storage], fp32 bullet), its tile products on
/// loom's AVX-512 FMA micro-kernel where the CPU has AVX-512F and HD is a multiple of 16 (Note
/// [fp32 attention products]; 1.2x Eigen's tile products at T = 1024, bench/bench_attention
/// --bf16), else on Eigen's; otherwise (double, or fewer heads than threads) over (batch, head,
/// query tile) in place with Eigen's products, with no heap allocation.
/// Cost: about 2 B NH T^2 HD flops (causal half of the square, plus the diagonal tiles); with
/// dropout one 64-bit hash per visible probability.
/// Extra memory: B NH T saved, one block_q x block_k tile per thread on the stack (and the
/// per-thread workspace of the head-by-head path above); the dropout mask is never stored.
/// Errors: loom::input_error when NH does not divide C or a size is negative, when kv_heads does
/// not divide NH, or when the dropout's heads [head_offset, head_offset + NH) exceed its global
/// head count.
template <class T>
void attention_fused_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH,
                             const std::uint8_t* key_padding = nullptr, const attention_dropout& drop = {},
                             int kv_heads = 0) {
  static_assert(std::is_same_v<T, acc_t<T>>, "attention_fused: storage must be float or double (Note [fused attention storage])");
  const auto p = detail::checked_shape<T>("attention_fused_forward", B, Tn, C, NH, key_padding, drop, kv_heads);
  if (B == 0 || Tn == 0) return;
  detail::with_attention_traits(p.hd, [&]<class Tr>(Tr) {
    if constexpr (std::is_same_v<T, float>)
      if (B * NH >= detail::thread_count()) return detail::fused_forward_gathered<Tr>(out, lse, qkv, p);
    detail::fused_forward<Tr>(out, lse, qkv, p);
  });
}

/// Backward of attention_fused_forward.
///   dqkv     (B,T,3C), or (B,T,(NH + 2 kv_heads) HD), written (=); a key/value head's dk, dv
///            sum the gradients of its group of query heads
///   dout     (B,T,C) gradient of out
///   qkv, lse, key_padding, drop  as given to / written by the forward (the same `drop`:
///            its mask is regenerated tile by tile, never stored)
///   out      (B,T,C) the forward's output, or null: then D = rowsum(dO .* O) is recomputed
///            from the scores (about one extra forward's flops)
///   scratch  attention_fused_scratch_elems(omp_get_max_threads(), T) elements
/// Math (FlashAttention-2, Algorithm 2): D = rowsum(dO .* O); per tile pair P = exp(S - lse),
/// dV += P^T dO, dP = dO V^T, dS = P .* (dP - D), dQ += dS K / sqrt(HD), dK += dS^T Q / sqrt(HD);
/// with dropout's keep factors F: dV += (P .* F)^T dO and dS = P .* (F .* dP - D).
/// Parallel over (batch, key/value head): float storage with at least as many key/value heads
/// as threads gathers each head into a per-thread workspace (allocated on the first call and
/// kept; `scratch` is then unused) and runs the forward's products; otherwise
/// in place. With fewer heads than threads, over query and key tiles in three passes (D;
/// dk, dv; dq), which recomputes P and dP once more.
/// Cost: about 5 B NH T^2 HD flops (+2 without out; the tile-split passes add 3).
/// Errors: loom::input_error when NH does not divide C, kv_heads does not divide NH, or a size
/// is negative.
template <class T>
void attention_fused_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, T* scratch, int B,
                              int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr,
                              const attention_dropout& drop = {}, int kv_heads = 0) {
  static_assert(std::is_same_v<T, acc_t<T>>, "attention_fused: storage must be float or double (Note [fused attention storage])");
  const auto p = detail::checked_shape<T>("attention_fused_backward", B, Tn, C, NH, key_padding, drop, kv_heads);
  if (B == 0 || Tn == 0) return;
  detail::with_attention_traits(p.hd, [&]<class Tr>(Tr) {
    if constexpr (std::is_same_v<T, float>)
      if (B * p.nkv() >= detail::thread_count())
        return detail::fused_backward_gathered<Tr>(dqkv, dout, qkv, out, lse, p);
    detail::fused_backward<Tr>(dqkv, dout, qkv, out, lse, scratch, p);
  });
}

// Note [explicit kernel instantiations]: the fused attention kernels are instantiated for every
// tuned head size (attention_tuned_head_dims) plus the generic traits, which costs GCC about
// 30 s (-O3) per storage type in every translation unit that runs them. A program made of
// many translation units (loom's own tests, examples and benchmarks: CMake target
// loom_kernel_instances) compiles them once: every translation unit is compiled with
// LOOM_CPU_EXTERN_KERNELS defined, which declares the instances below `extern template`
// (called, never instantiated there), and one translation unit per storage type holds the
// explicit instantiation definitions, LOOM_CPU_FUSED_ATTENTION_INSTANCES(template, float) and
// so on (cmake/kernel_instances/). Without LOOM_CPU_EXTERN_KERNELS (the default) every
// translation unit instantiates what it uses, as with any header-only template. The code is
// the same either way; only where it is compiled changes. kernels/cpu/matmul.hpp does the same.
#define LOOM_CPU_FUSED_ATTENTION_INSTANCES(PREFIX, T)                                                         \
  PREFIX void attention_fused_forward<T>(T*, T*, const T*, int, int, int, int, const std::uint8_t*,             \
                                         const attention_dropout&, int);                                        \
  PREFIX void attention_fused_backward<T>(T*, const T*, const T*, const T*, const T*, T*, int, int, int, int,   \
                                          const std::uint8_t*, const attention_dropout&, int);
#define LOOM_CPU_FUSED_ATTENTION_16_INSTANCES(PREFIX, T)                                                       \
  PREFIX void attention_fused_forward_16<T>(T*, float*, const T*, int, int, int, int, const std::uint8_t*,      \
                                            const attention_dropout&, int, attention_products);                 \
  PREFIX void attention_fused_backward_16<T>(T*, const T*, const T*, const T*, const float*, int, int, int, int, \
                                             const std::uint8_t*, const attention_dropout&, int, attention_products);
#ifdef LOOM_CPU_EXTERN_KERNELS
LOOM_CPU_FUSED_ATTENTION_INSTANCES(extern template, float)
LOOM_CPU_FUSED_ATTENTION_INSTANCES(extern template, double)
LOOM_CPU_FUSED_ATTENTION_16_INSTANCES(extern template, Eigen::bfloat16)
LOOM_CPU_FUSED_ATTENTION_16_INSTANCES(extern template, Eigen::half)
#endif

}  // namespace loom::kernels::cpu
