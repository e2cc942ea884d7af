#pragma once
/// \file The Llama block's RMSNorm, SwiGLU and rotary embedding on the NPU: aclnnRmsNorm /
/// aclnnRmsNormGrad, aclnnSwiGlu / aclnnSwiGluGrad (hicann/ops-nn v9.0.0 docs) and
/// aclnnRotaryPositionEmbedding / aclnnRotaryPositionEmbeddingGrad (hicann/ops-transformer v9.0.0
/// docs; prototypes declared in device/detail/acl_api.hpp where CANN's generated headers are
/// absent).
/// Documented rules used here (A2/A3 training series): RmsNorm's gamma has x's dtype (or FLOAT32),
/// its rstd output is FLOAT32 with x's rank and 1 in the normalised dimension, epsilon a double
/// (narrowed to float by the kernel); RmsNormGrad takes that rstd, writes dx in x's dtype (=) and
/// dgamma in FLOAT32 (=). SwiGlu splits the `dim` axis into [A | B] and writes silu(A) * B; loom's
/// fc output rows are [gate | up], so dim = -1. SwiGluGrad writes (=) both halves of dx and
/// documents "shape not 64-byte aligned is not supported": the fc output row (2 H elements) must
/// be a multiple of 64 bytes (the emulation enforces it; this kernel says so first).
/// RotaryPositionEmbedding, mode 0 ("half": rotate_half, Hugging Face's Llama): x (B, S, N, D)
/// as BSND, cos and sin of x's dtype (documented: one dtype for all three) as (1, S, 1, D) with
/// the full-width layout cat(freqs, freqs), out 4-D and contiguous; D even and below 896. loom's
/// heads sit inside fused qkv rows (stride ld): x is read as a strided view (documented:
/// non-contiguous x allowed), out goes to scratch and is copied back. The backward passes no x
/// (no dcos/dsin: cos and sin are constants) and, as the document's example does, empty dcos/dsin
/// tensors, which the operator requires.
#include <string>

#include <loom/core/error.hpp>
#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// out (N,C) = x * rstd * w; rstd (N) fp32 (=), rstd = 1/sqrt(mean(x^2) + eps).
template <class T>
void rmsnorm_forward(ctx_t& ctx, T* out, float* rstd, const T* inp, const T* w, int N, int C, float eps) {
  constexpr auto dt = dtype_of<T>();
  tensor x(ctx, inp, dt, {N, C}), y(ctx, out, dt, {N, C}), g(ctx, w, dt, {C}), r(ctx, rstd, acl::dt_float, {N, 1});
  launch(ctx, "aclnnRmsNorm", ctx.api().aclnnRmsNormGetWorkspaceSize, ctx.api().aclnnRmsNorm, x, g, double(eps), y, r);
}

/// Backward: dinp (N,C) +=, dw (C) += in the gradient type G (the CPU write modes). The operator
/// writes dx (=) into T scratch and dgamma (=) into fp32 scratch; aclnnInplaceAdd accumulates.
template <class T, class G = T>
void rmsnorm_backward(ctx_t& ctx, T* dinp, G* dw, const T* dout, const T* inp, const T* w, const float* rstd, int N,
                      int C) {
  constexpr auto dt = dtype_of<T>();
  scratch<T> dx(ctx, std::size_t(N) * std::size_t(C));
  scratch<float> dg(ctx, std::size_t(C));
  tensor dy(ctx, dout, dt, {N, C}), x(ctx, inp, dt, {N, C}), g(ctx, w, dt, {C}), r(ctx, rstd, acl::dt_float, {N, 1});
  tensor dx_t(ctx, dx.data(), dt, {N, C}), dg_t(ctx, dg.data(), acl::dt_float, {C});
  launch(ctx, "aclnnRmsNormGrad", ctx.api().aclnnRmsNormGradGetWorkspaceSize, ctx.api().aclnnRmsNormGrad, dy, x, r, g,
         dx_t, dg_t);
  add_inplace(ctx, tensor(ctx, dinp, dt, {N, C}), dx_t);
  accumulate(ctx, dw, dg.data(), {C});
}

/// out (N,H) = silu(gate) * up for inp (N, 2H) rows [gate | up].
template <class T>
void swiglu_forward(ctx_t& ctx, T* out, const T* inp, int N, int H) {
  constexpr auto dt = dtype_of<T>();
  tensor x(ctx, inp, dt, {N, 2 * H}), y(ctx, out, dt, {N, H});
  launch(ctx, "aclnnSwiGlu", ctx.api().aclnnSwiGluGetWorkspaceSize, ctx.api().aclnnSwiGlu, x, int64_t(-1), y);
}

/// dinp (N, 2H) = d(silu(gate) * up) from dout (N, H) (=). Throws loom::input_error when a row of
/// 2H elements is not a multiple of 64 bytes (aclnnSwiGluGrad's documented alignment).
template <class T>
void swiglu_backward(ctx_t& ctx, T* dinp, const T* dout, const T* inp, int N, int H) {
  if ((2 * std::size_t(H) * sizeof(T)) % 64 != 0)
    throw input_error("SwiGLU backward on Ascend: the fc output row of 2 x " + std::to_string(H) + " elements is " +
                      std::to_string(2 * std::size_t(H) * sizeof(T)) + " bytes; aclnnSwiGluGrad documents shapes "
                      "that are multiples of 64 bytes only: choose d_ff / TP a multiple of " +
                      std::to_string(32 / sizeof(T)));
  constexpr auto dt = dtype_of<T>();
  tensor g(ctx, dout, dt, {N, H}), x(ctx, inp, dt, {N, 2 * H}), dx(ctx, dinp, dt, {N, 2 * H});
  launch(ctx, "aclnnSwiGluGrad", ctx.api().aclnnSwiGluGradGetWorkspaceSize, ctx.api().aclnnSwiGluGrad, g, x, int64_t(-1),
         dx);
}

namespace detail {
/// The (S, D) cos and sin tables in T, [cos | sin], from loom's fp32 (S, D/2) halves: each half
/// is written twice (cat(freqs, freqs)), narrowed by aclnnInplaceCopy.
template <class T>
void rope_tables(ctx_t& ctx, T* out, const float* cos, const float* sin, int S, int hd) {
  constexpr auto dt = dtype_of<T>();
  const int64_t half = hd / 2;
  for (int which = 0; which < 2; ++which) {
    const float* src = which == 0 ? cos : sin;
    T* dst = out + std::size_t(which) * std::size_t(S) * std::size_t(hd);
    for (int part = 0; part < 2; ++part)
      copy(ctx, tensor(ctx, dst + part * half, dt, {S, half}, {hd, 1}), tensor(ctx, src, acl::dt_float, {S, half}));
  }
}

/// The frame rope_forward and rope_backward share: checks hd, builds the (1, Tn, 1, hd) tables
/// and a contiguous (B, Tn, heads, hd) output in scratch, calls f(X, C, S, O, scratch) with X the
/// strided heads of x, then copies O back into x. `op` names the operator in the error.
template <class T, class F>
void rope_in_place(ctx_t& ctx, T* x, const float* cos, const float* sin, int B, int Tn, int heads, int hd,
                   std::size_t ld, const char* op, F&& f) {
  if (hd % 2 != 0 || hd >= 896)
    throw input_error("rotary embedding on Ascend: head size " + std::to_string(hd) + "; " + op +
                      " documents an even D below 896 on A2/A3");
  constexpr auto dt = dtype_of<T>();
  const std::size_t SD = std::size_t(Tn) * hd, n = std::size_t(B) * heads * SD;
  scratch<T> work(ctx, 2 * SD + n);
  rope_tables(ctx, work.data(), cos, sin, Tn, hd);
  const int64_t L = int64_t(ld);
  tensor X(ctx, x, dt, {B, Tn, heads, hd}, {Tn * L, L, hd, 1}), O(ctx, work.data() + 2 * SD, dt, {B, Tn, heads, hd});
  tensor C(ctx, work.data(), dt, {1, Tn, 1, hd}), S(ctx, work.data() + SD, dt, {1, Tn, 1, hd});
  f(X, C, S, O, work.data());
  copy(ctx, X, O);
}
}  // namespace detail

/// Rotates `heads` heads of hd values in place in every (B*Tn) row of x (row stride ld), by the
/// angles of the row's position: cos, sin are loom's fp32 (>= Tn, hd/2) tables
/// (kernels/rope_table.hpp) in device memory (aclnnRotaryPositionEmbedding, mode 0 = rotate-half).
/// Throws loom::input_error for an odd hd or hd >= 896.
template <class T>
void rope_forward(ctx_t& ctx, T* x, const float* cos, const float* sin, int B, int Tn, int heads, int hd, std::size_t ld) {
  detail::rope_in_place(ctx, x, cos, sin, B, Tn, heads, hd, ld, "aclnnRotaryPositionEmbedding",
                        [&](tensor& X, tensor& C, tensor& S, tensor& O, T*) {
                          launch(ctx, "aclnnRotaryPositionEmbedding", ctx.api().aclnnRotaryPositionEmbeddingGetWorkspaceSize,
                                 ctx.api().aclnnRotaryPositionEmbedding, X, C, S, int64_t(0), O);
                        });
}

/// Backward of rope_forward, in place on dx (same layout and tables): the transposed rotation
/// (aclnnRotaryPositionEmbeddingGrad without x, so dcos/dsin are empty tensors).
template <class T>
void rope_backward(ctx_t& ctx, T* dx, const float* cos, const float* sin, int B, int Tn, int heads, int hd,
                   std::size_t ld) {
  detail::rope_in_place(ctx, dx, cos, sin, B, Tn, heads, hd, ld, "aclnnRotaryPositionEmbeddingGrad",
                        [&](tensor& DY, tensor& C, tensor& S, tensor& DX, T* base) {
                          constexpr auto dt = dtype_of<T>();
                          tensor none_c(ctx, base, dt, {1, 1, 1, 0}), none_s(ctx, base, dt, {1, 1, 1, 0});
                          launch(ctx, "aclnnRotaryPositionEmbeddingGrad",
                                 ctx.api().aclnnRotaryPositionEmbeddingGradGetWorkspaceSize,
                                 ctx.api().aclnnRotaryPositionEmbeddingGrad, DY, C, S, nullptr, int64_t(0), DX, none_c,
                                 none_s);
                        });
}

}  // namespace loom::kernels::ascend
