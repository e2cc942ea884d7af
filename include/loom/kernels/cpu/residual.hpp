#pragma once
/// \file Residual add (CPU). Its backward is the identity on both inputs, which the block
/// realises by accumulating into the residual-stream gradient (no kernel needed).
#include <algorithm>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>

namespace loom::kernels::cpu {

/// out = a + b, elementwise over n values, summed in the accumulator type and rounded once;
/// out =. out may alias a (not b).
template <class T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n) {
  if constexpr (detail::is_16bit_v<T>) {
    constexpr std::ptrdiff_t chunk = detail::convert_chunk;
    const std::ptrdiff_t chunks = (std::ptrdiff_t(n) + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t c = 0; c < chunks; ++c) {
      const std::ptrdiff_t lo = c * chunk, len = std::min(chunk, std::ptrdiff_t(n) - lo);
      alignas(64) float x[chunk], y[chunk];
      detail::widen(x, a + lo, len);
      detail::widen(y, b + lo, len);
      for (std::ptrdiff_t i = 0; i < len; ++i) x[i] += y[i];
      detail::narrow(out + lo, x, len);
    }
  } else {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) out[i] = T(acc_t<T>(a[i]) + acc_t<T>(b[i]));
  }
}

}  // namespace loom::kernels::cpu
