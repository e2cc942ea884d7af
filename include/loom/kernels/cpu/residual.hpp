#pragma once
/// \file Residual add (CPU). Its backward is the identity on both inputs, which the block
/// realises by accumulating into the residual-stream gradient (no kernel needed).
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out = a + b, elementwise over n values; out =. out may alias a.
template <class T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n) {
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) out[i] = T(acc_t<T>(a[i]) + acc_t<T>(b[i]));
}

}  // namespace loom::kernels::cpu
