#pragma once
/// \file Private: the AVX512-BF16 GEMM behind loom::kernels::cpu::gemm for Eigen::bfloat16.
///
/// VDPBF16PS (_mm512_dpbf16_ps) multiplies 32 bf16 pairs and adds each pair's two products to
/// one of 16 fp32 lanes: dst.fp32[i] += a.bf16[2i+1]*b.bf16[2i+1] + a.bf16[2i]*b.bf16[2i]
/// (Intel Intrinsics Guide / SDM, VDPBF16PS: round to nearest even, denormal inputs treated as
/// zero, denormal results flushed to zero, MXCSR ignored). K is therefore consumed in pairs,
/// and both operands are packed so that a pair (k, k+1) of one row/column is one 32-bit word:
///
///   packed A micro-panel  [kp][12]  word = A(m,2kp) | A(m,2kp+1) << 16   (12 rows m)
///   packed B micro-panel  [kp][32]  word = B(2kp,n) | B(2kp+1,n) << 16   (32 columns n)
///
/// The 12x32 micro-kernel keeps C in 24 zmm accumulators; per pair it loads two B vectors,
/// broadcasts 12 A words and issues 24 VDPBF16PS (1,536 flops). Odd K and edge tiles are padded
/// with zeros in the packs; partial tiles are stored with masks.
///
/// Blocking (Goto & van de Geijn, ACM TOMS 2008): op(B) is packed once per call into NR-wide
/// panels (all threads, shared); work items are (MC rows) x (a run of B panels); each thread
/// packs its item's A block per K block of KC pairs and runs the micro-kernel with one B
/// micro-panel (KC x 32, 32 KiB) in L1 while the A block (MC x KC, 96 KiB) streams from L2.
/// When K spans several K blocks, partial sums stay in an fp32 per-thread staging tile, so the
/// rounding to bf16 (for a bf16 C) happens once, on the final store.
///
/// Compiled with function-level target attributes: the translation unit needs no -mavx512*, and
/// gemm_avx512_bf16_supported() decides at run time (cpuid, via __builtin_cpu_supports).
#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include <loom/bench/peak.hpp>
#include <loom/core/error.hpp>
#include <loom/kernels/cpu/detail/workspace.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define LOOM_GEMM_HAS_AVX512_BF16 1
#include <immintrin.h>
#define LOOM_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))
#else
#define LOOM_GEMM_HAS_AVX512_BF16 0
#endif

namespace loom::kernels::cpu::detail {

/// True when the VDPBF16PS kernel is compiled in and this CPU (and OS) executes AVX512-BF16.
inline bool gemm_avx512_bf16_supported() noexcept {
#if LOOM_GEMM_HAS_AVX512_BF16
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return supported;
#else
  return false;
#endif
}

/// True when this CPU's VDPBF16PS unit outruns its fp32 FMA units by more than 20 % per core
/// (bench::measure_peak on one thread, CPU time, about 10 ms, measured once per process: a
/// property of the machine, immutable once read). False without AVX512-BF16.
inline bool bf16_unit_faster_than_fp32() noexcept {
  static const bool faster = [] {
    if (!gemm_avx512_bf16_supported() || !bench::peak_unit_available(bench::peak_unit::bf16_dot)) return false;
    try {
      const double f32 = bench::measure_peak(bench::peak_unit::fp32_fma, 1, 0.004, 1).gflops;
      const double b16 = bench::measure_peak(bench::peak_unit::bf16_dot, 1, 0.004, 1).gflops;
      return b16 > 1.2 * f32;
    } catch (...) {
      return true;  // could not measure: keep the bf16 kernel the CPU has
    }
  }();
  return faster;
}

/// Blocking of the bf16 kernel (micro-tile MR x NR; K block in pairs; M block in rows).
struct gemm_bf16_blocking {
  static constexpr int mr = 12;    // rows of C per micro-tile (broadcast A words)
  static constexpr int nr = 32;    // columns of C per micro-tile (two zmm of 16 fp32)
  static constexpr int kc = 256;   // K pairs per K block: B micro-panel kc*nr*4 B = 32 KiB (L1)
  static constexpr int mc = 96;    // rows per M block: A block mc*kc*4 B = 96 KiB (L2)
};

/// Raw 16-bit pattern of a bf16 array element.
inline const std::uint16_t* gemm_bits(const Eigen::bfloat16* p) noexcept {
  return reinterpret_cast<const std::uint16_t*>(p);
}

#if LOOM_GEMM_HAS_AVX512_BF16

/// Bits of the first n of 16 (or 32) lanes.
inline __mmask16 gemm_mask16(int n) noexcept { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }
inline __mmask32 gemm_mask32(int n) noexcept { return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1); }

/// Packs `width`-wide words from pairs of rows: dst[p - p0][i] = row(2p)[i] | row(2p+1)[i] << 16
/// for pairs p in [p0, p1), i < count; columns count..width and the missing row of an odd K are
/// zeros. src: row-major, row stride ld, whose pair index runs down its rows (B (K,N) not
/// transposed; A stored (K,M) under trans_a).
LOOM_TARGET_AVX512_BF16 inline void gemm_pack_interleave(std::uint32_t* dst, int width, const std::uint16_t* src,
                                                         std::size_t ld, int K, int p0, int p1, int count) {
  constexpr __mmask16 all = 0xffff;
  for (int p = p0; p < p1; ++p, dst += width) {
    const std::uint16_t* r0 = src + std::size_t(2 * p) * ld;
    const bool odd_end = 2 * p + 1 >= K;
    for (int i = 0; i < width; i += 16) {
      const __mmask16 ml = gemm_mask16(count - i);
      const __m512i lo = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(ml, r0 + i));
      __m512i w = lo;
      if (!odd_end) {
        const __m512i hi = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(ml, r0 + ld + i));
        w = _mm512_or_si512(lo, _mm512_maskz_slli_epi32(all, hi, 16));
      }
      _mm512_mask_storeu_epi32(dst + i, gemm_mask16(width - i), w);
    }
  }
}

/// gemm_pack_interleave for a whole A block of 12-wide tiles (tile t at dst + t * tile_stride),
/// walking each pair of rows once across all tiles (contiguous reads of the block's columns).
LOOM_TARGET_AVX512_BF16 inline void gemm_pack_interleave_tiles(std::uint32_t* dst, std::size_t tile_stride,
                                                               const std::uint16_t* src, std::size_t ld, int K, int p0,
                                                               int p1, int count) {
  constexpr __mmask16 all = 0xffff, twelve = 0x0fff;
  for (int p = p0; p < p1; ++p) {
    const std::uint16_t* r0 = src + std::size_t(2 * p) * ld;
    const bool odd_end = 2 * p + 1 >= K;
    std::uint32_t* d = dst + std::size_t(p - p0) * 12;
    for (int i = 0; i < count; i += 12, d += tile_stride) {
      const __mmask16 ml = gemm_mask16(std::min(12, count - i));
      __m512i w = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(ml, r0 + i));
      if (!odd_end) {
        const __m512i hi = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(ml, r0 + ld + i));
        w = _mm512_or_si512(w, _mm512_maskz_slli_epi32(all, hi, 16));
      }
      _mm512_mask_storeu_epi32(d, twelve, w);
    }
  }
}

/// In-register transpose of a 16x16 block of 32-bit words (r[i] lane j -> r[j] lane i).
/// (Full-mask maskz_ forms: same instructions, no GCC 12 false -Wuninitialized.)
LOOM_TARGET_AVX512_BF16 inline void gemm_transpose_16x16(__m512i r[16]) {
  constexpr __mmask16 m16 = 0xffff;
  constexpr __mmask8 m8 = 0xff;
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_maskz_unpacklo_epi32(m16, r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_maskz_unpackhi_epi32(m16, r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // u[4k+c], lane L: column 4L+c, rows 4k..4k+3
    u[4 * k + 0] = _mm512_maskz_unpacklo_epi64(m8, t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_maskz_unpackhi_epi64(m8, t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_maskz_unpacklo_epi64(m8, t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_maskz_unpackhi_epi64(m8, t[4 * k + 1], t[4 * k + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // 4x4 transpose of 128-bit lanes
    const __m512i v0 = _mm512_maskz_shuffle_i32x4(m16, u[c], u[4 + c], 0x44), v1 = _mm512_maskz_shuffle_i32x4(m16, u[c], u[4 + c], 0xee);
    const __m512i v2 = _mm512_maskz_shuffle_i32x4(m16, u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_maskz_shuffle_i32x4(m16, u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_maskz_shuffle_i32x4(m16, v0, v2, 0x88);
    r[4 + c] = _mm512_maskz_shuffle_i32x4(m16, v0, v2, 0xdd);
    r[8 + c] = _mm512_maskz_shuffle_i32x4(m16, v1, v3, 0x88);
    r[12 + c] = _mm512_maskz_shuffle_i32x4(m16, v1, v3, 0xdd);
  }
}

/// Packs `width`-wide words from rows whose pair index runs along the row: dst[p - p0][i] =
/// row(i)[2p] | row(i)[2p+1] << 16 for pairs p in [p0, p1), rows i < count (the missing element
/// of an odd K is zero, never read); rows count..width are zeros. A 32-bit transpose done 16x16
/// in registers (A (M,K) not transposed; B stored (N,K) under trans_b).
LOOM_TARGET_AVX512_BF16 inline void gemm_pack_transpose(std::uint32_t* dst, int width, const std::uint16_t* src,
                                                        std::size_t ld, int K, int p0, int p1, int count) {
  for (int i0 = 0; i0 < width; i0 += 16) {
    const __mmask16 ms = gemm_mask16(width - i0);
    for (int p = p0; p < p1; p += 16) {
      const __mmask32 ml = gemm_mask32(std::min(K - 2 * p, 2 * (p1 - p)));
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i0 + i < count ? _mm512_maskz_loadu_epi16(ml, src + std::size_t(i0 + i) * ld + 2 * p)
                              : _mm512_setzero_si512();
      gemm_transpose_16x16(r);
      const int rows = std::min(16, p1 - p);
      for (int j = 0; j < rows; ++j) _mm512_mask_storeu_epi32(dst + std::size_t(p - p0 + j) * width + i0, ms, r[j]);
    }
  }
}

/// 16 fp32 -> 16 bf16 bit patterns, round to nearest even; NaN -> quiet NaN with its sign.
/// Bit-identical to Eigen::bfloat16(float) (float_to_bfloat16_rtne), subnormals included.
/// (The maskz_ forms with a full mask avoid GCC 12's false -Wmaybe-uninitialized on the
/// _mm512_undefined_* inside the unmasked intrinsics.)
LOOM_TARGET_AVX512_BF16 inline __m256i gemm_bf16_round(__m512 x) {
  constexpr __mmask16 all = 0xffff;
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_maskz_srli_epi32(all, u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_maskz_srli_epi32(all, _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i qnan = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
  r = _mm512_mask_mov_epi32(r, nan, qnan);
  return _mm512_maskz_cvtepi32_epi16(all, r);
}

/// 12x32 micro-kernel over kp pairs: acc = (in ? in : 0) + A_panel * B_panel, then either
///   stage != null: acc stored raw (full tile) to stage (row stride ld_stage), or
///   stage == null: C(mr x nr) = alpha*acc + beta*C (C not read when beta == 0), stored as OutT.
/// a: [kp][12] words, b: [kp][32] words (gemm_pack_*); in: fp32 tile (row stride ld_in) or null.
template <class OutT>
LOOM_TARGET_AVX512_BF16 void gemm_bf16_micro_12x32(int kp, const std::uint32_t* a, const std::uint32_t* b,
                                                   const float* in, int ld_in, float* stage, int ld_stage, OutT* C,
                                                   int ldc, float alpha, float beta, int mr, int nr) {
  __m512 c[12][2];
  if (in) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      c[i][0] = _mm512_loadu_ps(in + std::size_t(i) * ld_in);
      c[i][1] = _mm512_loadu_ps(in + std::size_t(i) * ld_in + 16);
    }
  } else {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(int(a[i]));
      c[i][0] = _mm512_dpbf16_ps(c[i][0], ai, b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], ai, b1);
    }
    a += 12;
    b += 32;
  }
  if (stage) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      _mm512_storeu_ps(stage + std::size_t(i) * ld_stage, c[i][0]);
      _mm512_storeu_ps(stage + std::size_t(i) * ld_stage + 16, c[i][1]);
    }
    return;
  }
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xffff) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xffff) : nr <= 16 ? __mmask16(0) : __mmask16((1u << (nr - 16)) - 1);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) {
    if (i >= mr) break;
    OutT* ci = C + std::size_t(i) * std::size_t(ldc);
    for (int h = 0; h < 2; ++h) {
      const __mmask16 m = h ? m1 : m0;
      if (!m) continue;
      __m512 r = _mm512_mul_ps(va, c[i][h]);
      if constexpr (std::is_same_v<OutT, float>) {
        if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, ci + 16 * h), r);
        _mm512_mask_storeu_ps(ci + 16 * h, m, r);
      } else {
        if (beta != 0.0f) {
          const __m256i old = _mm256_maskz_loadu_epi16(m, ci + 16 * h);
          const __m512i wide = _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), old);
          const __m512 oldf = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), wide, 16));
          r = _mm512_fmadd_ps(vb, oldf, r);
        }
        _mm256_mask_storeu_epi16(ci + 16 * h, m, gemm_bf16_round(r));
      }
    }
  }
}

/// C (M,N) = alpha op(A) op(B) + beta C for bf16 operands on AVX512-BF16 (contract: cpu::gemm;
/// sizes already checked, M, N, K >= 1). OutT is float or Eigen::bfloat16.
/// The driver itself is plain code (packing, OpenMP); only the micro-kernel carries the target.
template <class OutT>
void gemm_avx512_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                              const Eigen::bfloat16* A, int lda, const Eigen::bfloat16* B, int ldb,
                                              float beta, OutT* C, int ldc) {
  using blk = gemm_bf16_blocking;
  constexpr int MR = blk::mr, NR = blk::nr, KC = blk::kc, MC = blk::mc;
  const int KP = (K + 1) / 2;              // K pairs
  const int NP = (N + NR - 1) / NR;        // B panels
  const int nkb = (KP + KC - 1) / KC;      // K blocks
  const int nmb = (M + MC - 1) / MC;       // M blocks
  int threads = 1;
#if defined(_OPENMP)
  const double flops = 2.0 * M * N * K;
  threads = flops < 4e6 ? 1 : std::max(1, omp_get_max_threads());
#endif
  // B panels per work item: all of them when the M blocks alone keep every thread busy.
  const int n_split = nmb >= 2 * threads ? 1 : std::min(NP, (2 * threads + nmb - 1) / nmb);
  const int NCP = (NP + n_split - 1) / n_split;
  const int nnb = (NP + NCP - 1) / NCP;
  const int items = nmb * nnb;

  // Packing buffers: 32-bit words in the threads' workspaces (allocated once, then reused).
  static_assert(sizeof(std::uint32_t) == sizeof(float));
  auto words = [](std::size_t n, workspace_slot slot) {
    return reinterpret_cast<std::uint32_t*>(thread_workspace(n, slot));
  };
  const std::size_t b_panel = std::size_t(KP) * NR;  // words per packed B panel
  std::uint32_t* bp = words(std::size_t(NP) * b_panel, workspace_slot::gemm_b);
  const std::uint16_t* a_bits = gemm_bits(A);
  const std::uint16_t* b_bits = gemm_bits(B);

  // The work of every thread; its `omp for` loops run whole on the calling thread when there is
  // no enclosing parallel region (one thread: no region is opened, since libgomp allocates a
  // new team for every one-thread region).
  auto work = [&] {
    // 1. pack op(B) (K x N) into NP panels [KP][NR], shared by all threads
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
    for (int q = 0; q < NP; ++q) {
      const int n0 = q * NR, cnt = std::min(NR, N - n0);
      if (trans_b)  // stored (N,K): the pair runs along each stored row
        gemm_pack_transpose(bp + q * b_panel, NR, b_bits + std::size_t(n0) * ldb, std::size_t(ldb), K, 0, KP, cnt);
      else  // stored (K,N): the pair is two stored rows
        gemm_pack_interleave(bp + q * b_panel, NR, b_bits + n0, std::size_t(ldb), K, 0, KP, cnt);
    }
    // (implicit barrier)

    // 2. per-thread A block and fp32 staging for multi-K-block sums
    const int mc_pad = MC;  // MC is a multiple of MR
    std::uint32_t* ap = words(std::size_t(mc_pad) * std::min(KC, KP), workspace_slot::gemm_a);
    const int ld_stage = NCP * NR;
    float* stage = nkb > 1 ? thread_workspace(std::size_t(mc_pad) * ld_stage, workspace_slot::gemm_c) : nullptr;
    int packed_ib = -1;  // M block whose A (single K block) is already in ap

#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
    for (int it = 0; it < items; ++it) {
      const int ib = it / nnb, jb = it % nnb;
      const int m0 = ib * MC, mlen = std::min(MC, M - m0), tiles = (mlen + MR - 1) / MR;
      const int q0 = jb * NCP, q1 = std::min(NP, q0 + NCP);
      for (int kb = 0; kb < nkb; ++kb) {
        const int p0 = kb * KC, p1 = std::min(KP, p0 + KC), kpl = p1 - p0;
        if (!(nkb == 1 && packed_ib == ib)) {
          static_assert(MR == 12, "gemm_pack_interleave_tiles packs 12-wide tiles");
          if (trans_a)  // stored (K,M): the pair is two stored rows
            gemm_pack_interleave_tiles(ap, std::size_t(MR) * kpl, a_bits + m0, std::size_t(lda), K, p0, p1, mlen);
          else  // stored (M,K): the pair runs along each stored row
            for (int t = 0; t < tiles; ++t) {
              const int mt = m0 + t * MR, cnt = std::min(MR, M - mt);
              gemm_pack_transpose(ap + std::size_t(t) * MR * kpl, MR, a_bits + std::size_t(mt) * lda, std::size_t(lda),
                                  K, p0, p1, cnt);
            }
          packed_ib = nkb == 1 ? ib : -1;
        }
        const bool first = kb == 0, last = kb == nkb - 1;
        for (int q = q0; q < q1; ++q) {
          const std::uint32_t* bq = bp + q * b_panel + std::size_t(p0) * NR;
          const int n0 = q * NR, nr = std::min(NR, N - n0);
          for (int t = 0; t < tiles; ++t) {
            const int mt = m0 + t * MR, mr = std::min(MR, M - mt);
            float* st = stage ? stage + std::size_t(t) * MR * ld_stage + std::size_t(q - q0) * NR : nullptr;
            gemm_bf16_micro_12x32<OutT>(kpl, ap + std::size_t(t) * MR * kpl, bq, first ? nullptr : st, ld_stage,
                                        last ? nullptr : st, ld_stage, C + std::size_t(mt) * ldc + n0, ldc, alpha,
                                        beta, mr, nr);
          }
        }
      }
    }
  };
#if defined(_OPENMP)
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    work();
    return;
  }
#endif
  work();
}

#else  // no compiler support: never called (gemm_avx512_bf16_supported() is false)

template <class OutT>
void gemm_avx512_bf16(bool, bool, int, int, int, float, const Eigen::bfloat16*, int, const Eigen::bfloat16*, int,
                      float, OutT*, int) {
  throw error("loom::kernels::cpu::gemm: this compiler cannot build the AVX512-BF16 kernel");
}

#endif

}  // namespace loom::kernels::cpu::detail
