#pragma once
/// \file GELU (tanh form) and the residual add on the NPU: aclnnGeluV2 / aclnnGeluBackwardV2 /
/// aclnnAdd / aclnnInplaceAdd. Plain aclnnGelu's variant (erf or tanh) is unconfirmed (reference
/// §8), so loom uses the V2 operators whose `approximate` argument selects tanh explicitly
/// (GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// out = gelu_tanh(in), n elements; out =. aclnnGeluV2(approximate = 1, "tanh").
template <class T>
void gelu_forward(ctx_t& ctx, T* out, const T* in, std::size_t n) {
  constexpr auto dt = dtype_of<T>();
  tensor x(ctx, in, dt, {int64_t(n)}), y(ctx, out, dt, {int64_t(n)});
  launch(ctx, "aclnnGeluV2", ctx.api().aclnnGeluV2GetWorkspaceSize, ctx.api().aclnnGeluV2, x, /*approximate=*/1, y);
}

/// din = gelu_tanh'(in) * dout; din = (overwrites, as the CPU kernel). aclnnGeluBackwardV2("tanh").
template <class T>
void gelu_backward(ctx_t& ctx, T* din, const T* in, const T* dout, std::size_t n) {
  constexpr auto dt = dtype_of<T>();
  tensor x(ctx, in, dt, {int64_t(n)}), g(ctx, dout, dt, {int64_t(n)}), dx(ctx, din, dt, {int64_t(n)});
  char approximate[] = "tanh";  // the API takes a non-const, NUL-terminated char*
  launch(ctx, "aclnnGeluBackwardV2", ctx.api().aclnnGeluBackwardV2GetWorkspaceSize, ctx.api().aclnnGeluBackwardV2, g, x, approximate, dx);
}

/// out = a + b, n elements; out = and may alias a or b (then aclnnInplaceAdd: whether aclnnAdd
/// tolerates an output aliasing an input is not documented).
template <class T>
void residual_forward(ctx_t& ctx, T* out, const T* a, const T* b, std::size_t n) {
  constexpr auto dt = dtype_of<T>();
  const int64_t len = int64_t(n);
  if (out == a || out == b) {
    add_inplace(ctx, tensor(ctx, out, dt, {len}), tensor(ctx, out == a ? b : a, dt, {len}));
    return;
  }
  tensor x(ctx, a, dt, {len}), y(ctx, b, dt, {len}), z(ctx, out, dt, {len});
  scalar one(ctx, 1.0f);
  launch(ctx, "aclnnAdd", ctx.api().aclnnAddGetWorkspaceSize, ctx.api().aclnnAdd, x, y, one, z);
}

}  // namespace loom::kernels::ascend
