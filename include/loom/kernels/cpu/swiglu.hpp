#pragma once
/// \file SwiGLU activation, forward and backward (CPU): out = silu(gate) * up.
/// Source: Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202, eq. 6 (Swish_1 = SiLU);
/// as in Hugging Face's LlamaMLP, act_fn(gate_proj(x)) * up_proj(x).
#include <cmath>
#include <cstddef>

#include <loom/kernels/cpu/common.hpp>

namespace loom::kernels::cpu {

/// out (N,H) = silu(gate) * up, silu(g) = g / (1 + exp(-g)), per element, in the accumulator
/// type and rounded once. inp (N,2H): row n holds gate in [0,H) and up in [H,2H) (the fused
/// gate/up projection's two sections; with tensor parallelism, this rank's shard of each).
/// Cost: ~6 N H flops + N H exp.
template <class T>
void swiglu_forward(T* out, const T* inp, int N, int H) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* g = inp + std::size_t(n) * 2 * H;
    const T* u = g + H;
    T* o = out + std::size_t(n) * H;
    for (int h = 0; h < H; ++h) {
      const A gv = A(g[h]);
      o[h] = T(gv / (A(1) + std::exp(-gv)) * A(u[h]));
    }
  }
}

/// Backward of swiglu_forward: dinp (N,2H) = (overwrites: the projection's output has one
/// consumer), with s = sigmoid(gate):
///   d gate = dout * up * s * (1 + gate * (1 - s)),   d up = dout * gate * s.
/// dout (N,H); inp (N,2H) as given to forward. Cost: ~10 N H flops + N H exp.
template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int N, int H) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* g = inp + std::size_t(n) * 2 * H;
    const T* u = g + H;
    const T* d = dout + std::size_t(n) * H;
    T* dg = dinp + std::size_t(n) * 2 * H;
    T* du = dg + H;
    for (int h = 0; h < H; ++h) {
      const A gv = A(g[h]), uv = A(u[h]), dv = A(d[h]);
      const A s = A(1) / (A(1) + std::exp(-gv));
      dg[h] = T(dv * uv * s * (A(1) + gv * (A(1) - s)));
      du[h] = T(dv * gv * s);
    }
  }
}

}  // namespace loom::kernels::cpu
