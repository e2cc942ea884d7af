#pragma once
/// \file Fused softmax cross-entropy on the NPU: aclnnCrossEntropyLoss / aclnnCrossEntropyLossGrad.
///
/// Semantics are those of kernels::cpu::crossentropy_forward_backward. The NPU path:
///   1. the (N, V) real-vocabulary columns of logits (N, Vp) are copied into an fp32 scratch with
///      aclnnInplaceCopy (strided read + cast; skipped for fp32 with V == Vp);
///   2. aclnnCrossEntropyLoss(reduction "none", ignoreIndex -1) writes losses (N, fp32) and the
///      log-probabilities (N, V) that the gradient needs; zlossOut and lseForZlossOut must be
///      passed even though z-loss is unsupported (a public caller reports NULL is rejected);
///   3. with write_dlogits: aclnnCrossEntropyLossGrad(gradLoss = grad_scale per row) gives dlogits
///      (N, V) in fp32; logits are zeroed (padding columns) and the gradient is copied back with a
///      cast into the strided (N, V) view;
///   4. the loss sum is read back to the host (this synchronizes the stream — the interface returns
///      a host value) and added in double, in row order.
/// Computing in fp32 matches the CPU kernel, which accumulates 16-bit logits in float.
/// Caveat (reference §2.5 caller note): a public wrapper reports that CANN gathers with the raw
/// label and faults for labels outside [0, C); loom passes ignore_index = -1 as documented. If real
/// hardware faults on it, replace -1 targets by 0 and mask those rows (not needed in emulation).

#include <type_traits>

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// See the file comment. logits (N,Vp) read, overwritten with dlogits when write_dlogits;
/// losses (N) fp32 =; targets (N) int32 in [0,V) or -1. Returns the sum of the losses.
template <class T>
float crossentropy(ctx_t& ctx, T* logits, float* losses, const std::int32_t* targets, int N, int V, int Vp,
                   bool write_dlogits, float grad_scale) {
  constexpr auto dt = dtype_of<T>();
  const bool in_place = std::is_same_v<T, float> && V == Vp;
  const std::size_t NV = std::size_t(N) * std::size_t(V);
  scratch<float> work(ctx, (in_place ? 0 : NV) + NV + 3 * std::size_t(N));
  float* x32 = in_place ? reinterpret_cast<float*>(logits) : work.data();
  float* logp = work.data() + (in_place ? 0 : NV);
  float* aux = logp + NV;  // zloss (N), lse (N), gradLoss (N)
  tensor logits_view(ctx, logits, dt, {N, V}, {Vp, 1});
  tensor x(ctx, x32, acl::dt_float, {N, V});
  if (!in_place) copy(ctx, x, logits_view);
  tensor tgt(ctx, targets, acl::dt_int32, {N}), loss(ctx, losses, acl::dt_float, {N}), lp(ctx, logp, acl::dt_float, {N, V});
  tensor zloss(ctx, aux, acl::dt_float, {N}), lse(ctx, aux + N, acl::dt_float, {N});
  char none[] = "none";
  constexpr int64_t ignore_index = -1;
  launch(ctx, "aclnnCrossEntropyLoss", ctx.api().aclnnCrossEntropyLossGetWorkspaceSize, ctx.api().aclnnCrossEntropyLoss, x, tgt, nullptr, none, ignore_index, 0.0, 0.0, false, loss, lp, zloss, lse);
  if (write_dlogits) {
    fill(ctx, aux + 2 * N, std::size_t(N), grad_scale);
    tensor gl(ctx, aux + 2 * N, acl::dt_float, {N});
    launch(ctx, "aclnnCrossEntropyLossGrad", ctx.api().aclnnCrossEntropyLossGradGetWorkspaceSize, ctx.api().aclnnCrossEntropyLossGrad, gl, lp, tgt, nullptr, nullptr, nullptr, none, ignore_index, 0.0, 0.0, x);
    if (!in_place) {
      device::ascend::memset(logits, 0, std::size_t(N) * std::size_t(Vp) * sizeof(T), ctx.stream);
      copy(ctx, logits_view, x);
    }
  }
  const auto host = to_host(ctx, static_cast<const float*>(losses), std::size_t(N));
  double total = 0;
  for (float l : host) total += l;
  return float(total);
}

}  // namespace loom::kernels::ascend
