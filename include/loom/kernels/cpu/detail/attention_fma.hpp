#pragma once
/// \file Private: the fused attention's fp32 tile products on an AVX-512 FMA micro-kernel over
/// per-head gathered arrays, for float storage and for 16-bit storage with fp32 products
/// (attention_products::fp32). Called by fused_forward_gathered / fused_backward_gathered
/// (kernels/cpu/attention_fused.hpp) when the CPU has AVX-512F and HD is a multiple of 16
/// (checked at run time); otherwise those run the Eigen tile products.
///
/// Note [fp32 attention products]: the math, tiles and work split are those of the fp32 tile
/// kernels (FlashAttention-2, arXiv:2307.08691, Algorithms 1 and 2); only how the five products
/// run changes. Eigen packs both operands of every tile product into its own panels on each call
/// (measured about 16 % of the fused backward at T = 1024, HD 64, plus ~10 % of copies); here
/// each head is gathered once into fp32 arrays laid out for one micro-kernel (attn_fma), which
/// broadcasts A elements from any (row, contraction) stride and loads B rows 16 floats at a
/// time, so no tile is ever repacked:
///   Qn, dOn, Kn, Vn   [Tp][HD]  natural rows (Kn only in backward, Vn only in forward)
///   Kt, Vt            [HD][Tp + 16]  transposed (attn_trans_ld): the B operand of S = Q K^T
///                     and dP = dO V^T
/// (Tp: T padded with zero rows to a multiple of 128). The products, as (A, B) -> C:
///   forward   S = scale Qn Kt,  O += P Vn
///   backward  S = scale Qn Kt,  dP = dOn Vt,  dV += P^T dOn,  dK += dS^T Qn,  dQ += dS Kn
/// where P^T and dS^T are read down the columns of the score tiles (a broadcast per element,
/// whatever its stride). Score tiles are bk rounded up to 16 columns wide, the extra columns
/// zero (their keys' Kt/Vt columns are zero rows past T or finite values, so 0 * x = 0).
/// Results equal the Eigen path's up to the order of fp32 additions.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <loom/kernels/cpu/detail/attention_shape.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/cpu/detail/gemm_avx512_bf16.hpp>
#include <loom/kernels/cpu/detail/softmax_avx512.hpp>
#include <loom/kernels/cpu/detail/workspace.hpp>

namespace loom::kernels::cpu::detail {

/// Rows of a head's gathered fp32 arrays are padded to a multiple of this (every block_q and
/// block_k divides it).
inline constexpr int attn_fma_row_pad = 128;

/// True when the FMA tile products can run for head size hd: compiled for x86 (GCC >= 10 or
/// Clang >= 9), the CPU has AVX-512F, and hd is a multiple of 16 (whole vectors along the head
/// dimension). Read once per process.
inline bool attention_fma_usable(int hd) noexcept {
#if LOOM_GEMM_HAS_AVX512_BF16
  return hd % 16 == 0 && softmax_avx512_usable();  // the AVX-512F check of the softmax rows
#else
  (void)hd;
  return false;
#endif
}

#if LOOM_GEMM_HAS_AVX512_BF16

#define LOOM_TARGET_AVX512F __attribute__((target("avx512f")))

/// c(r, 0 .. 16 NV) for r < rows (<= MR) = alpha sum_k A(r, k) B(k, :), or (accumulate) c +=
/// sum_k A(r, k) B(k, :) (alpha unused). A(r, k) = a[r a_row + k a_k] (broadcast), B(k, :) the
/// 16 NV floats at b + k ldb. Rows past `rows` recompute row rows - 1 and are never stored.
template <int MR, int NV>
LOOM_TARGET_AVX512F inline void attn_fma_block(int kn, const float* a, std::ptrdiff_t a_row, std::ptrdiff_t a_k,
                                               const float* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc,
                                               int rows, bool accumulate, float alpha) {
  __m512 acc[MR][NV];
  const float* ar[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    ar[i] = a + std::min(i, rows - 1) * a_row;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate && i < rows ? _mm512_loadu_ps(c + i * ldc + 16 * v) : _mm512_setzero_ps();
  }
  for (int k = 0; k < kn; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(ar[i][k * a_k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(c + i * ldc + 16 * v, accumulate ? acc[i][v] : _mm512_mul_ps(va, acc[i][v]));
  }
}

template <int MR>
LOOM_TARGET_AVX512F inline void attn_fma_rows(int cols, int kn, const float* a, std::ptrdiff_t a_row,
                                              std::ptrdiff_t a_k, const float* b, std::ptrdiff_t ldb, float* c,
                                              std::ptrdiff_t ldc, int rows, bool accumulate, float alpha) {
  for (int c0 = 0; c0 < cols; c0 += 64) {
    switch (std::min(4, (cols - c0) / 16)) {
      case 4: attn_fma_block<MR, 4>(kn, a, a_row, a_k, b + c0, ldb, c + c0, ldc, rows, accumulate, alpha); break;
      case 3: attn_fma_block<MR, 3>(kn, a, a_row, a_k, b + c0, ldb, c + c0, ldc, rows, accumulate, alpha); break;
      case 2: attn_fma_block<MR, 2>(kn, a, a_row, a_k, b + c0, ldb, c + c0, ldc, rows, accumulate, alpha); break;
      default: attn_fma_block<MR, 1>(kn, a, a_row, a_k, b + c0, ldb, c + c0, ldc, rows, accumulate, alpha); break;
    }
  }
}

/// Which part of a product a diagonal tile needs (query i0 + r sees key j0 + c iff c <= r +
/// shift, shift = i0 - j0 >= 0): attn_fma skips, per block of output rows, what no row of the
/// block can use, so the causal triangle's empty half is not computed.
struct attn_causal {
  enum kind {
    all,          ///< everything (off-diagonal tiles)
    key_columns,  ///< C row r = query, columns = keys: columns past r + shift are not needed
    key_prefix,   ///< C row r = query, contraction over keys: terms past key r + shift are 0
    query_suffix, ///< C row r = key, contraction over queries: terms before query r - shift are 0
  } what = all;
  int shift = 0;
};

/// C (rows x cols) = alpha A B, or C += A B (accumulate), contraction length kn; cols a
/// multiple of 16. A(r, k) = a[r a_row + k a_k]; B row k at b + k ldb; C row stride ldc.
/// Blocks of 6 rows x 64 columns (24 accumulators), the last rows in a block of 4 or 6.
/// causal: with key_columns, columns of a row block past its last row's visible keys (rounded
/// up to 16) are not written; with key_prefix / query_suffix the contraction of a row block
/// skips terms no row of it sees (they must be zero in A).
LOOM_TARGET_AVX512F inline void attn_fma(int rows, int cols, int kn, const float* a, std::ptrdiff_t a_row,
                                         std::ptrdiff_t a_k, const float* b, std::ptrdiff_t ldb, float* c,
                                         std::ptrdiff_t ldc, bool accumulate, float alpha = 1.0f,
                                         attn_causal causal = {}) {
  for (int r0 = 0; r0 < rows; r0 += 6) {
    const int nr = std::min(6, rows - r0);
    int n = cols, k0 = 0, k1 = kn;
    const int last_key = r0 + nr - 1 + causal.shift;  // the block's last row sees keys <= this
    if (causal.what == attn_causal::key_columns) n = std::min(cols, (last_key + 16) / 16 * 16);
    if (causal.what == attn_causal::key_prefix) k1 = std::min(kn, last_key + 1);
    if (causal.what == attn_causal::query_suffix) k0 = std::clamp(r0 - causal.shift, 0, kn);
    if (n <= 0 || (accumulate && k1 <= k0)) continue;
    const float* ai = a + r0 * a_row + k0 * a_k;
    const float* bi = b + k0 * ldb;
    float* ci = c + r0 * ldc;
    const int k = std::max(0, k1 - k0);
    if (nr > 4) attn_fma_rows<6>(n, k, ai, a_row, a_k, bi, ldb, ci, ldc, nr, accumulate, alpha);
    else attn_fma_rows<4>(n, k, ai, a_row, a_k, bi, ldb, ci, ldc, nr, accumulate, alpha);
  }
}

#endif  // LOOM_GEMM_HAS_AVX512_BF16

/// Gathers rows t < T of one head (row t at src + at(t), hd values, widened to fp32) into
/// natural (if non-null, [Tp][hd]) and trans (if non-null, [hd][attn_trans_ld(Tp)],
/// trans[d][t] = row t [d]); rows (columns) T .. Tp are zero.
template <class T, class At>
void attn_fma_gather(float* natural, float* trans, const T* src, At at, int Tn, int Tp, int hd) {
  float row[convert_chunk];
  const std::size_t ldt = std::size_t(attn_trans_ld(Tp));
  for (int t = 0; t < Tn; ++t) {
    if (t + attn_prefetch_rows < Tn) prefetch_bytes(src + at(t + attn_prefetch_rows), sizeof(T) * hd);
    float* x = natural ? natural + std::size_t(t) * hd : row;
    widen(x, src + at(t), hd);
    if (trans)
      for (int d = 0; d < hd; ++d) trans[std::size_t(d) * ldt + t] = x[d];
  }
  if (natural) std::fill(natural + std::size_t(Tn) * hd, natural + std::size_t(Tp) * hd, 0.0f);
  if (trans)
    for (int d = 0; d < hd; ++d) std::fill(trans + std::size_t(d) * ldt + Tn, trans + std::size_t(d) * ldt + Tp, 0.0f);
}

#if LOOM_GEMM_HAS_AVX512_BF16

/// Forward of query tile [i0, i0+bq) of head (b, h) on the FMA products (Note [fp32 attention
/// products]); qn, kt, vn the head's gathered arrays (Tp rows); o: block_q x hd; s: block_q x
/// block_k. Writes the tile's out rows (rounded to T) and lse.
template <class Tr, class T>
void forward_tile_fma(T* out, float* lse, const float* qn, const float* kt, const float* vn,
                      const attention_shape<float>& p, int b, int h, int i0, int Tp, float* o, float* s) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int hd = p.hd, bq = std::min(BQ, p.T - i0);
  std::fill_n(o, std::size_t(bq) * hd, 0.0f);
  float m[BQ], l[BQ];
  std::fill_n(m, bq, neg_inf<float>);
  std::fill_n(l, bq, 0.0f);
  const int kend = i0 + bq;
  for (int j0 = 0; j0 < kend; j0 += BK) {
    const int bk = std::min(BK, kend - j0), bk16 = (bk + 15) / 16 * 16;
    const int shift = i0 - j0;  // score columns past a row block's last visible key stay unwritten:
    attn_fma(bq, bk16, hd, qn + std::size_t(i0) * hd, hd, 1, kt + j0, attn_trans_ld(Tp), s, BK, false, p.scale,
             {attn_causal::key_columns, shift});
    online_softmax_rows(s, BK, bq, bk, bk16, i0, j0, p, b, h, m, l, o, hd);  // zeroes them
    attn_fma(bq, hd, bk, s, BK, 1, vn + std::size_t(j0) * hd, hd, o, hd, true, 1.0f, {attn_causal::key_prefix, shift});
  }
  for (int r = 0; r < bq; ++r) {
    float* orow = o + std::size_t(r) * hd;
    if (l[r] > 0.0f) {
      const float inv = 1.0f / l[r];
      for (int d = 0; d < hd; ++d) orow[d] *= inv;
      lse[p.row_at(b, h, i0 + r)] = m[r] + std::log(l[r]);
    } else {  // every key padded: zero output; +inf makes every backward probability 0
      std::fill_n(orow, hd, 0.0f);
      lse[p.row_at(b, h, i0 + r)] = std::numeric_limits<float>::infinity();
    }
    narrow(out + p.out_at(b, h, i0 + r), orow, hd);
  }
}

/// Forward over all (batch, head) on the FMA products: per head, gather Qn, Kt, Vn once, then
/// its query tiles in turn. Workspace per thread: 3 (Tp + 16) hd + block_q (hd + block_k) floats.
template <class Tr, class T>
void fused_forward_fma(T* out, float* lse, const T* qkv, const attention_shape<float>& p) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  static_assert(attn_fma_row_pad % BQ == 0 && attn_fma_row_pad % BK == 0);
  const int heads = p.B * p.NH, hd = p.hd;
  const int Tp = (p.T + attn_fma_row_pad - 1) / attn_fma_row_pad * attn_fma_row_pad;
  const std::size_t th = std::size_t(attn_trans_ld(Tp)) * hd;  // a gathered array, natural or transposed
  // Every thread takes its workspace before the dynamic loop, whether or not it gets an item,
  // so the first call grows all of them and later calls allocate nothing.
#pragma omp parallel
  {
    float* w = thread_workspace(3 * th + std::size_t(BQ) * (hd + BK));
    float *qn = w, *kt = w + th, *vn = w + 2 * th, *o = w + 3 * th, *s = o + std::size_t(BQ) * hd;
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < heads; ++bh) {
      const int b = bh / p.NH, h = bh % p.NH;
      attn_fma_gather(qn, nullptr, qkv, [&](int t) { return p.q_at(b, h, t); }, p.T, Tp, hd);
      attn_fma_gather(nullptr, kt, qkv, [&](int t) { return p.k_at(b, h, t); }, p.T, Tp, hd);
      attn_fma_gather(vn, nullptr, qkv, [&](int t) { return p.v_at(b, h, t); }, p.T, Tp, hd);
      for (int i0 = 0; i0 < p.T; i0 += BQ) forward_tile_fma<Tr>(out, lse, qn, kt, vn, p, b, h, i0, Tp, o, s);
    }
  }
}

/// The gathered arrays and tiles of one thread's FMA backward (Note [fp32 attention products]).
struct attn_fma_backward_buffers {
  float *qn, *dyn, *kn, *kt, *vt;  // gathered head: [Tp][hd] or [hd][attn_trans_ld(Tp)]
  float *dq, *dk, *dv, *D;         // fp32 accumulators (Tp x hd) and D (Tp)
  float *s, *dp;                   // block_q x block_k score tiles
};

/// S = scale Q K^T of tile (i0, j0) (bq x bk16) and its probabilities P = exp(S - lse) in w.s,
/// as probability_row (zero past each row's visible keys); then dP = dO V^T in w.dp, whose
/// columns past a row's visible keys may be left unwritten (attn_causal::key_columns): read
/// only each row's causal prefix of it.
template <class Tr>
void probabilities_fma(const attn_fma_backward_buffers& w, const float* lse, const attention_shape<float>& p, int b,
                       int h, int i0, int j0, int bq, int bk, int Tp) {
  constexpr int BK = Tr::block_k;
  const int hd = p.hd, bk16 = (bk + 15) / 16 * 16;
  const attn_causal columns{attn_causal::key_columns, i0 - j0};
  const int ldt = attn_trans_ld(Tp);
  attn_fma(bq, bk16, hd, w.qn + std::size_t(i0) * hd, hd, 1, w.kt + j0, ldt, w.s, BK, false, p.scale, columns);
  const std::uint8_t* pad = p.padding(b, j0);
  for (int r = 0; r < bq; ++r)
    probability_row(w.s + std::size_t(r) * BK, causal_prefix(i0 + r, j0, bk), bk16, lse[p.row_at(b, h, i0 + r)], pad);
  attn_fma(bq, bk16, hd, w.dyn + std::size_t(i0) * hd, hd, 1, w.vt + j0, ldt, w.dp, BK, false, 1.0f, columns);
}

/// Backward of the tile pair (query tile i0, key tile j0) of head (b, h) on the FMA products:
/// as backward_pair in attention_fused.hpp, adding to w.dq, w.dk, w.dv.
template <class Tr>
void backward_pair_fma(const attn_fma_backward_buffers& w, const float* lse, const attention_shape<float>& p, int b,
                       int h, int i0, int j0, int Tp) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int hd = p.hd, bq = std::min(BQ, p.T - i0), bk = std::min(BK, i0 + bq - j0);
  const int bk16 = (bk + 15) / 16 * 16;
  probabilities_fma<Tr>(w, lse, p, b, h, i0, j0, bq, bk, Tp);
  for (int r = 0; r < bq; ++r) {
    float *P = w.s + std::size_t(r) * BK, *dS = w.dp + std::size_t(r) * BK;
    const float D = w.D[i0 + r];
    const int n = causal_prefix(i0 + r, j0, bk);
    if (p.drop.active()) {  // as backward_pair: dS = P .* (F .* dP - D), P .* F into dV
      const std::uint64_t base = p.drop_row(b, h, i0 + r) + std::uint64_t(j0);
      for (int c = 0; c < n; ++c) {
        const float f = p.drop.template factor<float>(base + std::uint64_t(c));
        dS[c] = P[c] * (dS[c] * f - D) * p.scale;
        P[c] *= f;
      }
    } else {
      for (int c = 0; c < n; ++c) dS[c] = P[c] * (dS[c] - D) * p.scale;
    }
    std::fill(dS + n, dS + bk16, 0.0f);
  }
  const float *dy = w.dyn + std::size_t(i0) * hd, *q = w.qn + std::size_t(i0) * hd;
  const attn_causal after{attn_causal::query_suffix, i0 - j0}, before{attn_causal::key_prefix, i0 - j0};
  attn_fma(bk, hd, bq, w.s, 1, BK, dy, hd, w.dv + std::size_t(j0) * hd, hd, true, 1.0f, after);   // dV += P^T dO
  attn_fma(bk, hd, bq, w.dp, 1, BK, q, hd, w.dk + std::size_t(j0) * hd, hd, true, 1.0f, after);  // dK += dS^T Q
  attn_fma(bq, hd, bk, w.dp, BK, 1, w.kn + std::size_t(j0) * hd, hd, w.dq + std::size_t(i0) * hd, hd, true, 1.0f,
           before);  // dQ += dS K
}

/// Backward over all (batch, key/value head) on the FMA products, the query heads of a group in
/// turn (dk, dv summed over the group in fp32, rounded once), as fused_backward_gathered.
/// D = rowsum(dO .* O) from `out`, or (out null) rowsum(P .* F .* dP) over the visible tiles.
/// Workspace per thread: 8 (Tp + 16) hd + Tp + 2 block_q block_k floats.
template <class Tr, class T>
void fused_backward_fma(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        const attention_shape<float>& p) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  static_assert(attn_fma_row_pad % BQ == 0 && attn_fma_row_pad % BK == 0);
  const int kv_items = p.B * p.nkv(), hd = p.hd;
  const int Tp = (p.T + attn_fma_row_pad - 1) / attn_fma_row_pad * attn_fma_row_pad;
  const std::size_t th = std::size_t(attn_trans_ld(Tp)) * hd, tile = std::size_t(BQ) * BK;  // as in forward
#pragma omp parallel
  {
    float* base = thread_workspace(8 * th + Tp + 2 * tile);  // as in forward: before the loop
    attn_fma_backward_buffers w{base, base + th, base + 2 * th, base + 3 * th, base + 4 * th,
                                base + 5 * th, base + 6 * th, base + 7 * th, base + 8 * th, nullptr, nullptr};
    w.s = w.D + Tp, w.dp = w.s + tile;
#pragma omp for schedule(dynamic, 1)
    for (int kv = 0; kv < kv_items; ++kv) {
      const int b = kv / p.nkv(), h0 = kv % p.nkv() * p.group();
      attn_fma_gather(w.kn, w.kt, qkv, [&](int t) { return p.k_at(b, h0, t); }, p.T, Tp, hd);
      attn_fma_gather(nullptr, w.vt, qkv, [&](int t) { return p.v_at(b, h0, t); }, p.T, Tp, hd);
      std::fill_n(w.dk, 2 * th, 0.0f);  // dk and dv
      for (int h = h0; h < h0 + p.group(); ++h) {
        attn_fma_gather(w.qn, nullptr, qkv, [&](int t) { return p.q_at(b, h, t); }, p.T, Tp, hd);
        attn_fma_gather(w.dyn, nullptr, dout, [&](int t) { return p.out_at(b, h, t); }, p.T, Tp, hd);
        std::fill_n(w.dq, th, 0.0f);
        for (int i0 = 0; i0 < p.T; i0 += BQ) {
          const int bq = std::min(BQ, p.T - i0);
          if (out) {
            delta_from_output(w.D, dout, out, p, b, h, i0, bq);
            continue;
          }
          std::fill_n(w.D + i0, bq, 0.0f);
          for (int j0 = 0; j0 < i0 + bq; j0 += BK) {
            const int bk = std::min(BK, i0 + bq - j0);
            probabilities_fma<Tr>(w, lse, p, b, h, i0, j0, bq, bk, Tp);
            if (p.drop.active())
              for (int r = 0; r < bq; ++r) apply_dropout(w.s + std::size_t(r) * BK, bk, p, b, h, i0 + r, j0);
            for (int r = 0; r < bq; ++r) {  // the visible prefix only (probabilities_fma)
              float d = 0;
              for (int c = 0, n = causal_prefix(i0 + r, j0, bk); c < n; ++c)
                d += w.s[std::size_t(r) * BK + c] * w.dp[std::size_t(r) * BK + c];
              w.D[i0 + r] += d;
            }
          }
        }
        for (int j0 = 0; j0 < p.T; j0 += BK)
          for (int i0 = j0 / BQ * BQ; i0 < p.T; i0 += BQ) backward_pair_fma<Tr>(w, lse, p, b, h, i0, j0, Tp);
        scatter_head_rows(dqkv, [&](int t) { return p.q_at(b, h, t); }, w.dq, p.T, hd);
      }
      scatter_head_rows(dqkv, [&](int t) { return p.k_at(b, h0, t); }, w.dk, p.T, hd);
      scatter_head_rows(dqkv, [&](int t) { return p.v_at(b, h0, t); }, w.dv, p.T, hd);
    }
  }
}

#else  // no compiler support: never called (attention_fma_usable() is false)

template <class Tr, class T>
void fused_forward_fma(T*, float*, const T*, const attention_shape<float>&) {
  throw error("loom::kernels::cpu: this compiler cannot build the AVX-512 attention kernels");
}
template <class Tr, class T>
void fused_backward_fma(T*, const T*, const T*, const T*, const float*, const attention_shape<float>&) {
  throw error("loom::kernels::cpu: this compiler cannot build the AVX-512 attention kernels");
}

#endif

}  // namespace loom::kernels::cpu::detail
