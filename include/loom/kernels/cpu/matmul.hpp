#pragma once
/// \file Linear layer y = x W^T + b, forward and backward (CPU, Eigen GEMM).
/// W is stored (OC, C) like torch.nn.Linear. GEMMs go through Eigen's blocked GEMM, which
/// uses AVX-512/AVX2 FMA when the translation unit is compiled for it and OpenMP threads
/// when compiled with -fopenmp (bench/bench_matmul measures it against OpenBLAS).
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out (N,OC) = inp (N,C) * w(OC,C)^T + bias (OC); bias may be null. out is written (=).
/// Cost: 2 N C OC flops.
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  map<T> y(out, N, OC);
  y.noalias() = cmap<T>(inp, N, C) * cmap<T>(w, OC, C).transpose();
  if (bias) y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, OC);
}

/// Backward of matmul_forward.
///   dinp (N,C) += dout * w   (= instead when accumulate_dinp is false; skipped when null)
///   dw (OC,C) += dout^T * inp
///   dbias (OC) += column sums of dout (skipped when dbias is null)
/// Cost: 4 N C OC flops.
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N,
                     int C, int OC, bool accumulate_dinp = true) {
  cmap<T> dy(dout, N, OC);
  if (dinp && accumulate_dinp) map<T>(dinp, N, C).noalias() += dy * cmap<T>(w, OC, C);
  if (dinp && !accumulate_dinp) map<T>(dinp, N, C).noalias() = dy * cmap<T>(w, OC, C);
  map<T>(dw, OC, C).noalias() += dy.transpose() * cmap<T>(inp, N, C);
  if (dbias) {
    // column sums, reading dout row by row (contiguous, vectorised); fixed order
    using A = acc_t<T>;
    Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> db(dbias, OC);
    db = (db.template cast<A>() + dy.template cast<A>().colwise().sum().array()).template cast<T>();
  }
}

}  // namespace loom::kernels::cpu
