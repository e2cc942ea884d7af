#pragma once
/// \file LayerNorm over the last dimension on the NPU: aclnnLayerNorm / aclnnLayerNormBackward.
/// Documented dtype rules (ops-nn docs, reference §2.5): the forward's mean/rstd outputs have the
/// INPUT dtype; the backward takes mean/rstd of any float dtype at least as wide as the input.
/// loom keeps the statistics in fp32 (the accumulator type, as the CPU kernels do): for 16-bit
/// storage the forward writes them to 16-bit scratch and aclnnInplaceCopy widens them (so they carry
/// 16-bit rounding); the backward reads the fp32 copies. outputMask order: (dx, dw, db).

#include <type_traits>

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// out (N,C) = (x - mean) * rstd * w + b; mean, rstd (N) in fp32 (=). eps = 1e-5 as the CPU kernel.
template <class T>
void layernorm_forward(ctx_t& ctx, T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b, int N,
                       int C, float eps = 1e-5f) {
  constexpr auto dt = dtype_of<T>();
  tensor x(ctx, inp, dt, {N, C}), y(ctx, out, dt, {N, C}), wt(ctx, w, dt, {C}), bt(ctx, b, dt, {C});
  int_array shape(ctx, {C});
  tensor mean32(ctx, mean, acl::dt_float, {N, 1}), rstd32(ctx, rstd, acl::dt_float, {N, 1});
  if constexpr (std::is_same_v<T, float>) {
    launch(ctx, "aclnnLayerNorm", ctx.api().aclnnLayerNormGetWorkspaceSize, ctx.api().aclnnLayerNorm, x, shape, wt, bt, double(eps), y, mean32, rstd32);
  } else {
    scratch<T> stats(ctx, 2 * std::size_t(N));
    tensor m(ctx, stats.data(), dt, {N, 1}), r(ctx, stats.data() + N, dt, {N, 1});
    launch(ctx, "aclnnLayerNorm", ctx.api().aclnnLayerNormGetWorkspaceSize, ctx.api().aclnnLayerNorm, x, shape, wt, bt, double(eps), y, m, r);
    copy(ctx, mean32, m);
    copy(ctx, rstd32, r);
  }
}

/// Backward: dinp (N,C) +=, dw (C) +=, db (C) += (the CPU write modes). aclnnLayerNormBackward
/// writes its outputs (=) into T scratch; aclnnInplaceAdd accumulates them — dw, db in their own
/// type G (fp32 for 16-bit T, widened first: accumulate()).
template <class T, class G = T>
void layernorm_backward(ctx_t& ctx, T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w, const float* mean,
                        const float* rstd, int N, int C) {
  constexpr auto dt = dtype_of<T>();
  const std::size_t NC = std::size_t(N) * std::size_t(C);
  scratch<T> tmp(ctx, NC + 2 * std::size_t(C));
  tensor g(ctx, dout, dt, {N, C}), x(ctx, inp, dt, {N, C}), wt(ctx, w, dt, {C});
  tensor m(ctx, mean, acl::dt_float, {N, 1}), r(ctx, rstd, acl::dt_float, {N, 1});
  tensor dx_t(ctx, tmp.data(), dt, {N, C}), dw_t(ctx, tmp.data() + NC, dt, {C}), db_t(ctx, tmp.data() + NC + C, dt, {C});
  int_array shape(ctx, {C});
  bool_array mask(ctx, {true, true, true});
  launch(ctx, "aclnnLayerNormBackward", ctx.api().aclnnLayerNormBackwardGetWorkspaceSize, ctx.api().aclnnLayerNormBackward, g, x, shape, m, r, wt, nullptr, mask, dx_t, dw_t, db_t);
  add_inplace(ctx, tensor(ctx, dinp, dt, {N, C}), dx_t);
  accumulate(ctx, dw, tmp.data() + NC, {C});
  accumulate(ctx, db, tmp.data() + NC + C, {C});
}

}  // namespace loom::kernels::ascend
