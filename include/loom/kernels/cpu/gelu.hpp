#pragma once
/// \file GELU, tanh approximation, forward and backward (CPU).
/// Source: Hendrycks & Gimpel, "Gaussian Error Linear Units", arXiv:1606.08415 (eq. for the
/// tanh approximation, as used by GPT-2).
#include <algorithm>
#include <cmath>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>

namespace loom::kernels::cpu {

template <class A>
inline constexpr A gelu_scale = A(0.7978845608028654);  // sqrt(2/pi)

/// Elements per parallel chunk of the elementwise kernels (each chunk is computed in the
/// accumulator type in stack buffers: no heap allocation).
inline constexpr std::ptrdiff_t elementwise_chunk = 4096;

namespace detail {
/// Calls f(lo, len) for the chunks of [0, n), in parallel.
template <class F>
void for_each_chunk(std::size_t n, F&& f) {
  const std::ptrdiff_t chunks = (std::ptrdiff_t(n) + elementwise_chunk - 1) / elementwise_chunk;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t c = 0; c < chunks; ++c) {
    const std::ptrdiff_t lo = c * elementwise_chunk;
    f(lo, std::min<std::ptrdiff_t>(elementwise_chunk, std::ptrdiff_t(n) - lo));
  }
}
}  // namespace detail

/// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values; out =.
/// Computed in the accumulator type through Eigen's array tanh (SIMD polynomial, not libm),
/// rounded once on store.
template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n) {
  using A = acc_t<T>;
  using amap = Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>, Eigen::Aligned64>;
  detail::for_each_chunk(n, [&](std::ptrdiff_t lo, std::ptrdiff_t len) {
    alignas(64) A xb[elementwise_chunk], yb[elementwise_chunk];
    detail::convert(xb, inp + lo, len);
    amap x(xb, len), y(yb, len);
    y = (gelu_scale<A> * (x + A(0.044715) * x.cube())).tanh();
    y = A(0.5) * x * (A(1) + y);
    detail::convert(out + lo, yb, len);
  });
}

/// dinp = gelu'(inp) * dout, elementwise; dinp = (overwrites: the MLP's hidden activation has
/// exactly one consumer). dinp may alias dout.
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n) {
  using A = acc_t<T>;
  using amap = Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>, Eigen::Aligned64>;
  detail::for_each_chunk(n, [&](std::ptrdiff_t lo, std::ptrdiff_t len) {
    alignas(64) A xb[elementwise_chunk], db[elementwise_chunk], tb[elementwise_chunk];
    detail::convert(xb, inp + lo, len);
    detail::convert(db, dout + lo, len);
    amap x(xb, len), d(db, len), th(tb, len);
    th = (gelu_scale<A> * (x + A(0.044715) * x.cube())).tanh();
    d *= A(0.5) * (A(1) + th) +
         A(0.5) * x * (A(1) - th.square()) * gelu_scale<A> * (A(1) + A(3 * 0.044715) * x.square());
    detail::convert(dinp + lo, db, len);
  });
}

}  // namespace loom::kernels::cpu
