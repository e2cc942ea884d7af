#pragma once
/// \file GELU, tanh approximation, forward and backward (CPU).
/// Source: Hendrycks & Gimpel, "Gaussian Error Linear Units", arXiv:1606.08415 (eq. for the
/// tanh approximation, as used by GPT-2).
#include <cmath>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

template <class A>
inline constexpr A gelu_scale = A(0.7978845608028654);  // sqrt(2/pi)

/// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values; out =.
template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) {
    const A x = A(inp[i]);
    out[i] = T(A(0.5) * x * (A(1) + std::tanh(gelu_scale<A> * (x + A(0.044715) * x * x * x))));
  }
}

/// dinp = gelu'(inp) * dout, elementwise; dinp = (overwrites: the MLP's hidden activation has
/// exactly one consumer).
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) {
    const A x = A(inp[i]);
    const A u = gelu_scale<A> * (x + A(0.044715) * x * x * x);
    const A th = std::tanh(u);
    const A sech2 = A(1) - th * th;
    const A grad = A(0.5) * (A(1) + th) +
                   A(0.5) * x * sech2 * gelu_scale<A> * (A(1) + A(3 * 0.044715) * x * x);
    dinp[i] = T(grad * A(dout[i]));
  }
}

}  // namespace loom::kernels::cpu
