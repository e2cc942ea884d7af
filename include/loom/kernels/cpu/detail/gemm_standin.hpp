#pragma once
/// \file TEMPORARY stand-in for kernels/cpu/gemm.hpp (branch prec-kernels): same interface,
/// converts the operands to float and calls Eigen. Deleted when the real GEMM lands on main.
#include <cstddef>
#include <vector>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

namespace detail {
template <class T>
matrix<float> gemm_standin_operand(bool trans, int rows, int cols, const T* X, int ld) {
  // op(X) is (rows, cols); X is stored (rows, cols) or, when trans, (cols, rows), row stride ld
  matrix<float> out(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out(r, c) = float(trans ? X[std::size_t(c) * ld + r] : X[std::size_t(r) * ld + c]);
  return out;
}
}  // namespace detail

/// C (M,N) row-major fp32: C = alpha*op(A)*op(B) + beta*C (stand-in; see file comment).
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb,
          float beta, float* C, int ldc) {
  const matrix<float> a = detail::gemm_standin_operand(trans_a, M, K, A, lda);
  const matrix<float> b = detail::gemm_standin_operand(trans_b, K, N, B, ldb);
  const matrix<float> ab = a * b;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float& c = C[std::size_t(i) * ldc + j];
      c = alpha * ab(i, j) + (beta == 0.0f ? 0.0f : beta * c);
    }
}

/// Same with C of type T, rounded to T on store (stand-in).
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb,
          float beta, T* C, int ldc) {
  const matrix<float> a = detail::gemm_standin_operand(trans_a, M, K, A, lda);
  const matrix<float> b = detail::gemm_standin_operand(trans_b, K, N, B, ldb);
  const matrix<float> ab = a * b;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      T& c = C[std::size_t(i) * ldc + j];
      c = T(alpha * ab(i, j) + (beta == 0.0f ? 0.0f : beta * float(c)));
    }
}

}  // namespace loom::kernels::cpu
