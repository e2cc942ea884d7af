#pragma once
/// \file Elementwise inverted dropout (CPU) over a counter-based mask (core/dropout.hpp). The
/// same function is forward (on the activation) and backward (on its gradient): both multiply
/// by the regenerated keep factors, so no mask is stored.
///
/// Source: Srivastava et al., "Dropout", JMLR 15 (2014); PyTorch `torch.nn.functional.dropout`
/// (training mode: kept values scaled by 1/(1-p)).
#include <cstddef>
#include <cstdint>

#include <loom/core/dropout.hpp>
#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out[i] = in[i] * mask.factor(i) for i in [0, n): 0 where dropped, in[i] / (1-p) where kept
/// (computed in the accumulator type, rounded once to T). out =; out may equal in. An inactive
/// mask copies in to out. Parallel over i with OpenMP; the result does not depend on the
/// thread count. Cost: n hashes and multiplies.
template <class T>
void dropout(T* out, const T* in, std::size_t n, const dropout_mask& mask) {
  using A = acc_t<T>;
  const A scale = A(mask.scale);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i)
    out[i] = mask.keep(std::uint64_t(i)) ? T(A(in[i]) * scale) : T(0);
}

}  // namespace loom::kernels::cpu
