#pragma once
/// \file Fused softmax cross-entropy on the NPU: aclnnCrossEntropyLoss / aclnnCrossEntropyLossGrad.
///
/// Semantics are those of kernels::cpu::crossentropy_forward_backward: targets in [0, V), or -1
/// (cpu::ignore_index) for a row that contributes no loss and no gradient.
///
/// The operators' rules on Atlas A2/A3 (hicann/ops-nn v9.0.0, loss/cross_entropy_loss and
/// loss/cross_entropy_loss_grad; the host emulation enforces each, see docs/ascend.md):
///   * target must be INT64: op_host/cross_entropy_loss_def.cpp and cross_entropy_loss_grad_def.cpp
///     register only DT_INT64 for "target" on ascend910b and ascend910_93 (INT32 only on
///     ascend950, whose extra configuration the aclnnCrossEntropyLoss.md table merges into
///     "INT32, INT64"). An INT32 target is refused in phase 1 with 161002.
///   * target values lie in [0, C), or equal ignoreIndex "when ignoreIndex is specified"
///     (docs/aclnnCrossEntropyLoss.md, target row); the docs never say that a negative
///     ignoreIndex specifies anything, so loom must not pass -1 targets with ignoreIndex -1.
///   * N < 200,000 rows per call (README.md of both operators, "input第零维N需满足N<200000",
///     hicann/ops-nn commit e11fe07f); more is refused in phase 1 with 561002.
///
/// How loom meets them — Note [shifted vocabulary]: the operators see C = V + 1 classes, column 0
/// being a padding class that no real target uses, and real class v in column v + 1:
///   x'   (N, V+1) fp32 = [ -1e30 | logits[:, 0:V] ]      (aclnnInplaceCopy: strided read + cast)
///   t'   (N) INT64     = targets + 1                     (aclnnInplaceCopy cast, aclnnInplaceAdds)
///   ignoreIndex        = 0
/// so an ignored target (-1) becomes 0 = ignoreIndex, every target lies in [0, C), and ignoreIndex
/// is a non-negative class that real data can never hit. Column 0's logit, -1e30, is finite (no
/// inf * 0 = NaN in any masked product) and adds exp(-1e30 - max) = 0 to every softmax sum, so
/// losses and log-probabilities of the real columns are exactly those over V classes, and its
/// gradient softmax(x')_0 = 0 is discarded. The mapping stays on the device (no host round trip):
/// the padding class is column 0 rather than column V because t + 1 maps -1 to it with one add,
/// while -1 -> V would need a compare-and-select the reference does not list.
/// Rows are processed in calls of at most 199,999 rows (reduction "none" makes rows independent).
///
/// Steps per call of at most max_rows rows:
///   1. aclnnCrossEntropyLoss(reduction "none", ignoreIndex 0) writes losses (N, fp32) and the
///      log-probabilities (N, V+1) the gradient needs; zlossOut and lseForZlossOut must be passed
///      though z-loss is unsupported ("must be passed but not involved in the computation", docs);
///   2. with write_dlogits: aclnnCrossEntropyLossGrad(gradLoss = grad_scale per row) gives dlogits
///      (N, V+1) in fp32; logits are zeroed (padding columns V..Vp) and columns 1..V are copied
///      back with a cast into the strided (N, V) view;
///   3. the loss sum is read back to the host (this synchronizes the stream — the interface returns
///      a host value) and added in double, in row order; or, with host_losses, the row losses are
///      copied to that pinned host array on the stream and 0 is returned without a wait (the
///      caller adds them, in the same order, after it synchronizes: train::trainer reads
///      them with the gradient norm, one wait per step).
/// Computing in fp32 matches the CPU kernel, which accumulates 16-bit logits in float.
/// Scratch: (N (V+1) + N (V+1) + 3 N) floats + N int64 on the device pool.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// Rows per aclnnCrossEntropyLoss[Grad] call: N must stay below 200,000 (see the file comment).
inline constexpr int crossentropy_max_rows = 199999;
/// The logit of the padding class of Note [shifted vocabulary]: finite, exp() underflows to 0.
inline constexpr float crossentropy_pad_logit = -1.0e30f;

/// See the file comment. logits (N,Vp) of T, read, and overwritten with dlogits when
/// write_dlogits (padding columns V..Vp zeroed); losses (N) fp32 =; targets (N) int32 in [0,V) or
/// -1, device memory. Returns the sum of the losses; with host_losses (N floats of pinned host
/// memory, 64-byte aligned; ascend::allocate_host) the losses are copied there asynchronously and
/// the return value is 0. Throws device_error with the operator's status (161002 argument
/// rejected, 561002 shape not supported) or the runtime's code.
template <class T>
float crossentropy(ctx_t& ctx, T* logits, float* losses, const std::int32_t* targets, int N, int V, int Vp,
                   bool write_dlogits, float grad_scale, float* host_losses = nullptr) {
  constexpr auto dt = dtype_of<T>();
  const int64_t C = int64_t(V) + 1;  // Note [shifted vocabulary]
  const int rows_max = std::min(N, crossentropy_max_rows);
  const std::size_t RC = std::size_t(rows_max) * std::size_t(C);
  scratch<float> work(ctx, 2 * RC + 3 * std::size_t(rows_max));
  scratch<std::int64_t> shifted(ctx, std::size_t(rows_max));
  float* x32 = work.data();
  float* logp = x32 + RC;
  float* aux = logp + RC;  // zloss (n), lse (n), gradLoss (n)
  char none[] = "none";
  constexpr int64_t ignore_index = 0;
  const scalar one(ctx, std::int64_t(1));
  for (int r0 = 0; r0 < N; r0 += rows_max) {
    const int n = std::min(rows_max, N - r0);
    T* lg = logits + std::size_t(r0) * std::size_t(Vp);
    // x' = [pad | logits]: everything the pad logit, then the real columns over it
    fill(ctx, x32, std::size_t(n) * std::size_t(C), crossentropy_pad_logit);
    tensor logits_view(ctx, lg, dt, {n, V}, {Vp, 1});
    tensor x_real(ctx, x32 + 1, acl::dt_float, {n, V}, {C, 1});
    copy(ctx, x_real, logits_view);
    // t' = targets + 1 (int32 -> int64 by aclnnInplaceCopy, then + 1 with an INT64 alpha)
    tensor t32(ctx, targets + r0, acl::dt_int32, {n}), tgt(ctx, shifted.data(), acl::dt_int64, {n});
    copy(ctx, tgt, t32);
    launch(ctx, "aclnnInplaceAdds", ctx.api().aclnnInplaceAddsGetWorkspaceSize, ctx.api().aclnnInplaceAdds, tgt, one, one);

    tensor x(ctx, x32, acl::dt_float, {n, C}), lp(ctx, logp, acl::dt_float, {n, C});
    tensor loss(ctx, losses + r0, acl::dt_float, {n});
    tensor zloss(ctx, aux, acl::dt_float, {n}), lse(ctx, aux + n, acl::dt_float, {n});
    launch(ctx, "aclnnCrossEntropyLoss", ctx.api().aclnnCrossEntropyLossGetWorkspaceSize,
           ctx.api().aclnnCrossEntropyLoss, x, tgt, nullptr, none, ignore_index, 0.0, 0.0, false, loss, lp, zloss, lse);
    if (write_dlogits) {
      fill(ctx, aux + 2 * n, std::size_t(n), grad_scale);
      tensor gl(ctx, aux + 2 * n, acl::dt_float, {n});
      launch(ctx, "aclnnCrossEntropyLossGrad", ctx.api().aclnnCrossEntropyLossGradGetWorkspaceSize,
             ctx.api().aclnnCrossEntropyLossGrad, gl, lp, tgt, nullptr, nullptr, nullptr, none, ignore_index, 0.0, 0.0, x);
      device::ascend::memset(lg, 0, std::size_t(n) * std::size_t(Vp) * sizeof(T), ctx.stream);
      copy(ctx, logits_view, x_real);
    }
  }
  if (host_losses) {  // staged into a pool block: an asynchronous copy needs a 64-byte aligned device side
    scratch<float> staged(ctx, std::size_t(N));
    copy(ctx, tensor(ctx, staged.data(), acl::dt_float, {N}), tensor(ctx, losses, acl::dt_float, {N}));
    device::ascend::copy_to_host(host_losses, staged.data(), std::size_t(N) * sizeof(float), ctx.stream);
    return 0.0f;
  }
  const auto host = to_host(ctx, static_cast<const float*>(losses), std::size_t(N));
  double total = 0;
  for (float l : host) total += l;
  return float(total);
}

}  // namespace loom::kernels::ascend
