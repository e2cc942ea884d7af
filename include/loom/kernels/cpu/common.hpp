#pragma once
/// \file Shared pieces of the CPU kernels: accumulator types and Eigen row-major maps.
#include <Eigen/Core>
#include <type_traits>

namespace loom::kernels::cpu {

/// Accumulator for a storage type: double stays double (finite-difference checks), every
/// other storage type (float, bfloat16, half) accumulates in float.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using map = Eigen::Map<matrix<T>, Eigen::Unaligned>;
template <class T>
using cmap = Eigen::Map<const matrix<T>, Eigen::Unaligned>;
/// Row-major matrix with a row stride larger than its width (e.g. one head inside qkv).
template <class T>
using smap = Eigen::Map<matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using csmap = Eigen::Map<const matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

}  // namespace loom::kernels::cpu
