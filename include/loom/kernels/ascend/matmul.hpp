#pragma once
/// \file Linear layer y = x W^T + b on the NPU: aclnnAddmm / aclnnMatmul / aclnnInplaceAddmm.
/// W is stored (OC, C) like torch.nn.Linear; W^T is a strided view (dims (C, OC), strides (1, C)),
/// which aclnn accepts directly (no transpose copy). Accumulation inside the cube unit is fp32;
/// cubeMathType 0 (KEEP_DTYPE). Source: reference §2.5 "Matrix multiply".

#include <type_traits>

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// out (N,OC) = inp (N,C) w(OC,C)^T + bias (OC); bias may be null. out is written (=).
/// aclnnAddmm(self = bias broadcast over rows, beta = 1, alpha = 1), or aclnnMatmul without bias.
template <class T>
void matmul_forward(ctx_t& ctx, T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  constexpr auto dt = dtype_of<T>();
  tensor x(ctx, inp, dt, {N, C});
  tensor wt(ctx, w, dt, {C, OC}, {1, C});
  tensor y(ctx, out, dt, {N, OC});
  if (bias) {
    tensor b(ctx, bias, dt, {OC});
    scalar one(ctx, 1.0f);
    launch(ctx, "aclnnAddmm", ctx.api().aclnnAddmmGetWorkspaceSize, ctx.api().aclnnAddmm, b, x, wt, one, one, y, cube_math_type);
  } else {
    launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, x, wt, y, cube_math_type);
  }
}

/// Backward of matmul_forward (write modes as kernels::cpu::matmul_backward):
///   dinp (N,C)  += dout w   (= when accumulate_dinp is false; skipped when null)
///                 aclnnInplaceAddmm(dinp, dout, w, 1, 1) or aclnnMatmul(dout, w)
///   dw (OC,C)   += dout^T inp          aclnnInplaceAddmm(dw, dout^T view, inp, 1, 1)
///   dbias (OC)  += dout^T 1 (column sums of dout; skipped when null): a GEMV against a cached
///                 ones vector, aclnnInplaceAddmm(dbias as (OC,1), dout^T, ones (N,1), 1, 1)
/// G is the parameter-gradient type (kernels::gradient_t: fp32 for 16-bit T). When G != T the
/// GEMMs write T scratch (aclnnMatmul's output dtype is its inputs' dtype; the cube accumulates
/// in fp32 and rounds once) and accumulate() widens and adds it in G: Note [fp32 gradients on
/// Ascend] in kernels/ascend.hpp.
template <class T, class G = T>
void matmul_backward(ctx_t& ctx, T* dinp, G* dw, G* dbias, const T* dout, const T* inp, const T* w, int N, int C,
                     int OC, bool accumulate_dinp = true) {
  constexpr auto dt = dtype_of<T>();
  tensor dy(ctx, dout, dt, {N, OC});
  tensor dyt(ctx, dout, dt, {OC, N}, {1, OC});
  scalar one(ctx, 1.0f);
  if (dinp) {
    tensor wm(ctx, w, dt, {OC, C});
    tensor dx(ctx, dinp, dt, {N, C});
    if (accumulate_dinp)
      launch(ctx, "aclnnInplaceAddmm", ctx.api().aclnnInplaceAddmmGetWorkspaceSize, ctx.api().aclnnInplaceAddmm, dx, dy, wm, one, one, cube_math_type);
    else
      launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, dy, wm, dx, cube_math_type);
  }
  tensor x(ctx, inp, dt, {N, C});
  if constexpr (std::is_same_v<G, T>) {
    tensor dW(ctx, dw, dt, {OC, C});
    launch(ctx, "aclnnInplaceAddmm", ctx.api().aclnnInplaceAddmmGetWorkspaceSize, ctx.api().aclnnInplaceAddmm, dW, dyt, x, one, one, cube_math_type);
  } else {
    scratch<T> part(ctx, std::size_t(OC) * std::size_t(C));
    tensor dW(ctx, part.data(), dt, {OC, C});
    launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, dyt, x, dW, cube_math_type);
    accumulate(ctx, dw, part.data(), {OC, C});
  }
  if (dbias) {
    tensor e(ctx, ones<T>(ctx, std::size_t(N)), dt, {N, 1});
    if constexpr (std::is_same_v<G, T>) {
      tensor db(ctx, dbias, dt, {OC, 1});
      launch(ctx, "aclnnInplaceAddmm", ctx.api().aclnnInplaceAddmmGetWorkspaceSize, ctx.api().aclnnInplaceAddmm, db, dyt, e, one, one, cube_math_type);
    } else {
      scratch<T> part(ctx, std::size_t(OC));
      tensor db(ctx, part.data(), dt, {OC, 1});
      launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, dyt, e, db, cube_math_type);
      accumulate(ctx, dbias, part.data(), {OC});
    }
  }
}

}  // namespace loom::kernels::ascend
