#pragma once
/// \file AdamW, the global gradient norm's sum of squares, and the non-finite check on the NPU.
///
///   adamw           aclnnApplyAdamWV2 (in CANN 8.1.RC1; A2/A3 only). Its documented update is
///                   torch.optim.AdamW's: m, v moments, bias correction with `step` (a one-element
///                   device tensor, > 0), theta -= lr * (mhat / (sqrt(vhat) + eps) + wd * theta).
///                   var/m/v/grad must share one dtype, so 16-bit parameters with fp32 moments are
///                   widened into fp32 scratch, updated, and narrowed back (aclnnInplaceCopy); a
///                   clip/unscale factor != 1 scales the gradient first (aclnnInplaceMuls).
///   sum_of_squares  a (1,n) x (n,1) aclnnMatmul of x with itself in fp32 (the NPU has no fp64;
///                   the CPU kernel accumulates in double). Reads the result back (synchronizes).
///   all_finite      aclnnIsFinite -> widened to fp32 -> minus 1 -> dot with itself = number of
///                   non-finite values (exact: sums of 0 and 1). Stock CANN has no AllFinite op
///                   (reference §2.5); ForeachNonFiniteCheckAndUnscale is absent from 8.1.RC1.

#include <type_traits>

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// One AdamW step over n parameters (see kernels::cpu::adamw_update for the contract): param, m, v
/// updated in place; grad read and multiplied by grad_scale; t is the 1-based step count.
template <class T, class M>
void adamw(ctx_t& ctx, T* param, M* m, M* v, const T* grad, std::size_t n, M lr, M beta1, M beta2, M eps,
           M weight_decay, M grad_scale, long t) {
  static_assert(std::is_same_v<M, T> || std::is_same_v<M, float>,
                "loom::kernels::ops<ascend, T>::adamw: the moments must have the parameters' type or float");
  if (n == 0) return;
  constexpr auto mt = dtype_of<M>();
  constexpr bool same = std::is_same_v<M, T>;
  const int64_t len = int64_t(n);
  const bool scale = float(grad_scale) != 1.0f;
  scratch<M> work(ctx, (same ? 0 : n) + (same && !scale ? 0 : n));
  M* p = same ? reinterpret_cast<M*>(param) : work.data();
  const M* g = same && !scale ? reinterpret_cast<const M*>(grad) : work.data() + (same ? 0 : n);
  if (!same) copy(ctx, tensor(ctx, p, mt, {len}), tensor(ctx, param, dtype_of<T>(), {len}));
  if (!(same && !scale)) {
    tensor gw(ctx, g, mt, {len});
    copy(ctx, gw, tensor(ctx, grad, dtype_of<T>(), {len}));
    if (scale) {
      scalar s(ctx, float(grad_scale));
      launch(ctx, "aclnnInplaceMuls", ctx.api().aclnnInplaceMulsGetWorkspaceSize, ctx.api().aclnnInplaceMuls, gw, s);
    }
  }
  scratch<float> step(ctx, 1);
  fill(ctx, step.data(), 1, float(t));
  tensor var(ctx, p, mt, {len}), mm(ctx, m, mt, {len}), vv(ctx, v, mt, {len}), gg(ctx, g, mt, {len}), st(ctx, step.data(), acl::dt_float, {1});
  launch(ctx, "aclnnApplyAdamWV2", ctx.api().aclnnApplyAdamWV2GetWorkspaceSize, ctx.api().aclnnApplyAdamWV2, var, mm, vv, nullptr, gg, st, float(lr), float(beta1), float(beta2), float(weight_decay), float(eps), false, false);
  if (!same) copy(ctx, tensor(ctx, param, dtype_of<T>(), {len}), var);
}

/// AdamW on fp32 master weights (mixed precision; see kernels::cpu::adamw_update_master):
/// grad (type G) is cast to fp32 if needed, aclnnApplyAdamWV2 updates master, m, v, and
/// param = T(master) (aclnnInplaceCopy casts).
template <class T, class M, class G>
void adamw_master(ctx_t& ctx, T* param, M* master, M* m, M* v, const G* grad, std::size_t n, M lr, M beta1, M beta2,
                  M eps, M weight_decay, M grad_scale, long t) {
  static_assert(std::is_same_v<M, float>, "loom::kernels::ops<ascend, T>::adamw_master: master weights must be float");
  if (n == 0) return;
  const int64_t len = int64_t(n);
  scratch<M> gw(ctx, std::is_same_v<G, M> ? 0 : n);
  const M* g = nullptr;
  if constexpr (std::is_same_v<G, M>) {
    g = grad;
  } else {
    copy(ctx, tensor(ctx, gw.data(), dtype_of<M>(), {len}), tensor(ctx, grad, dtype_of<G>(), {len}));
    g = gw.data();
  }
  adamw<M, M>(ctx, master, m, v, g, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  copy(ctx, tensor(ctx, param, dtype_of<T>(), {len}), tensor(ctx, master, dtype_of<M>(), {len}));
}

namespace detail {
/// x(1,n) . x(n,1) in fp32 with x given as an fp32 device vector; returns the host value.
inline float self_dot(ctx_t& ctx, const float* x, std::size_t n) {
  scratch<float> out(ctx, 1);
  tensor a(ctx, x, acl::dt_float, {1, int64_t(n)}), b(ctx, x, acl::dt_float, {int64_t(n), 1}), c(ctx, out.data(), acl::dt_float, {1, 1});
  launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, a, b, c, cube_math_type);
  return to_host(ctx, static_cast<const float*>(out.data()), 1)[0];
}
}  // namespace detail

/// Sum of squares of n values (fp32 accumulation on the NPU); synchronizes ctx.stream.
template <class T>
double sum_of_squares(ctx_t& ctx, const T* x, std::size_t n) {
  if (n == 0) return 0;
  if constexpr (std::is_same_v<T, float>) {
    return detail::self_dot(ctx, x, n);
  } else {
    scratch<float> x32(ctx, n);
    copy(ctx, tensor(ctx, x32.data(), acl::dt_float, {int64_t(n)}), tensor(ctx, x, dtype_of<T>(), {int64_t(n)}));
    return detail::self_dot(ctx, x32.data(), n);
  }
}

/// True when all n values are finite; synchronizes ctx.stream.
template <class T>
bool all_finite(ctx_t& ctx, const T* x, std::size_t n) {
  if (n == 0) return true;
  const int64_t len = int64_t(n);
  scratch<std::uint8_t> flags(ctx, n);
  scratch<float> f(ctx, n);
  tensor xt(ctx, x, dtype_of<T>(), {len}), fl(ctx, flags.data(), acl::dt_bool, {len}), ft(ctx, f.data(), acl::dt_float, {len});
  launch(ctx, "aclnnIsFinite", ctx.api().aclnnIsFiniteGetWorkspaceSize, ctx.api().aclnnIsFinite, xt, fl);
  copy(ctx, ft, fl);
  scalar minus_one(ctx, -1.0f), one(ctx, 1.0f);
  launch(ctx, "aclnnInplaceAdds", ctx.api().aclnnInplaceAddsGetWorkspaceSize, ctx.api().aclnnInplaceAdds, ft, minus_one, one);
  return detail::self_dot(ctx, f.data(), n) == 0.0f;
}

}  // namespace loom::kernels::ascend
