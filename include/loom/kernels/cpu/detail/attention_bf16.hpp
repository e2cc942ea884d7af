#pragma once
/// \file Private: the fused attention's tile products on bf16 inputs with fp32 accumulation
/// (VDPBF16PS, AVX512-BF16), for bfloat16 storage. Called by attention_fused_forward_16 and
/// attention_fused_backward_16 (kernels/cpu/attention_fused.hpp) when the CPU has AVX512-BF16
/// (checked at run time, as detail/gemm_avx512_bf16.hpp does); otherwise the fp32 tiles run.
///
/// Note [bf16 attention products]: as FlashAttention-2 does in bf16 on GPUs (Dao,
/// arXiv:2307.08691, §3.1 and Algorithm 1), every product takes 16-bit operands and
/// accumulates in fp32; the online softmax (m, l), the log-sum-exp, the output accumulator O,
/// D = rowsum(dO .* O) and the dq, dk, dv accumulators stay fp32. The operands are the stored
/// bf16 q, k, v and dO (exact, no rounding) and, per tile, the probabilities P (forward: the
/// unnormalised exp(S - m), after dropout; backward: P .* F) and dS, each rounded to bf16
/// (round to nearest even) right before its products:
///   forward   S = Q K^T,  O += round(P) V
///   backward  S = Q K^T,  dP = dO V^T,  dV += round(P)^T dO,  dK += round(dS)^T Q,
///             dQ += round(dS) K
/// Error: the rounding of P adds at most u sum_j P_ij |v_j| to an output row (u = 2^-8, one
/// bf16 rounding), the rounding of dS at most u scale sum |dS| |k| (or |q|) to dq (dk); dV
/// gets u sum_i P_ij |dO_i|. fp32 accumulation adds ~HD 2^-24 relative, far below. The stored
/// outputs add their own rounding (u |x|). tests/unit/kernels/test_attention_bf16.cpp checks
/// every element against a float64 reference within exactly these bounds.
///
/// Layout: VDPBF16PS multiplies pairs of bf16 (one 32-bit word) along the contraction, so each
/// head is gathered once into word arrays (T padded with zero rows to a multiple of 128):
///   Qn, dOn       [T][HD/2]  natural rows (the pair runs along the head dimension)
///   Kt, Vt        [HD/2][T]  word (p, t) = pair p of row t (contraction over HD, keys in lanes)
///   Vi, Qi, Ki, dOi [T/2][HD] word (r, d) = x[2r][d] | x[2r+1][d] << 16 (contraction over rows)
/// Per tile, P and dS are rounded either as natural rows (A operand of O += P V, dQ += dS K)
/// or as row pairs (word (r, j) = x[2r][j] | x[2r+1][j] << 16: A operand of the transposed
/// products, read down its columns). One micro-kernel serves all six products: 4 rows x up to
/// 64 columns of fp32 accumulators, A words broadcast, B words loaded 16 at a time.
#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <loom/kernels/cpu/detail/attention_amx.hpp>
#include <loom/kernels/cpu/detail/attention_shape.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/cpu/detail/gemm_avx512_bf16.hpp>
#include <loom/kernels/cpu/detail/workspace.hpp>

namespace loom::kernels::cpu::detail {

/// Rows (and key columns) of a head's gathered arrays are padded to a multiple of this, which
/// every block_q and block_k divides.
inline constexpr int attn_bf16_row_pad = 128;

/// True when the bf16 tile products can run for head size hd: the CPU has AVX512-BF16 and hd
/// is a multiple of 16 (whole 16-lane vectors along the head dimension).
inline bool attention_bf16_usable(int hd) noexcept { return hd % 16 == 0 && gemm_avx512_bf16_supported(); }

#if LOOM_GEMM_HAS_AVX512_BF16

/// c(r, 0 .. 16 NV) for r < rows (<= 4) = alpha * sum_p A(r, p) . B(p, :), or (accumulate)
/// c += that sum (alpha must then be 1). A(r, p) is the 32-bit word a[r a_row + p a_pair], two
/// bf16 along the contraction; B(p, :) the 16 NV words at b + p b_pair. Rows past `rows` read
/// row rows - 1 and are never stored. fp32 accumulation (VDPBF16PS).
template <int NV>
LOOM_TARGET_AVX512_BF16 inline void attn_dot_rows4(int kp, const std::uint32_t* a, std::ptrdiff_t a_row,
                                                   std::ptrdiff_t a_pair, const std::uint32_t* b,
                                                   std::ptrdiff_t b_pair, float* c, std::ptrdiff_t ldc, int rows,
                                                   bool accumulate, float alpha) {
  __m512 acc[4][NV];
  const std::uint32_t* ar[4];
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    ar[i] = a + std::min(i, rows - 1) * a_row;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate && i < rows ? _mm512_loadu_ps(c + i * ldc + 16 * v) : _mm512_setzero_ps();
  }
  for (int p = 0; p < kp; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * b_pair + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < 4; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(int(ar[i][p * a_pair]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(c + i * ldc + 16 * v, accumulate ? acc[i][v] : _mm512_mul_ps(va, acc[i][v]));
  }
}

/// C (rows x cols) = alpha A B, or C += A B (accumulate), over kp word pairs; cols a multiple
/// of 16 (B and C padded to it). A, B addressing as attn_dot_rows4; C row stride ldc.
LOOM_TARGET_AVX512_BF16 inline void attn_dot(int rows, int cols, int kp, const std::uint32_t* a, std::ptrdiff_t a_row,
                                             std::ptrdiff_t a_pair, const std::uint32_t* b, std::ptrdiff_t b_pair,
                                             float* c, std::ptrdiff_t ldc, bool accumulate, float alpha = 1.0f) {
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const int nr = std::min(4, rows - r0);
    for (int c0 = 0; c0 < cols; c0 += 64) {
      const std::uint32_t* ai = a + r0 * a_row;
      const std::uint32_t* bi = b + c0;
      float* ci = c + r0 * ldc + c0;
      switch (std::min(4, (cols - c0) / 16)) {
        case 4: attn_dot_rows4<4>(kp, ai, a_row, a_pair, bi, b_pair, ci, ldc, nr, accumulate, alpha); break;
        case 3: attn_dot_rows4<3>(kp, ai, a_row, a_pair, bi, b_pair, ci, ldc, nr, accumulate, alpha); break;
        case 2: attn_dot_rows4<2>(kp, ai, a_row, a_pair, bi, b_pair, ci, ldc, nr, accumulate, alpha); break;
        default: attn_dot_rows4<1>(kp, ai, a_row, a_pair, bi, b_pair, ci, ldc, nr, accumulate, alpha); break;
      }
    }
  }
}

/// attn_dot for an A operand with contiguous pairs (a_pair 1), on AMX tiles when amx (Note [AMX
/// attention products]: the caller's padding) and on VDPBF16PS otherwise.
LOOM_TARGET_AVX512_BF16 inline void attn_dot_pairs(bool amx, int rows, int cols, int kp, const std::uint32_t* a,
                                                    std::ptrdiff_t a_row, const std::uint32_t* b, std::ptrdiff_t b_pair,
                                                    float* c, std::ptrdiff_t ldc, bool accumulate, float alpha = 1.0f) {
#if LOOM_PEAK_X86
  if (amx) return attn_dot_amx(rows, cols, kp, a, a_row, b, b_pair, c, ldc, accumulate, alpha);
#endif
  attn_dot(rows, cols, kp, a, a_row, 1, b, b_pair, c, ldc, accumulate, alpha);
}

/// Score-tile width for bk keys: a multiple of 16 (VDPBF16PS vectors), of 32 on AMX (whole
/// 16-word contraction steps of P V and dS K).
constexpr int attn_tile_width(int bk, bool amx) noexcept { return amx ? (bk + 31) / 32 * 32 : (bk + 15) / 16 * 16; }

/// Rounds fp32 rows to bf16 in natural order: dst row r (ld_dst bf16) = round(src row r) for
/// r < rows, cols (a multiple of 16) values each.
LOOM_TARGET_AVX512_BF16 inline void attn_round_rows(std::uint16_t* dst, std::ptrdiff_t ld_dst, const float* src,
                                                    std::ptrdiff_t ld_src, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ld_dst + c),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + r * ld_src + c)));
}

/// Rounds fp32 rows to bf16 pairs of rows: dst word (r2, c) (row stride ld_dst words) =
/// round(src[2 r2][c]) | round(src[2 r2 + 1][c]) << 16, for r2 < ceil(rows / 2) (the row past an
/// odd `rows` is zero) and c < cols (a multiple of 16).
LOOM_TARGET_AVX512_BF16 inline void attn_round_row_pairs(std::uint32_t* dst, std::ptrdiff_t ld_dst, const float* src,
                                                         std::ptrdiff_t ld_src, int rows, int cols) {
  alignas(64) static constexpr std::uint16_t interleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                               21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                               11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(interleave);
  for (int r = 0; r < rows; r += 2) {
    const float* lo = src + r * ld_src;
    const float* hi = r + 1 < rows ? lo + ld_src : nullptr;
    for (int c = 0; c < cols; c += 16) {
      const __m512 h = hi ? _mm512_loadu_ps(hi + c) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(h, _mm512_loadu_ps(lo + c));  // [lo 16 | hi 16]
      _mm512_storeu_si512(dst + (r / 2) * ld_dst + c, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

#endif  // LOOM_GEMM_HAS_AVX512_BF16

/// Gathers rows t < T of one head (row t at src + at(t), hd values) into the word arrays of
/// Note [bf16 attention products], rows T .. Tp zero (Tp: T padded to attn_bf16_row_pad):
///   natural (if non-null)  [Tp][hd/2] words, the rows as stored
///   trans   (if non-null)  [hd/2][attn_trans_ld(Tp)] words: trans[p][t] = pair p of row t
///   pairs   (if non-null)  [Tp/2][hd] words: pairs[r][d] = row 2r [d] | row 2r+1 [d] << 16
template <class At>
void attn_gather_head(std::uint32_t* natural, std::uint32_t* trans, std::uint32_t* pairs, const Eigen::bfloat16* src,
                      At at, int T, int Tp, int hd) {
  const int hw = hd / 2;
  auto word = [](const Eigen::bfloat16* x) {
    std::uint32_t w;
    std::memcpy(&w, x, sizeof w);
    return w;
  };
  auto ahead = [&](int t) {  // attn_prefetch_rows
    if (t + attn_prefetch_rows < T) prefetch_bytes(src + at(t + attn_prefetch_rows), sizeof(Eigen::bfloat16) * hd);
  };
  if (natural) {
    for (int t = 0; t < T; ++t) {
      ahead(t);
      std::memcpy(natural + std::size_t(t) * hw, src + at(t), sizeof(std::uint32_t) * hw);
    }
    std::fill(natural + std::size_t(T) * hw, natural + std::size_t(Tp) * hw, 0u);
  }
  if (trans) {
    const std::size_t ldt = std::size_t(attn_trans_ld(Tp));
    for (int t = 0; t < T; ++t) {
      ahead(t);
      const Eigen::bfloat16* x = src + at(t);
      for (int p = 0; p < hw; ++p) trans[std::size_t(p) * ldt + t] = word(x + 2 * p);
    }
    for (int p = 0; p < hw; ++p) std::fill(trans + std::size_t(p) * ldt + T, trans + std::size_t(p) * ldt + Tp, 0u);
  }
  if (pairs) {
    for (int r = 0; r < Tp / 2; ++r) {
      std::uint32_t* d = pairs + std::size_t(r) * hd;
      ahead(2 * r), ahead(2 * r + 1);
      const std::uint16_t* lo = 2 * r < T ? gemm_bits(src + at(2 * r)) : nullptr;
      const std::uint16_t* hi = 2 * r + 1 < T ? gemm_bits(src + at(2 * r + 1)) : nullptr;
      for (int i = 0; i < hd; ++i)
        d[i] = (lo ? std::uint32_t(lo[i]) : 0u) | (hi ? std::uint32_t(hi[i]) << 16 : 0u);
    }
  }
}

#if LOOM_GEMM_HAS_AVX512_BF16

/// Forward of query tile [i0, i0+bq) of head (b, h) on bf16 products (Note [bf16 attention
/// products]); the online softmax as forward_tile in attention_fused.hpp. qn, kt, vi: the
/// head's gathered arrays (Tp rows); o: block_q x hd fp32; s: block_q x block_k fp32; pw:
/// block_q x block_k / 2 words. amx: the products on AMX tiles (an amx_tile_scope is active).
/// Writes out rows (bf16) and lse (fp32) of the tile.
template <class Tr>
void forward_tile_bf16(Eigen::bfloat16* out, float* lse, const std::uint32_t* qn, const std::uint32_t* kt,
                       const std::uint32_t* vi, const attention_shape<float>& p, int b, int h, int i0, int Tp,
                       float* o, float* s, std::uint32_t* pw, bool amx) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int hd = p.hd, hw = hd / 2, bq = std::min(BQ, p.T - i0);
  std::fill_n(o, std::size_t(bq) * hd, 0.0f);
  float m[BQ], l[BQ];
  std::fill_n(m, bq, neg_inf<float>);
  std::fill_n(l, bq, 0.0f);
  const int kend = i0 + bq;
  for (int j0 = 0; j0 < kend; j0 += BK) {
    const int bk = std::min(BK, kend - j0), bk16 = attn_tile_width(bk, amx);
    attn_dot_pairs(amx, bq, bk16, hw, qn + std::size_t(i0) * hw, hw, kt + j0, attn_trans_ld(Tp), s, BK, false, p.scale);
    online_softmax_rows(s, BK, bq, bk, bk16, i0, j0, p, b, h, m, l, o, hd);
    attn_round_rows(reinterpret_cast<std::uint16_t*>(pw), BK, s, BK, bq, bk16);
    attn_dot_pairs(amx, bq, hd, (bk + 1) / 2, pw, BK / 2, vi + std::size_t(j0 / 2) * hd, hd, o, hd, true);
  }
  for (int r = 0; r < bq; ++r) {
    float* orow = o + std::size_t(r) * hd;
    if (l[r] > 0.0f) {
      const float inv = 1.0f / l[r];
      for (int d = 0; d < hd; ++d) orow[d] *= inv;
      lse[p.row_at(b, h, i0 + r)] = m[r] + std::log(l[r]);
    } else {
      std::fill_n(orow, hd, 0.0f);
      lse[p.row_at(b, h, i0 + r)] = std::numeric_limits<float>::infinity();
    }
    narrow(out + p.out_at(b, h, i0 + r), orow, hd);
  }
}

/// Forward over all (batch, head) on bf16 products: per head, gather Q, K, V once, then its
/// query tiles in turn, on AMX tiles when amx. Workspace per thread: 1.5 (Tp + 16) hd +
/// block_q (hd + 1.5 block_k) floats.
template <class Tr>
void fused_forward_bf16(Eigen::bfloat16* out, float* lse, const Eigen::bfloat16* qkv, const attention_shape<float>& p,
                        bool amx) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  static_assert(attn_bf16_row_pad % BQ == 0 && attn_bf16_row_pad % BK == 0 && BK % 32 == 0 && BQ % 32 == 0);
  const int heads = p.B * p.NH, hd = p.hd;
  const int Tp = (p.T + attn_bf16_row_pad - 1) / attn_bf16_row_pad * attn_bf16_row_pad;
  const std::size_t th = std::size_t(attn_trans_ld(Tp)) * hd / 2;  // words of one gathered array (either layout)
#pragma omp parallel
  {
    float* w = thread_workspace(3 * th + std::size_t(BQ) * hd + std::size_t(BQ) * BK * 3 / 2);
    auto* qn = reinterpret_cast<std::uint32_t*>(w);
    std::uint32_t *kt = qn + th, *vi = kt + th;
    float *o = w + 3 * th, *s = o + std::size_t(BQ) * hd;
    auto* pw = reinterpret_cast<std::uint32_t*>(s + std::size_t(BQ) * BK);
    const amx_scope tiles(amx);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < heads; ++bh) {
      const int b = bh / p.NH, h = bh % p.NH;
      attn_gather_head(qn, nullptr, nullptr, qkv, [&](int t) { return p.q_at(b, h, t); }, p.T, Tp, hd);
      attn_gather_head(nullptr, kt, nullptr, qkv, [&](int t) { return p.k_at(b, h, t); }, p.T, Tp, hd);
      attn_gather_head(nullptr, nullptr, vi, qkv, [&](int t) { return p.v_at(b, h, t); }, p.T, Tp, hd);
      for (int i0 = 0; i0 < p.T; i0 += BQ) forward_tile_bf16<Tr>(out, lse, qn, kt, vi, p, b, h, i0, Tp, o, s, pw, amx);
    }
  }
}

/// The gathered arrays and tiles of one thread's backward (Note [bf16 attention products]).
struct attn_bf16_backward_buffers {
  std::uint32_t *qn, *dyn, *kt, *vt, *qi, *ki, *dyi;  // gathered head, [Tp][hd/2] words each
  float *dq, *dk, *dv, *D;                             // fp32 accumulators (Tp x hd) and D (Tp)
  float *s, *dp;                                       // block_q x block_k score tiles
  std::uint32_t *pt, *dst, *dsn;                       // rounded tiles, block_q x block_k / 2 words
};

/// S = scale Q K^T of tile (i0, j0) (bq x bk16) and its probabilities P = exp(S - lse) in s
/// (zero for masked, padded and future keys and past bk), as probability_row.
template <class Tr>
void probabilities_bf16(const attn_bf16_backward_buffers& w, const float* lse, const attention_shape<float>& p, int b,
                        int h, int i0, int j0, int bq, int bk, int Tp, bool amx) {
  constexpr int BK = Tr::block_k;
  const int hw = p.hd / 2, bk16 = attn_tile_width(bk, amx);
  attn_dot_pairs(amx, bq, bk16, hw, w.qn + std::size_t(i0) * hw, hw, w.kt + j0, attn_trans_ld(Tp), w.s, BK, false,
                 p.scale);
  const std::uint8_t* pad = p.padding(b, j0);
  for (int r = 0; r < bq; ++r)
    probability_row(w.s + std::size_t(r) * BK, causal_prefix(i0 + r, j0, bk), bk16, lse[p.row_at(b, h, i0 + r)], pad);
}

/// Backward of the tile pair (query tile i0, key tile j0) of head (b, h) on bf16 products:
/// as backward_pair in attention_fused.hpp, adding to the fp32 w.dq, w.dk, w.dv (on AMX tiles
/// when amx).
template <class Tr>
void backward_pair_bf16(const attn_bf16_backward_buffers& w, const float* lse, const attention_shape<float>& p, int b,
                        int h, int i0, int j0, int Tp, bool amx) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  const int hd = p.hd, hw = hd / 2, bq = std::min(BQ, p.T - i0), bk = std::min(BK, i0 + bq - j0);
  const int bk16 = attn_tile_width(bk, amx);
  probabilities_bf16<Tr>(w, lse, p, b, h, i0, j0, bq, bk, Tp, amx);
  attn_dot_pairs(amx, bq, bk16, hw, w.dyn + std::size_t(i0) * hw, hw, w.vt + j0, attn_trans_ld(Tp), w.dp, BK, false);
  for (int r = 0; r < bq; ++r) {
    float *P = w.s + std::size_t(r) * BK, *dS = w.dp + std::size_t(r) * BK;
    const float D = w.D[i0 + r];
    if (p.drop.active()) {
      const std::uint64_t base = p.drop_row(b, h, i0 + r) + std::uint64_t(j0);
      for (int c = 0; c < bk; ++c) {
        const float f = p.drop.template factor<float>(base + std::uint64_t(c));
        dS[c] = P[c] * (dS[c] * f - D) * p.scale;
        P[c] *= f;
      }
      std::fill(dS + bk, dS + bk16, 0.0f);
    } else {
      for (int c = 0; c < bk16; ++c) dS[c] = P[c] * (dS[c] - D) * p.scale;
    }
  }
  attn_round_rows(reinterpret_cast<std::uint16_t*>(w.dsn), BK, w.dp, BK, bq, bk16);
  const int kq = (bq + 1) / 2, kk = (bk + 1) / 2;
  float *dv = w.dv + std::size_t(j0) * hd, *dk = w.dk + std::size_t(j0) * hd;
  const std::uint32_t *dyi = w.dyi + std::size_t(i0 / 2) * hd, *qi = w.qi + std::size_t(i0 / 2) * hd;
#if LOOM_PEAK_X86
  if (amx) {  // the transposed A operands as rows of pairs (Note [AMX attention products])
    attn_round_pairs_transposed(w.pt, BQ / 2, w.s, BK, bq, bk16);
    attn_round_pairs_transposed(w.dst, BQ / 2, w.dp, BK, bq, bk16);
    attn_dot_amx(bk, hd, kq, w.pt, BQ / 2, dyi, hd, dv, hd, true);
    attn_dot_amx(bk, hd, kq, w.dst, BQ / 2, qi, hd, dk, hd, true);
  } else
#endif
  {
    attn_round_row_pairs(w.pt, BK, w.s, BK, bq, bk16);
    attn_round_row_pairs(w.dst, BK, w.dp, BK, bq, bk16);
    attn_dot(bk, hd, kq, w.pt, 1, BK, dyi, hd, dv, hd, true);
    attn_dot(bk, hd, kq, w.dst, 1, BK, qi, hd, dk, hd, true);
  }
  attn_dot_pairs(amx, bq, hd, kk, w.dsn, BK / 2, w.ki + std::size_t(j0 / 2) * hd, hd, w.dq + std::size_t(i0) * hd, hd,
                 true);
}

/// Backward over all (batch, key/value head) on bf16 products, the query heads of a group in
/// turn (dk, dv summed over the group in fp32, rounded once), as fused_backward_gathered.
/// D = rowsum(dO .* O) from `out`, or (out null) rowsum(P .* F .* dP) over the visible tiles.
/// amx: the products on AMX tiles.
template <class Tr>
void fused_backward_bf16(Eigen::bfloat16* dqkv, const Eigen::bfloat16* dout, const Eigen::bfloat16* qkv,
                         const Eigen::bfloat16* out, const float* lse, const attention_shape<float>& p, bool amx) {
  constexpr int BQ = Tr::block_q, BK = Tr::block_k;
  static_assert(attn_bf16_row_pad % BQ == 0 && attn_bf16_row_pad % BK == 0 && BK % 32 == 0 && BQ % 32 == 0);
  const int kv_items = p.B * p.nkv(), hd = p.hd, hw = hd / 2;
  const int Tp = (p.T + attn_bf16_row_pad - 1) / attn_bf16_row_pad * attn_bf16_row_pad;
  const std::size_t th = std::size_t(attn_trans_ld(Tp)) * hw, tile = std::size_t(BQ) * BK;  // as in forward
#pragma omp parallel
  {
    float* base = thread_workspace(7 * th + 6 * th + Tp + 2 * tile + 3 * tile / 2);
    auto* u = reinterpret_cast<std::uint32_t*>(base);
    attn_bf16_backward_buffers w{};
    w.qn = u, w.dyn = u + th, w.kt = u + 2 * th, w.vt = u + 3 * th, w.qi = u + 4 * th, w.ki = u + 5 * th;
    w.dyi = u + 6 * th;
    w.dq = base + 7 * th, w.dk = w.dq + 2 * th, w.dv = w.dk + 2 * th, w.D = w.dv + 2 * th;
    w.s = w.D + Tp, w.dp = w.s + tile;
    w.pt = reinterpret_cast<std::uint32_t*>(w.dp + tile), w.dst = w.pt + tile / 2, w.dsn = w.dst + tile / 2;
    const amx_scope tiles(amx);
#pragma omp for schedule(dynamic, 1)
    for (int kv = 0; kv < kv_items; ++kv) {
      const int b = kv / p.nkv(), h0 = kv % p.nkv() * p.group();
      attn_gather_head(nullptr, w.kt, w.ki, qkv, [&](int t) { return p.k_at(b, h0, t); }, p.T, Tp, hd);
      attn_gather_head(nullptr, w.vt, nullptr, qkv, [&](int t) { return p.v_at(b, h0, t); }, p.T, Tp, hd);
      std::fill_n(w.dk, 4 * th, 0.0f);  // dk and dv
      for (int h = h0; h < h0 + p.group(); ++h) {
        attn_gather_head(w.qn, nullptr, w.qi, qkv, [&](int t) { return p.q_at(b, h, t); }, p.T, Tp, hd);
        attn_gather_head(w.dyn, nullptr, w.dyi, dout, [&](int t) { return p.out_at(b, h, t); }, p.T, Tp, hd);
        std::fill_n(w.dq, 2 * th, 0.0f);
        for (int i0 = 0; i0 < p.T; i0 += BQ) {
          const int bq = std::min(BQ, p.T - i0);
          if (out) {
            delta_from_output(w.D, dout, out, p, b, h, i0, bq);
            continue;
          }
          std::fill_n(w.D + i0, bq, 0.0f);
          for (int j0 = 0; j0 < i0 + bq; j0 += BK) {
            const int bk = std::min(BK, i0 + bq - j0), bk16 = attn_tile_width(bk, amx);
            probabilities_bf16<Tr>(w, lse, p, b, h, i0, j0, bq, bk, Tp, amx);
            if (p.drop.active())
              for (int r = 0; r < bq; ++r) apply_dropout(w.s + std::size_t(r) * BK, bk, p, b, h, i0 + r, j0);
            attn_dot_pairs(amx, bq, bk16, hw, w.dyn + std::size_t(i0) * hw, hw, w.vt + j0, attn_trans_ld(Tp), w.dp, BK,
                           false);
            for (int r = 0; r < bq; ++r) {
              float d = 0;
              for (int c = 0; c < bk16; ++c) d += w.s[std::size_t(r) * BK + c] * w.dp[std::size_t(r) * BK + c];
              w.D[i0 + r] += d;
            }
          }
        }
        for (int j0 = 0; j0 < p.T; j0 += BK)
          for (int i0 = j0 / BQ * BQ; i0 < p.T; i0 += BQ) backward_pair_bf16<Tr>(w, lse, p, b, h, i0, j0, Tp, amx);
        scatter_head_rows(dqkv, [&](int t) { return p.q_at(b, h, t); }, w.dq, p.T, hd);
      }
      scatter_head_rows(dqkv, [&](int t) { return p.k_at(b, h0, t); }, w.dk, p.T, hd);
      scatter_head_rows(dqkv, [&](int t) { return p.v_at(b, h0, t); }, w.dv, p.T, hd);
    }
  }
}

#else  // no compiler support: never called (attention_bf16_usable() is false)

template <class Tr>
void fused_forward_bf16(Eigen::bfloat16*, float*, const Eigen::bfloat16*, const attention_shape<float>&, bool) {
  throw error("loom::kernels::cpu: this compiler cannot build the AVX512-BF16 attention kernels");
}
template <class Tr>
void fused_backward_bf16(Eigen::bfloat16*, const Eigen::bfloat16*, const Eigen::bfloat16*, const Eigen::bfloat16*,
                         const float*, const attention_shape<float>&, bool) {
  throw error("loom::kernels::cpu: this compiler cannot build the AVX512-BF16 attention kernels");
}

#endif

}  // namespace loom::kernels::cpu::detail
