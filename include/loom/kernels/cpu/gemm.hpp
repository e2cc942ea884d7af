#pragma once
/// \file General matrix product for fp32, bf16 and fp16 operands with fp32 accumulation (CPU).
///
/// The linear layers' three products map onto it as
///   forward          y (N,OC)  = x (N,C) * W (OC,C)^T    gemm(false, true,  N, OC, C, ...)
///   backward, data   dx (N,C)  = dy (N,OC) * W (OC,C)    gemm(false, false, N, C, OC, ...)
///   backward, weight dW (OC,C) += dy^T * x               gemm(true,  false, OC, C, N, ..., beta=1, float* dW)
///
/// Implementations (detail::gemm_impl), chosen at run time per machine (gemm_default_impl):
///   avx512_bf16   T = Eigen::bfloat16 on a CPU with AVX512-BF16: packed pair-interleaved panels
///                 and a 12x32 VDPBF16PS micro-kernel (detail/gemm_avx512_bf16.hpp). Compiled with
///                 function-level target attributes, so the build never needs -mavx512*. Chosen
///                 wherever the CPU has AVX512-BF16, although its unit is only 0.5x fp32 FMA on the
///                 Intel Xeons without AMX this project ran on (AMD Zen 4/5: about 2x); see
///                 gemm_default_impl for why converting is not the default there yet.
///   onednn        bf16/half operands converted to fp32, then oneDNN's dnnl_sgemm (built with
///                 LOOM_WITH_ONEDNN: the loom::onednn CMake target; oneDNN dispatches AVX-512 or
///                 AVX2 itself). The default for float and fp16 when present.
///   fp32_convert  the same conversion, then Eigen's fp32 GEMM (detail/gemm_convert.hpp): the
///                 default without oneDNN.
///   onednn_matmul oneDNN's matmul primitive on the bf16/fp16/fp32 operands as they are (fp32
///                 accumulation), created once per shape and kept in a caller-owned
///                 detail::onednn_matmul_cache (detail/gemm_onednn.hpp); only through the
///                 detail::gemm overload that takes the cache, never chosen by `automatic`.
/// bench/bench_matmul prints every implementation per shape on the machine at hand.
#include <cstddef>
#include <string>
#include <type_traits>

#include <Eigen/Core>

#include <loom/bench/peak.hpp>
#include <loom/core/error.hpp>
#include <loom/kernels/cpu/detail/gemm_avx512_bf16.hpp>
#include <loom/kernels/cpu/detail/gemm_convert.hpp>
#include <loom/kernels/cpu/detail/gemm_onednn.hpp>

namespace loom::kernels::cpu {

namespace detail {

/// Which GEMM implementation to run; `automatic` picks the fastest one on this machine.
enum class gemm_impl {
  automatic,     ///< gemm_default_impl<T>()
  avx512_bf16,   ///< VDPBF16PS micro-kernel; bf16 operands only; throws on a CPU without it
  fp32_convert,  ///< convert to fp32 and run Eigen's fp32 GEMM; any T
  onednn,        ///< convert to fp32 and run oneDNN's sgemm; any T; throws when built without oneDNN
  onednn_matmul, ///< oneDNN's matmul primitive on T itself; any T; needs an onednn_matmul_cache
};

/// "automatic", "avx512_bf16", "fp32_convert" (Eigen), "onednn" or "onednn_matmul".
constexpr const char* gemm_impl_name(gemm_impl i) noexcept {
  return i == gemm_impl::automatic       ? "automatic"
         : i == gemm_impl::avx512_bf16   ? "avx512_bf16"
         : i == gemm_impl::onednn        ? "onednn"
         : i == gemm_impl::onednn_matmul ? "onednn_matmul"
                                         : "fp32_convert";
}

/// True when this CPU executes AVX512-BF16 (and the compiler could build the kernel for it).
inline bool cpu_has_avx512_bf16() noexcept { return gemm_avx512_bf16_supported(); }

/// The implementation `automatic` resolves to for operand type T on this machine: the VDPBF16PS
/// kernel for bf16 where the CPU has AVX512-BF16, else oneDNN when built with it, else Eigen.
/// (Not yet by bf16_unit_faster_than_fp32(), although converting is faster where that is false:
/// with bf16 GEMMs converted to fp32, the 200-step bf16 loss curve of
/// tests/unit/precision/test_mixed_precision_training.cpp left fp32's by 0.18 nats against 0.06
/// with VDPBF16PS, and why is not understood yet.)
template <class T>
gemm_impl gemm_default_impl() noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>)
    if (cpu_has_avx512_bf16()) return gemm_impl::avx512_bf16;
  return gemm_has_onednn ? gemm_impl::onednn : gemm_impl::fp32_convert;
}

inline void gemm_check(bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda, const void* B,
                       int ldb, const void* C, int ldc) {
  if (M < 0 || N < 0 || K < 0)
    throw input_error("loom::kernels::cpu::gemm: negative size M=" + std::to_string(M) + " N=" + std::to_string(N) +
                      " K=" + std::to_string(K) + "; pass sizes >= 0");
  const int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  auto check_ld = [](const char* name, int ld, int cols) {
    if (ld < (cols > 1 ? cols : 1))
      throw input_error(std::string("loom::kernels::cpu::gemm: leading dimension ") + name + "=" + std::to_string(ld) +
                        " is smaller than the " + std::to_string(cols) +
                        " columns its row-major matrix holds; pass ld >= columns");
  };
  check_ld("lda", lda, a_cols);
  check_ld("ldb", ldb, b_cols);
  check_ld("ldc", ldc, N);
  if (M > 0 && N > 0 && ((K > 0 && (!A || !B)) || !C))
    throw input_error("loom::kernels::cpu::gemm: null matrix pointer for a non-empty product; pass valid A, B, C");
}

/// C = beta * C (+ alpha * bias[j] in column j when bias is non-null), in fp32 and rounded once;
/// beta == 0 writes without reading C (NaN in C does not survive).
template <class OutT, class T = OutT>
void gemm_scale(int M, int N, float beta, OutT* C, int ldc, float alpha = 0.0f, const T* bias = nullptr) {
  for (int i = 0; i < M; ++i) {
    OutT* c = C + std::size_t(i) * std::size_t(ldc);
    for (int j = 0; j < N; ++j) {
      float v = beta == 0.0f ? 0.0f : beta * static_cast<float>(c[j]);
      if (bias) v += alpha * static_cast<float>(bias[j]);
      c[j] = OutT(v);
    }
  }
}

/// cpu::gemm with an explicit implementation (tests force each one). Same contract as
/// cpu::gemm; additionally throws loom::input_error when `impl` is avx512_bf16 and T is not
/// Eigen::bfloat16 or the CPU lacks AVX512-BF16, `impl` is onednn in a build without it, or
/// `impl` is onednn_matmul (it needs a cache: the overload below).
template <class T, class OutT>
void gemm(gemm_impl impl, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
          const T* B, int ldb, float beta, OutT* C, int ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Eigen::half>,
                "loom::kernels::cpu::gemm: T must be float, Eigen::bfloat16 or Eigen::half");
  static_assert(std::is_same_v<OutT, float> || std::is_same_v<OutT, T>,
                "loom::kernels::cpu::gemm: C must be float or the operand type T");
  gemm_check(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  if (impl == gemm_impl::automatic) impl = gemm_default_impl<T>();
  if (impl == gemm_impl::avx512_bf16 && !(std::is_same_v<T, Eigen::bfloat16> && cpu_has_avx512_bf16()))
    throw input_error(
        "loom::kernels::cpu::gemm: gemm_impl::avx512_bf16 needs Eigen::bfloat16 operands and a CPU with "
        "AVX512-BF16; use gemm_impl::automatic");
  if (impl == gemm_impl::onednn_matmul)
    throw input_error(
        "loom::kernels::cpu::gemm: gemm_impl::onednn_matmul keeps its primitives in a cache; call "
        "detail::gemm(onednn_matmul_cache&, ...) with a cache you own");
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) return gemm_scale(M, N, beta, C, ldc);
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    if (impl == gemm_impl::avx512_bf16)
      return gemm_avx512_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  gemm_convert(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, impl == gemm_impl::onednn);
}

/// cpu::gemm through oneDNN's matmul primitive (gemm_impl::onednn_matmul), with the primitive
/// of this shape taken from (or created once into) `cache`:
///   C (M,N) = alpha * (op(A) * op(B) + bias) + beta * C, fp32 accumulation, C fp32 or rounded
///   to T once; bias (N values, bias[j] added to column j) may be null (no bias).
/// Shapes, leading dimensions, beta == 0 (C not read), K == 0 or alpha == 0 (C = beta * C, plus
/// alpha * bias) and the input checks are those of cpu::gemm. T: float, Eigen::bfloat16 or
/// Eigen::half; OutT: float or T. Writes C and the cache (a new primitive for a new shape, a
/// larger workspace).
/// Threads: oneDNN's (OpenMP); the cache is used by one thread at a time.
/// Numerics: bf16 products are exact in fp32 and summed in fp32 (oneDNN's brgemm/gemm kernels;
/// the summation order differs from the other implementations); fp16 operands run natively
/// only on CPUs with AVX512-FP16, elsewhere converted to fp32 first (same values).
/// Errors: loom::input_error for the cpu::gemm input errors and when built without oneDNN
/// (LOOM_WITH_ONEDNN); loom::device_error when oneDNN fails to create or run the primitive.
/// Source: oneDNN developer guide, "Matmul" primitive (memory descriptors with strides for
/// transposes and leading dimensions, sum post-op for beta, output scales for alpha, the bias
/// argument for bias).
template <class T, class OutT>
void gemm(onednn_matmul_cache& cache, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A,
          int lda, const T* B, int ldb, float beta, OutT* C, int ldc, const T* bias = nullptr) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Eigen::half>,
                "loom::kernels::cpu::gemm: T must be float, Eigen::bfloat16 or Eigen::half");
  static_assert(std::is_same_v<OutT, float> || std::is_same_v<OutT, T>,
                "loom::kernels::cpu::gemm: C must be float or the operand type T");
  gemm_check(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  if constexpr (!gemm_has_onednn_matmul) {
    cache.run(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);  // throws input_error
  }
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) return gemm_scale(M, N, beta, C, ldc, alpha, bias);
  cache.run(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
}

}  // namespace detail

/// General matrix product with fp32 accumulation, fp32 result:
///   C (M,N) = alpha * op(A) * op(B) + beta * C
///
/// Shapes (all row-major, leading dimensions in elements):
///   A   (M,K), or stored (K,M) when trans_a     lda >= its stored column count
///   B   (K,N), or stored (N,K) when trans_b     ldb >= its stored column count
///   C   (M,N) fp32                              ldc >= N
/// T is float, Eigen::bfloat16 or Eigen::half. Products and sums are fp32 whatever T is.
/// Writes: C (=). beta == 0 means C is not read (BLAS convention: NaN/garbage in C is
/// overwritten); beta == 1 accumulates (+=), e.g. into an fp32 gradient buffer.
/// K == 0 or alpha == 0 gives C = beta * C without reading A or B.
/// Threads: omp_get_max_threads() OpenMP threads (bf16 kernel: products under 4e6 flops run on
/// one; Eigen and oneDNN: their own OpenMP GEMMs). Inside a parallel region it runs on the
/// calling thread.
/// Numerics: the AVX512-BF16 path treats bf16 subnormal inputs (|x| < 2^-126) as zero (DAZ), as
/// VDPBF16PS does; the fp32-convert path keeps them.
/// Errors: loom::input_error for negative sizes, ld smaller than the stored row width, or null
/// pointers with a non-empty product.
/// Cost: 2 M N K flops. Source: BLAS xGEMM argument convention (netlib); Intel Intrinsics Guide,
/// _mm512_dpbf16_ps (VDPBF16PS); Goto & van de Geijn, "Anatomy of High-Performance Matrix
/// Multiplication" (ACM TOMS 34(3), 2008) for the packing and blocking.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb,
          float beta, float* C, int ldc) {
  detail::gemm<T, float>(detail::gemm_impl::automatic, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                         ldc);
}

/// Same product, result rounded to T (round to nearest even) on store:
///   C (M,N) = round_T(alpha * op(A) * op(B) + beta * C),  C read as T and widened to fp32.
/// The whole K sum stays in fp32; the only rounding to T is the final store (one rounding:
/// relative 2^-8 for bf16, 2^-11 for fp16). Same shapes, errors, threads and cost as above.
/// (For T = float this is the overload above; the constraint only removes the ambiguity.)
template <class T>
  requires(!std::is_same_v<T, float>)
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb,
          float beta, T* C, int ldc) {
  detail::gemm<T, T>(detail::gemm_impl::automatic, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace loom::kernels::cpu
