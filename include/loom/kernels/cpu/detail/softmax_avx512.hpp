#pragma once
/// \file Private: AVX-512 row kernels of the fused attention's softmax (fp32): exp of a row
/// shifted by its maximum or log-sum-exp, the row's maximum, and a dot product, each one pass
/// with masked loads and stores for the tail (so no element goes through libm's scalar expf).
/// Compiled with a target attribute (the translation unit needs no -mavx512f) and called only
/// where softmax_avx512_usable() says the CPU runs AVX-512F (kernels/cpu/detail/
/// attention_shape.hpp chooses at run time; elsewhere its Eigen expressions run).
///
/// exp: Cephes' expf (S. L. Moshier, Cephes Math Library, expf.c): x = n ln 2 + r with
/// n = round(x log2 e) and ln 2 split in two constants (Cody-Waite), e^r by a degree-6
/// polynomial on |r| <= ln2 / 2, then 2^n applied with VSCALEFPS (Intel Intrinsics Guide,
/// _mm512_scalef_ps). Arguments are clamped to [-104, 88.72]; below -103.9 (and -inf) the
/// result is exactly 0. Relative error within 2 ulp of the correctly rounded result on the
/// normal range (the unit test checks it against double-precision exp).
/// Sums are in a fixed order: lane-wise in index order, then the 16 lanes reduced in a fixed
/// tree; independent of threads and of how the caller tiles.
#include <cstddef>
#include <limits>

#if (defined(__x86_64__) || defined(__i386__)) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define LOOM_SOFTMAX_HAS_AVX512 1
#include <immintrin.h>
#define LOOM_TARGET_SOFTMAX_AVX512 __attribute__((target("avx512f")))
#else
#define LOOM_SOFTMAX_HAS_AVX512 0
#endif

namespace loom::kernels::cpu::detail {

/// True when the AVX-512 row kernels are compiled in and this CPU runs AVX-512F. Read once; also
/// the AVX-512F check of the fused attention's FMA products (attention_fma_usable).
inline bool softmax_avx512_usable() noexcept {
#if LOOM_SOFTMAX_HAS_AVX512
  static const bool usable = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return usable;
#else
  return false;
#endif
}

#if LOOM_SOFTMAX_HAS_AVX512

/// Lanes [0, n) of a 16-lane mask (n >= 16: all).
LOOM_TARGET_SOFTMAX_AVX512 inline __mmask16 softmax_tail_mask(int n) noexcept {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}

/// e^x lane-wise (Cephes expf with VSCALEFPS; see the file comment): 0 below -103.9.
LOOM_TARGET_SOFTMAX_AVX512 inline __m512 exp_avx512(__m512 x) noexcept {
  const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.9f), _CMP_LT_OQ);  // and -inf
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(__mmask16(~zero), _mm512_scalef_ps(y, n));
}

/// row[c] = e^(row[c] - shift) for c < n; returns the sum of the n results (fixed order).
LOOM_TARGET_SOFTMAX_AVX512 inline float exp_shift_sum_avx512(float* row, int n, float shift) noexcept {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (int c = 0; c < n; c += 16) {
    const __mmask16 k = softmax_tail_mask(n - c);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + c), s));
    _mm512_mask_storeu_ps(row + c, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

/// max(row[0 .. n)), -inf for n == 0.
LOOM_TARGET_SOFTMAX_AVX512 inline float row_max_avx512(const float* row, int n) noexcept {
  __m512 acc = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int c = 0; c < n; c += 16) {
    const __mmask16 k = softmax_tail_mask(n - c);
    acc = _mm512_mask_max_ps(acc, k, acc, _mm512_maskz_loadu_ps(k, row + c));
  }
  return _mm512_reduce_max_ps(acc);
}

/// sum_c a[c] b[c] over c < n (fixed order).
LOOM_TARGET_SOFTMAX_AVX512 inline float dot_avx512(const float* a, const float* b, int n) noexcept {
  __m512 acc = _mm512_setzero_ps();
  for (int c = 0; c < n; c += 16) {
    const __mmask16 k = softmax_tail_mask(n - c);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + c), _mm512_maskz_loadu_ps(k, b + c), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

#endif  // LOOM_SOFTMAX_HAS_AVX512

}  // namespace loom::kernels::cpu::detail
