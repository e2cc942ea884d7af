#pragma once
/// \file Private: the portable GEMM behind loom::kernels::cpu::gemm. Converts bf16/half operands
/// to fp32 and runs an fp32 GEMM: Eigen's blocked GEMM (threaded by OpenMP when compiled with
/// -fopenmp), or oneDNN's dnnl_sgemm when loom is built with it (LOOM_WITH_ONEDNN; oneDNN picks
/// AVX-512/AVX2 kernels at run time). Used for float and Eigen::half, and for Eigen::bfloat16
/// where the VDPBF16PS kernel is missing or slower (gemm_default_impl).
#include <Eigen/Core>
#if defined(LOOM_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#endif
#include <cstddef>
#include <type_traits>

#include <loom/core/error.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>
#include <loom/kernels/cpu/detail/workspace.hpp>

namespace loom::kernels::cpu::detail {

/// Row-major fp32 view with a row stride (elements).
using gemm_fmap = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
                             Eigen::OuterStride<>>;
using gemm_cfmap = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                              Eigen::Unaligned, Eigen::OuterStride<>>;

/// Element i of a T array as float (T: float, Eigen::bfloat16, Eigen::half).
template <class T>
inline float gemm_to_float(T x) noexcept {
  return static_cast<float>(x);
}

/// Calls row(r) for r in [0, rows): in an OpenMP parallel loop when the matrix has more than 2^16
/// elements, else on this thread without opening a region (libgomp allocates a team for every
/// one-thread region; the training step allocates nothing).
template <class F>
void gemm_for_rows(int rows, std::size_t elements, F&& row) {
#if defined(_OPENMP)
  if (elements > (std::size_t(1) << 16)) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) row(r);
    return;
  }
#endif
  for (int r = 0; r < rows; ++r) row(r);
}

/// dst (rows, cols) contiguous fp32 = src (rows, cols) with row stride ld, converted from T.
template <class T>
void gemm_convert_rows(float* dst, const T* src, int rows, int cols, int ld) {
  auto row = [&](int r) { widen(dst + std::size_t(r) * std::size_t(cols), src + std::size_t(r) * std::size_t(ld), cols); };
  gemm_for_rows(rows, std::size_t(rows) * std::size_t(cols), row);
}

/// C (M,N; row stride ldc) = round_OutT(t + beta * C), t (M,N) contiguous fp32; beta == 0 does
/// not read C.
template <class OutT>
void gemm_round_into(int M, int N, float beta, const float* t, OutT* C, int ldc) {
  auto row = [&](int i) {
    OutT* ci = C + std::size_t(i) * std::size_t(ldc);
    const float* ti = t + std::size_t(i) * std::size_t(N);
    if (beta == 0.0f)
      for (int j = 0; j < N; ++j) ci[j] = OutT(ti[j]);
    else
      for (int j = 0; j < N; ++j) ci[j] = OutT(ti[j] + beta * gemm_to_float(ci[j]));
  };
  gemm_for_rows(M, std::size_t(M) * std::size_t(N), row);
}

/// True when oneDNN's sgemm is compiled in (LOOM_WITH_ONEDNN).
inline constexpr bool gemm_has_onednn =
#if defined(LOOM_WITH_ONEDNN)
    true;
#else
    false;
#endif

/// C (M,N) = alpha * op(A) op(B) + beta * C in fp32, row-major, through dnnl_sgemm (whose C API
/// is row-major: oneDNN developer guide, "dnnl_sgemm"). Throws loom::device_error on a failed call.
inline void gemm_onednn_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            const float* B, int ldb, float beta, float* C, int ldc) {
#if defined(LOOM_WITH_ONEDNN)
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                                      C, ldc);
  if (st != dnnl_success) throw device_error(int(st), "dnnl_sgemm", "oneDNN sgemm failed");
#else
  (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
      (void)beta, (void)C, (void)ldc;
  throw input_error("loom::kernels::cpu::gemm: built without oneDNN (LOOM_WITH_ONEDNN); use gemm_impl::automatic");
#endif
}

/// C (M,N) = alpha * op(A) op(B) + beta * C with fp32 accumulation (see cpu::gemm for the
/// argument contract, which the caller has already checked). OutT is float or T; beta == 0
/// means C is not read. onednn: the fp32 product runs in dnnl_sgemm instead of Eigen.
template <class T, class OutT>
void gemm_convert(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B,
                  int ldb, float beta, OutT* C, int ldc, bool onednn = false) {
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  // fp32 operands: the caller's memory for float, converted contiguous copies (in this thread's
  // workspaces: no allocation once grown) otherwise.
  const float* pa;
  const float* pb;
  int la = lda, lb = ldb;
  if constexpr (std::is_same_v<T, float>) {
    pa = A;
    pb = B;
  } else {
    float* a32 = thread_workspace(std::size_t(a_rows) * std::size_t(a_cols), workspace_slot::gemm_a);
    float* b32 = thread_workspace(std::size_t(b_rows) * std::size_t(b_cols), workspace_slot::gemm_b);
    gemm_convert_rows(a32, A, a_rows, a_cols, lda);
    gemm_convert_rows(b32, B, b_rows, b_cols, ldb);
    pa = a32;
    pb = b32;
    la = a_cols;
    lb = b_cols;
  }
  // A 16-bit product accumulated into an fp32 C (a weight gradient over micro-batches) is
  // computed whole, then added once: C + (p1 + p2 + ...), not ((C + p1) + p2) ... as a GEMM that
  // adds each K block into C would round it. So accumulating micro-batches on one rank equals
  // summing them across data-parallel ranks, bit for bit (CPUs whose 16-bit GEMMs take this path).
  constexpr bool whole_then_add = std::is_same_v<OutT, float> && !std::is_same_v<T, float>;
  if (whole_then_add && beta != 0.0f) {
    float* c32 = thread_workspace(std::size_t(M) * std::size_t(N), workspace_slot::gemm_c);
    gemm_convert(trans_a, trans_b, M, N, K, alpha, pa, la, pb, lb, 0.0f, c32, N, onednn);
    return gemm_round_into(M, N, beta, c32, C, ldc);
  }
  if (onednn) {
    if constexpr (std::is_same_v<OutT, float>) {
      return gemm_onednn_f32(trans_a, trans_b, M, N, K, alpha, pa, la, pb, lb, beta, C, ldc);
    } else {
      float* c32 = thread_workspace(std::size_t(M) * std::size_t(N), workspace_slot::gemm_c);
      gemm_onednn_f32(trans_a, trans_b, M, N, K, alpha, pa, la, pb, lb, 0.0f, c32, N);
      return gemm_round_into(M, N, beta, c32, C, ldc);
    }
  }
  const gemm_cfmap a(pa, a_rows, a_cols, Eigen::OuterStride<>(la));
  const gemm_cfmap b(pb, b_rows, b_cols, Eigen::OuterStride<>(lb));

  // out (M,N) = alpha * op(A) op(B): the four transpose combinations, each one Eigen GEMM.
  auto product_into = [&](gemm_fmap out, bool accumulate) {
    auto run = [&](const auto& x, const auto& y) {
      if (accumulate)
        out.noalias() += alpha * (x * y);
      else
        out.noalias() = alpha * (x * y);
    };
    if (!trans_a && !trans_b) run(a, b);
    if (!trans_a && trans_b) run(a, b.transpose());
    if (trans_a && !trans_b) run(a.transpose(), b);
    if (trans_a && trans_b) run(a.transpose(), b.transpose());
  };

  if constexpr (std::is_same_v<OutT, float>) {
    gemm_fmap c(C, M, N, Eigen::OuterStride<>(ldc));
    if (beta == 0.0f) {
      product_into(c, false);
    } else {
      if (beta != 1.0f) c *= beta;
      product_into(c, true);
    }
  } else {
    float* c32 = thread_workspace(std::size_t(M) * std::size_t(N), workspace_slot::gemm_c);
    product_into(gemm_fmap(c32, M, N, Eigen::OuterStride<>(N)), false);
    gemm_round_into(M, N, beta, c32, C, ldc);
  }
}

}  // namespace loom::kernels::cpu::detail
