#pragma once
/// \file The Llama block's RMSNorm and SwiGLU on the NPU: aclnnRmsNorm / aclnnRmsNormGrad and
/// aclnnSwiGlu / aclnnSwiGluGrad (hicann/ops-nn v9.0.0 docs, prototypes declared in
/// device/detail/acl_api.hpp where CANN's generated headers are absent).
/// Documented rules used here (A2/A3 training series): RmsNorm's gamma has x's dtype (or FLOAT32),
/// its rstd output is FLOAT32 with x's rank and 1 in the normalised dimension, epsilon a double
/// (narrowed to float by the kernel); RmsNormGrad takes that rstd, writes dx in x's dtype (=) and
/// dgamma in FLOAT32 (=). SwiGlu splits the `dim` axis into [A | B] and writes silu(A) * B; loom's
/// fc output rows are [gate | up], so dim = -1. SwiGluGrad writes (=) both halves of dx and
/// documents "shape not 64-byte aligned is not supported": the fc output row (2 H elements) must
/// be a multiple of 64 bytes (the emulation enforces it; this kernel says so first).
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

}  // namespace loom::kernels::ascend
