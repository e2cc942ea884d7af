#pragma once
/// \file Linear layer y = x W^T + b, forward and backward (CPU).
/// W is stored (OC, C) like torch.nn.Linear. bfloat16 and half go through kernels::cpu::gemm
/// (fp32 accumulation, one rounding on store), and so does float when loom is built with oneDNN
/// (its sgemm measured faster than Eigen's: bench/bench_matmul). double, and float without
/// oneDNN, go through Eigen's blocked GEMM, which uses AVX-512/AVX2 FMA when the translation unit
/// is compiled for it and OpenMP threads when compiled with -fopenmp.
///
/// Note [gradient precision]: the parameter gradients dw, dbias have their own type G, which
/// is fp32 for half storage (kernels::gradient_t): they accumulate over micro-batches, and a
/// bf16 sum stops growing once the addend is below 2^-8 of it. Activation gradients (dinp)
/// keep the storage type T.
#include <algorithm>
#include <cstddef>
#include <type_traits>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/cpu/gemm.hpp>

namespace loom::kernels::cpu {

/// True for the 16-bit storage types whose GEMMs go through kernels::cpu::gemm.
template <class T>
inline constexpr bool is_half_storage_v = std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Eigen::half>;

/// True for the storage types whose linear layers call kernels::cpu::gemm (else Eigen directly).
template <class T>
inline constexpr bool uses_cpu_gemm_v = is_half_storage_v<T> || (std::is_same_v<T, float> && detail::gemm_has_onednn);

namespace detail {

/// Whether a linear layer on storage type T runs its GEMMs on oneDNN's matmul primitive when it
/// has a primitive cache (context<cpu>::gemm_cache), rather than kernels::cpu::gemm's automatic
/// choice. Decided per machine, once: float and half whenever loom is built with oneDNN (no
/// per-call allocation, unlike dnnl_sgemm; half converted in the cache's workspace where the
/// CPU has no fp16 matmul); bf16 except on a CPU with AVX512-BF16 but no AMX-BF16, where loom's
/// VDPBF16PS kernel measured as fast as oneDNN's (bench_matmul; oneDNN uses the AMX tiles
/// where they exist). Every GEMM of a run takes the same path, so runs are reproducible.
template <class T>
bool linear_uses_onednn_matmul() noexcept {
  if constexpr (!gemm_has_onednn || std::is_same_v<T, double>) {
    return false;
  } else if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    static const bool use = !cpu_has_avx512_bf16() || bench::peak_unit_available(bench::peak_unit::amx_bf16);
    return use;
  } else {
    return true;
  }
}

/// C = op(A) op(B) + beta C for a linear layer: through `cache`'s oneDNN matmul primitives when
/// it is non-null and linear_uses_onednn_matmul<T>(), else through kernels::cpu::gemm.
template <class T, class OutT>
void linear_gemm(onednn_matmul_cache* cache, bool trans_a, bool trans_b, int M, int N, int K, const T* A, int lda,
                 const T* B, int ldb, float beta, OutT* C, int ldc) {
  if (cache && linear_uses_onednn_matmul<T>())
    detail::gemm<T, OutT>(*cache, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  else
    kernels::cpu::gemm<T>(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace detail

/// out (N,OC) = inp (N,C) * w(OC,C)^T + bias (OC); bias may be null. out is written (=), not
/// read. For 16-bit T the product and the bias are summed in fp32 and rounded once.
/// `gemms`: oneDNN matmul primitives to use (context<cpu>::gemm_cache; see
/// detail::linear_uses_onednn_matmul), which add the bias themselves (the primitive's bias
/// argument); or null for kernels::cpu::gemm's automatic choice, after copying the bias into
/// every row of out.
/// Cost: 2 N C OC flops.
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC,
                    detail::onednn_matmul_cache* gemms = nullptr) {
  if constexpr (uses_cpu_gemm_v<T>) {
    if (gemms && detail::linear_uses_onednn_matmul<T>()) {  // the primitive adds the bias: out only written
      detail::gemm<T, T>(*gemms, false, true, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC, bias);
      return;
    }
    if (bias) {
#pragma omp parallel for schedule(static)
      for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + std::size_t(n) * OC);
    }
    kernels::cpu::gemm<T>(false, true, N, OC, C, 1.0f, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
  } else {
    map<T> y(out, N, OC);
    y.noalias() = cmap<T>(inp, N, C) * cmap<T>(w, OC, C).transpose();
    if (bias) y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, OC);
  }
}

/// Backward of matmul_forward.
///   dinp (N,C) += dout * w   (= instead when accumulate_dinp is false; skipped when null)
///   dw (OC,C) += dout^T * inp            (type G: see Note [gradient precision])
///   dbias (OC) += column sums of dout    (skipped when dbias is null)
/// Sums are fp32 (double for double). `gemms` as for matmul_forward. Cost: 4 N C OC flops.
template <class T, class G = T>
void matmul_backward(T* dinp, G* dw, G* dbias, const T* dout, const T* inp, const T* w, int N, int C, int OC,
                     bool accumulate_dinp = true, detail::onednn_matmul_cache* gemms = nullptr) {
  using A = acc_t<T>;
  if constexpr (uses_cpu_gemm_v<T>) {
    static_assert(std::is_same_v<G, float> || std::is_same_v<G, T>,
                  "matmul_backward: 16-bit storage takes fp32 or storage-type parameter gradients");
    if (dinp) detail::linear_gemm<T>(gemms, false, false, N, C, OC, dout, OC, w, C, accumulate_dinp ? 1.0f : 0.0f, dinp, C);
    detail::linear_gemm<T>(gemms, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
  } else {
    static_assert(std::is_same_v<G, T>, "matmul_backward: float/double storage takes gradients of the same type");
    cmap<T> dy(dout, N, OC);
    if (dinp && accumulate_dinp) map<T>(dinp, N, C).noalias() += dy * cmap<T>(w, OC, C);
    if (dinp && !accumulate_dinp) map<T>(dinp, N, C).noalias() = dy * cmap<T>(w, OC, C);
    map<T>(dw, OC, C).noalias() += dy.transpose() * cmap<T>(inp, N, C);
  }
  if (!dbias) return;
  if constexpr (!std::is_same_v<T, double>) {
    // column sums in fp32: parallel over blocks of 64 columns, rows in order (deterministic);
    // each row's piece widened in one vectorised pass; no temporary
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < OC; c0 += 64) {
      const int len = std::min(64, OC - c0);
      alignas(64) float sum[64] = {}, piece[64];
      for (int n = 0; n < N; ++n) {
        detail::widen(piece, dout + std::size_t(n) * OC + c0, len);
        for (int k = 0; k < len; ++k) sum[k] += piece[k];
      }
      for (int k = 0; k < len; ++k) dbias[c0 + k] = G(A(dbias[c0 + k]) + sum[k]);
    }
  } else {
    // column sums in double, reading dout row by row (contiguous, vectorised); fixed order
    Eigen::Map<Eigen::Array<G, 1, Eigen::Dynamic>> db(dbias, OC);
    db = (db.template cast<A>() + cmap<T>(dout, N, OC).template cast<A>().colwise().sum().array()).template cast<G>();
  }
}

// Compiled once per program with LOOM_CPU_EXTERN_KERNELS: Note [explicit kernel instantiations]
// in kernels/cpu/attention_fused.hpp. G is the parameter-gradient type (fp32 for 16-bit T).
#define LOOM_CPU_MATMUL_INSTANCES(PREFIX, T, G)                                                      \
  PREFIX void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, detail::onednn_matmul_cache*); \
  PREFIX void matmul_backward<T, G>(T*, G*, G*, const T*, const T*, const T*, int, int, int, bool,               \
                                    detail::onednn_matmul_cache*);
#ifdef LOOM_CPU_EXTERN_KERNELS
LOOM_CPU_MATMUL_INSTANCES(extern template, float, float)
LOOM_CPU_MATMUL_INSTANCES(extern template, double, double)
LOOM_CPU_MATMUL_INSTANCES(extern template, Eigen::bfloat16, float)
LOOM_CPU_MATMUL_INSTANCES(extern template, Eigen::half, float)
#endif

}  // namespace loom::kernels::cpu
