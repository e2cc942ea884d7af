#pragma once
/// \file Private: the shape of one fused attention call (attention_shape: sizes, layouts, mask
/// and dropout coordinates) and the score-row helpers shared by the fp32 tile kernels
/// (kernels/cpu/attention_fused.hpp) and the bf16 ones (detail/attention_bf16.hpp).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <loom/core/dropout.hpp>
#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/cpu/detail/softmax_avx512.hpp>

namespace loom::kernels::cpu::detail {

/// How many rows ahead the per-head gathers and scatters prefetch. One head's rows lie a
/// whole qkv row apart (3 C values: 4.5 KiB for C = 384 in fp32), a stride the hardware
/// prefetchers do not follow across 4 KiB pages, so without a hint every row of a gather
/// waits for memory (the hints measured 5-7 % of the fused forward + backward at T = 256,
/// HD 64, 2 threads, fp32 and bf16 storage).
inline constexpr int attn_prefetch_rows = 8;

/// Row stride (elements: fp32 values or bf16 word pairs, 4 bytes each) of a head's transposed
/// gathered arrays ([hd][.] or [hd/2][.]) for Tp padded rows: Tp plus one cache line. With a
/// stride of exactly Tp (a multiple of 128) a gather's column stores for one row fall into a
/// few L1 sets and evict each other (measured: the fp32 gathers then took a third of the fused
/// attention at T = 256, one thread).
constexpr int attn_trans_ld(int Tp) noexcept { return Tp + 16; }

/// Prefetch hint for the `bytes` bytes at p (into all cache levels; `write` asks for the
/// lines in a writable state). A hint only: it never faults and changes no result.
inline void prefetch_bytes(const void* p, std::size_t bytes, bool write = false) noexcept {
  const char* c = static_cast<const char*>(p);
  for (std::size_t i = 0; i < bytes; i += 64) {
    if (write) __builtin_prefetch(c + i, 1, 3);
    else __builtin_prefetch(c + i, 0, 3);
  }
}

/// `rows` rows of one head inside qkv/out/dqkv: HD (compile-time or Eigen::Dynamic) values
/// per row, rows `stride` elements apart.
template <class A, int HD>
using head_rows = Eigen::Map<Eigen::Matrix<A, Eigen::Dynamic, HD, Eigen::RowMajor>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class A, int HD>
using chead_rows =
    Eigen::Map<const Eigen::Matrix<A, Eigen::Dynamic, HD, Eigen::RowMajor>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class A>
using row_array = Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>>;

/// Shape of one attention call and the index arithmetic of its layouts.
/// qkv rows hold [q: NH heads | k: nkv() heads | v: nkv() heads] of hd values; query head h
/// reads key/value head h / group() (grouped-query attention; nkv() == NH is multi-head).
template <class A>
struct attention_shape {
  int B, T, C, NH, hd;
  A scale;                          // 1/sqrt(hd)
  const std::uint8_t* key_padding;  // (B,T), non-zero = padded key; or null
  dropout_mask drop{};              // attention-probability dropout; inactive = none
  int batch0 = 0, head0 = 0;        // mask coordinates of (b, h) = (0, 0): batch and global head
  int heads = 0;                    // global head count of the mask index
  int kv_heads = 0;                 // key/value heads; 0 = NH

  int nkv() const noexcept { return kv_heads > 0 ? kv_heads : NH; }
  /// Query heads per key/value head.
  int group() const noexcept { return NH / nkv(); }
  /// Row stride of qkv and dqkv: (NH + 2 nkv) hd (3C without grouping).
  std::ptrdiff_t ld() const noexcept { return std::ptrdiff_t(NH + 2 * nkv()) * hd; }
  /// Offsets of q[b, t, head h] and of the key and value head h reads, in qkv and dqkv.
  std::size_t q_at(int b, int h, int t) const noexcept { return row(b, t) + std::size_t(h) * hd; }
  std::size_t k_at(int b, int h, int t) const noexcept { return row(b, t) + std::size_t(NH + h / group()) * hd; }
  std::size_t v_at(int b, int h, int t) const noexcept {
    return row(b, t) + std::size_t(NH + nkv() + h / group()) * hd;
  }
  std::size_t row(int b, int t) const noexcept { return (std::size_t(b) * T + t) * std::size_t(ld()); }
  /// Offset of out[b, t, head h] in out / dout.
  std::size_t out_at(int b, int h, int t) const noexcept { return (std::size_t(b) * T + t) * C + std::size_t(h) * hd; }
  /// Index of row (b, h, t) in the (B,NH,T) statistics (log-sum-exp, D).
  std::size_t row_at(int b, int h, int t) const noexcept { return (std::size_t(b) * NH + h) * T + t; }
  /// Padding flags of batch b shifted to key j0, or null without a mask.
  const std::uint8_t* padding(int b, int j0) const noexcept {
    return key_padding ? key_padding + std::size_t(b) * T + j0 : nullptr;
  }
  /// Mask index of probability (b, h, i, key 0); key j adds j (attention_dropout_keep).
  std::uint64_t drop_row(int b, int h, int i) const noexcept {
    return ((std::uint64_t(batch0 + b) * std::uint64_t(heads) + std::uint64_t(head0 + h)) * std::uint64_t(T) +
            std::uint64_t(i)) * std::uint64_t(T);
  }
};

/// Applies dropout to the first n probabilities of score row (b, h, i) starting at key j0:
/// row[c] *= factor(key j0 + c). Entries past n are zero already.
template <class A>
void apply_dropout(A* row, int n, const attention_shape<A>& p, int b, int h, int i, int j0) {
  const std::uint64_t base = p.drop_row(b, h, i) + std::uint64_t(j0);
  for (int c = 0; c < n; ++c) row[c] *= p.drop.template factor<A>(base + std::uint64_t(c));
}

/// Causally visible keys of query t inside the key tile [j0, j0+bk): the prefix [0, n).
inline int causal_prefix(int t, int j0, int bk) noexcept { return std::clamp(t - j0 + 1, 0, bk); }

template <class A>
inline constexpr A neg_inf = -std::numeric_limits<A>::infinity();

/// max(row[0 .. n)), n > 0: AVX-512 where the CPU has it (A = float), else Eigen's maxCoeff.
template <class A>
A row_max(const A* row, int n) {
#if LOOM_SOFTMAX_HAS_AVX512
  if constexpr (std::is_same_v<A, float>)
    if (softmax_avx512_usable()) return row_max_avx512(row, n);
#endif
  return Eigen::Map<const Eigen::Array<A, Eigen::Dynamic, 1>>(row, n).maxCoeff();
}

/// row[c] = exp(row[c] - shift) for c < n, then 0 where pad[c] (pad may be null); returns the
/// sum of the n results. AVX-512 where the CPU has it (A = float: detail/softmax_avx512.hpp,
/// one pass, fixed summation order), else Eigen's vectorised exp and sum.
template <class A>
A exp_shift_sum(A* row, int n, A shift, const std::uint8_t* pad) {
#if LOOM_SOFTMAX_HAS_AVX512
  if constexpr (std::is_same_v<A, float>)
    if (softmax_avx512_usable()) {
      if (pad)  // a padded key's score is -inf here or about to be zeroed: 0 before the sum
        for (int c = 0; c < n; ++c)
          if (pad[c]) row[c] = neg_inf<A>;
      return exp_shift_sum_avx512(row, n, shift);  // exp(-inf) is exactly 0
    }
#endif
  row_array<A> e(row, n);
  e = (e - shift).exp();
  if (pad)
    for (int c = 0; c < n; ++c)
      if (pad[c]) row[c] = A(0);
  return e.sum();
}

/// One key tile's online-softmax step (FlashAttention-2, arXiv:2307.08691, Algorithm 1, lines
/// 8-10) over the bq rows of the score tile s (row stride lds), whose first bk columns hold the
/// scaled scores of keys [j0, j0+bk) for queries i0 + r: masks padded keys and keys after each
/// query (causal), replaces each visible score x by exp(x - m_new), zeros the rest of the row up
/// to `width` columns (>= bk), updates the running maxima m and sums l (of the undropped terms),
/// then applies dropout to the row, and rescales row r of the output accumulator o (row stride
/// ldo, p.hd values) by exp(m_old - m_new). A row with no visible key yet is left all zero.
template <class A>
void online_softmax_rows(A* s, std::ptrdiff_t lds, int bq, int bk, int width, int i0, int j0,
                         const attention_shape<A>& p, int b, int h, A* m, A* l, A* o, std::ptrdiff_t ldo) {
  const std::uint8_t* pad = p.padding(b, j0);
  for (int r = 0; r < bq; ++r) {
    A* row = s + r * lds;
    const int n = causal_prefix(i0 + r, j0, bk);
    if (pad)
      for (int c = 0; c < n; ++c)
        if (pad[c]) row[c] = neg_inf<A>;
    const A m_new = n > 0 ? std::max(m[r], row_max(row, n)) : m[r];
    if (m_new == neg_inf<A>) {  // no visible key yet: nothing to add
      std::fill(row, row + width, A(0));
      continue;
    }
    const A sum = exp_shift_sum(row, n, m_new, pad);  // pads 0; the normaliser sums the undropped terms
    std::fill(row + n, row + width, A(0));
    // exactly 0 while m[r] = -inf, 1 while the maximum stays: no libm call for those
    const A alpha = m[r] == neg_inf<A> ? A(0) : m[r] == m_new ? A(1) : std::exp(m[r] - m_new);
    l[r] = alpha * l[r] + sum;
    if (p.drop.active()) apply_dropout(row, n, p, b, h, i0 + r, j0);
    if (alpha != A(1)) {
      A* orow = o + r * ldo;
      for (int d = 0; d < p.hd; ++d) orow[d] *= alpha;
    }
    m[r] = m_new;
  }
}

/// Rounds rows t < Tn of a head's fp32 array src ([Tn][hd]) into storage: row t to dst + at(t),
/// prefetching the destination rows ahead for writing (attn_prefetch_rows).
template <class T, class At>
void scatter_head_rows(T* dst, At at, const float* src, int Tn, int hd) {
  for (int t = 0; t < Tn; ++t) {
    if (t + attn_prefetch_rows < Tn) prefetch_bytes(dst + at(t + attn_prefetch_rows), sizeof(T) * hd, true);
    narrow(dst + at(t), src + std::size_t(t) * hd, hd);
  }
}

/// D[i0 + r] = rowsum(dO .* O) over the hd values of rows i0 + r, r < bq, of head (b, h), from
/// the stored dout and out (storage T widened to fp32; FlashAttention-2, Algorithm 2, line 4).
template <class T>
void delta_from_output(float* D, const T* dout, const T* out, const attention_shape<float>& p, int b, int h, int i0,
                       int bq) {
  float dyr[convert_chunk], orow[convert_chunk];
  for (int r = 0; r < bq; ++r) {
    if (r + attn_prefetch_rows < bq) {
      prefetch_bytes(dout + p.out_at(b, h, i0 + r + attn_prefetch_rows), sizeof(T) * p.hd);
      prefetch_bytes(out + p.out_at(b, h, i0 + r + attn_prefetch_rows), sizeof(T) * p.hd);
    }
    const float* dy = dyr;
    const float* o = orow;
    if constexpr (std::is_same_v<T, float>) {  // read in place
      dy = dout + p.out_at(b, h, i0 + r);
      o = out + p.out_at(b, h, i0 + r);
    } else {
      widen(dyr, dout + p.out_at(b, h, i0 + r), p.hd);
      widen(orow, out + p.out_at(b, h, i0 + r), p.hd);
    }
#if LOOM_SOFTMAX_HAS_AVX512
    if (softmax_avx512_usable()) {
      D[i0 + r] = dot_avx512(dy, o, p.hd);
      continue;
    }
#endif
    float d = 0;
    for (int i = 0; i < p.hd; ++i) d += dy[i] * o[i];
    D[i0 + r] = d;
  }
}

/// Backward's probabilities of one score row: row[c] = exp(row[c] - lse) for the n visible
/// keys, 0 for padded and future keys and for a row with no visible key (lse = +inf). Zeros
/// are written, never derived from exp(-inf): Eigen's SIMD exp clamps its argument.
template <class A>
void probability_row(A* row, int n, int bk, A lse, const std::uint8_t* pad) {
  if (!(lse < std::numeric_limits<A>::infinity())) n = 0;
  if (n > 0) exp_shift_sum(row, n, lse, pad);
  std::fill(row + n, row + bk, A(0));
}

}  // namespace loom::kernels::cpu::detail
