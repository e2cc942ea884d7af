#pragma once
/// \file Private: the fused attention's bf16 tile products on AMX tiles (TDPBF16PS), for CPUs
/// with AMX-BF16 (Intel Sapphire Rapids and later). The same six products, operands, roundings
/// and error bound as Note [bf16 attention products] in detail/attention_bf16.hpp; only the unit
/// differs: a 16 x 16 fp32 tile accumulates 16 x 32 bf16 times 32 x 16 bf16 per instruction
/// (16,384 flops), about 15x the FMA units' rate on one core.
///
/// Note [AMX attention products]: TDPBF16PS reads its A tile as 16 rows of 16 words (each word
/// two bf16 along the contraction) and its B tile as 16 rows of 16 words (row p = the pairs p of
/// 16 columns): exactly the word layouts of attention_bf16.hpp whose A operand has its pairs
/// contiguous (Q, dO, P and dS as natural rows). The two products whose A operand is a
/// transposed tile (dV += P^T dO, dK += dS^T Q) take it from attn_round_pairs_transposed
/// instead of row pairs. Every product runs in blocks of 32 x 32 outputs (four C tiles, two A
/// and two B tiles: all eight tile registers) over whole 16-word steps of the contraction, so
/// the caller pads: A readable to 32-row multiples with its words past the contraction zero up
/// to the next multiple of 16, B readable there (and finite: 0 x Inf is NaN), and score tiles
/// kept zero up to a multiple of 32 keys. Results are stored to C whole where a block lies
/// inside it and accumulates; otherwise through a tile-sized buffer, valid rows and columns only.
/// Threads: the tile configuration is per thread (amx_tile_scope in each parallel region);
/// Linux grants the tile state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM,
/// asked once in attention_amx_usable). Source: Intel 64 and IA-32 Architectures Software
/// Developer's Manual, vol. 2 (LDTILECFG, TILELOADD, TDPBF16PS, TILESTORED); Intel AMX
/// programming reference (Linux: Documentation/arch/x86/xstate.rst).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <loom/bench/peak.hpp>
#include <loom/kernels/cpu/detail/gemm_avx512_bf16.hpp>

namespace loom::kernels::cpu::detail {

/// True when the AMX tile products can run for head size hd: hd a multiple of 32 (whole
/// 16-word contraction steps over the head dimension), the CPU has AVX512-BF16 (the roundings)
/// and AMX-BF16, and Linux granted this process the tile state. Read once per process (a
/// property of the machine).
inline bool attention_amx_usable(int hd) noexcept {
#if LOOM_GEMM_HAS_AVX512_BF16 && LOOM_PEAK_X86
  static const bool usable = gemm_avx512_bf16_supported() && bench::peak_unit_available(bench::peak_unit::amx_bf16);
  return hd % 32 == 0 && usable;
#else
  (void)hd;
  return false;
#endif
}

#if LOOM_GEMM_HAS_AVX512_BF16 && LOOM_PEAK_X86

#define LOOM_TARGET_AMX_BF16 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx512vl")))

/// Loads the tile configuration of Note [AMX attention products] (eight tiles of 16 rows x 64
/// bytes) on the calling thread; releases the tile state when destroyed. One per thread and
/// parallel region, around every attn_dot_amx call of that thread.
class amx_tile_scope {
 public:
  LOOM_TARGET_AMX_BF16 amx_tile_scope() noexcept {
    bench::detail::amx_tile_config cfg;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
  }
  LOOM_TARGET_AMX_BF16 ~amx_tile_scope() { _tile_release(); }
  amx_tile_scope(const amx_tile_scope&) = delete;
  amx_tile_scope& operator=(const amx_tile_scope&) = delete;
};

/// C (rows x cols) = alpha A B, or C += A B (accumulate; alpha must then be 1), fp32
/// accumulation on AMX tiles, over kp word pairs of the contraction:
///   A(r, p) = a[r a_row + p]   (the pairs of a row contiguous)
///   B(p, c) = b[p b_pair + c]  (word = rows 2p and 2p+1 of column c)
/// cols is a multiple of 16. Reads A rows up to a multiple of 32 and words up to a multiple
/// of 16, B rows up to a multiple of 16 and columns up to a multiple of 32 (Note [AMX attention
/// products]: the caller keeps these readable, A's padding words zero and B finite). Writes C
/// rows < rows, columns < cols (row stride ldc). Needs an amx_tile_scope on this thread.
LOOM_TARGET_AMX_BF16 inline void attn_dot_amx(int rows, int cols, int kp, const std::uint32_t* a, std::ptrdiff_t a_row,
                                              const std::uint32_t* b, std::ptrdiff_t b_pair, float* c,
                                              std::ptrdiff_t ldc, bool accumulate, float alpha = 1.0f) {
  alignas(64) float tmp[4][16 * 16];
  const int steps = (kp + 15) / 16;
  const std::ptrdiff_t sa = a_row * 4, sb = b_pair * 4, sc = ldc * 4;
  for (int r0 = 0; r0 < rows; r0 += 32) {
    const std::uint32_t* a0 = a + r0 * a_row;
    const std::uint32_t* a1 = a0 + 16 * a_row;
    for (int c0 = 0; c0 < cols; c0 += 32) {
      float* cb = c + r0 * ldc + c0;
      const bool direct = accumulate && r0 + 32 <= rows && c0 + 32 <= cols;
      if (direct) {
        _tile_loadd(0, cb, sc);
        _tile_loadd(1, cb + 16, sc);
        _tile_loadd(2, cb + 16 * ldc, sc);
        _tile_loadd(3, cb + 16 * ldc + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int s = 0; s < steps; ++s) {
        const std::uint32_t* bs = b + 16 * s * b_pair + c0;
        _tile_loadd(4, a0 + 16 * s, sa);
        _tile_loadd(5, a1 + 16 * s, sa);
        _tile_loadd(6, bs, sb);
        _tile_loadd(7, bs + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      if (direct) {
        _tile_stored(0, cb, sc);
        _tile_stored(1, cb + 16, sc);
        _tile_stored(2, cb + 16 * ldc, sc);
        _tile_stored(3, cb + 16 * ldc + 16, sc);
        continue;
      }
      _tile_stored(0, tmp[0], 64);
      _tile_stored(1, tmp[1], 64);
      _tile_stored(2, tmp[2], 64);
      _tile_stored(3, tmp[3], 64);
      const __m512 va = _mm512_set1_ps(alpha);
      for (int t = 0; t < 4; ++t) {
        const int rt = r0 + (t >> 1) * 16, ct = c0 + (t & 1) * 16;
        if (ct >= cols) continue;
        for (int i = 0; i < 16 && rt + i < rows; ++i) {
          float* ci = c + (rt + i) * ldc + ct;
          const __m512 v = _mm512_load_ps(tmp[t] + 16 * i);
          _mm512_storeu_ps(ci, accumulate ? _mm512_add_ps(_mm512_loadu_ps(ci), v) : _mm512_mul_ps(va, v));
        }
      }
    }
  }
}

/// Rounds an fp32 tile to bf16 row pairs, transposed: dst word (c, r2) (row stride ld_dst
/// words) = round(src[2 r2][c]) | round(src[2 r2 + 1][c]) << 16, for c < cols (a multiple of
/// 16) and r2 < ld_dst; rows at or past `rows` read as zero. The A operand of P^T dO and
/// dS^T Q on AMX tiles (Note [AMX attention products]).
LOOM_TARGET_AMX_BF16 inline void attn_round_pairs_transposed(std::uint32_t* dst, int ld_dst, const float* src,
                                                             std::ptrdiff_t ld_src, int rows, int cols) {
  alignas(64) static constexpr std::uint16_t interleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                               21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                               11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(interleave);
  const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(ld_dst));
  for (int r2 = 0; r2 < ld_dst; ++r2) {
    const int r = 2 * r2;
    const float* lo = r < rows ? src + r * ld_src : nullptr;
    const float* hi = r + 1 < rows ? src + (r + 1) * ld_src : nullptr;
    for (int c = 0; c < cols; c += 16) {
      const __m512 l = lo ? _mm512_loadu_ps(lo + c) : _mm512_setzero_ps();
      const __m512 h = hi ? _mm512_loadu_ps(hi + c) : _mm512_setzero_ps();
      const __m512i words = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(h, l));
      _mm512_i32scatter_epi32(dst + std::ptrdiff_t(c) * ld_dst + r2, lanes, words, 4);
    }
  }
}

#endif  // LOOM_GEMM_HAS_AVX512_BF16 && LOOM_PEAK_X86

/// The tile configuration of this thread's parallel region when `on` (an amx_tile_scope),
/// nothing otherwise; `on` needs attention_amx_usable().
class amx_scope {
 public:
  explicit amx_scope(bool on) noexcept {
#if LOOM_GEMM_HAS_AVX512_BF16 && LOOM_PEAK_X86
    if (on) tiles_.emplace();
#else
    (void)on;
#endif
  }

 private:
#if LOOM_GEMM_HAS_AVX512_BF16 && LOOM_PEAK_X86
  std::optional<amx_tile_scope> tiles_;
#endif
};

}  // namespace loom::kernels::cpu::detail
