#pragma once
/// \file Token + position embedding, forward and backward (CPU).
#include <cstdint>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
///   out (B,T,C) written (=); tokens (B,T) int32 in [0, rows of wte) — validated by the caller;
///   wte (Vp,C); wpe (maxT,C) with T <= maxT, or null (no learned positions: a copy of the
///   rows, as rotary models embed).  Cost: B*T*C adds.
template <class T>
void encoder_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int Tn,
                     int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      T* o = out + (std::size_t(b) * Tn + t) * C;
      const T* e = wte + std::size_t(tokens[b * Tn + t]) * C;
      if (!wpe) {
        for (int c = 0; c < C; ++c) o[c] = e[c];
        continue;
      }
      const T* p = wpe + std::size_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = T(acc_t<T>(e[c]) + acc_t<T>(p[c]));
    }
}

/// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t,:] += dout[b,t,:]
///   dwte (Vp,C) +=, dwpe (maxT,C) += or null (type G: fp32 for 16-bit storage), dout (B,T,C). Serial over tokens (scatter-add), parallel
///   over channels, so the summation order is fixed and results are deterministic.
template <class T, class G = T>
void encoder_backward(G* dwte, G* dwpe, const T* dout, const std::int32_t* tokens, int B, int Tn,
                      int C) {
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t) {
        const T* d = dout + (std::size_t(b) * Tn + t) * C;
        G* e = dwte + std::size_t(tokens[b * Tn + t]) * C;
        for (int c = c0; c < c1; ++c) e[c] = G(acc_t<T>(e[c]) + acc_t<T>(d[c]));
        if (!dwpe) continue;
        G* p = dwpe + std::size_t(t) * C;
        for (int c = c0; c < c1; ++c) p[c] = G(acc_t<T>(p[c]) + acc_t<T>(d[c]));
      }
  }
}

}  // namespace loom::kernels::cpu
