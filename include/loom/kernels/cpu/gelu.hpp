#pragma once
/// \file GELU, tanh approximation, forward and backward (CPU).
/// Source: Hendrycks & Gimpel, "Gaussian Error Linear Units", arXiv:1606.08415 (eq. for the
/// tanh approximation, as used by GPT-2).
#include <cmath>
#include <algorithm>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

template <class A>
inline constexpr A gelu_scale = A(0.7978845608028654);  // sqrt(2/pi)

/// Elements per parallel chunk of the elementwise kernels.
inline constexpr std::ptrdiff_t elementwise_chunk = 4096;

/// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values; out =.
/// Vectorised through Eigen's array tanh (SIMD polynomial, not libm).
template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n) {
  using A = acc_t<T>;
  using arr = Eigen::Array<A, Eigen::Dynamic, 1>;
  const std::ptrdiff_t chunks = (std::ptrdiff_t(n) + elementwise_chunk - 1) / elementwise_chunk;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t c = 0; c < chunks; ++c) {
    const std::ptrdiff_t lo = c * elementwise_chunk, len = std::min<std::ptrdiff_t>(elementwise_chunk, std::ptrdiff_t(n) - lo);
    const arr x = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(inp + lo, len).template cast<A>();
    const arr th = (gelu_scale<A> * (x + A(0.044715) * x.cube())).tanh();
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out + lo, len) = (A(0.5) * x * (A(1) + th)).template cast<T>();
  }
}

/// dinp = gelu'(inp) * dout, elementwise; dinp = (overwrites: the MLP's hidden activation has
/// exactly one consumer).
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n) {
  using A = acc_t<T>;
  using arr = Eigen::Array<A, Eigen::Dynamic, 1>;
  const std::ptrdiff_t chunks = (std::ptrdiff_t(n) + elementwise_chunk - 1) / elementwise_chunk;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t c = 0; c < chunks; ++c) {
    const std::ptrdiff_t lo = c * elementwise_chunk, len = std::min<std::ptrdiff_t>(elementwise_chunk, std::ptrdiff_t(n) - lo);
    const arr x = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(inp + lo, len).template cast<A>();
    const arr d = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(dout + lo, len).template cast<A>();
    const arr th = (gelu_scale<A> * (x + A(0.044715) * x.cube())).tanh();
    const arr grad = A(0.5) * (A(1) + th) +
                     A(0.5) * x * (A(1) - th.square()) * gelu_scale<A> * (A(1) + A(3 * 0.044715) * x.square());
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(dinp + lo, len) = (grad * d).template cast<T>();
  }
}

}  // namespace loom::kernels::cpu
