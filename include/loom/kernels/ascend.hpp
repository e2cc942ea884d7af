#pragma once
/// \file The Ascend specializations of kernels::ops and kernels::attention (aclnn operators).
///
/// Same members, arguments and write modes as kernels::ops<device::cpu, T> (kernels/cpu.hpp),
/// taking context<device::ascend>&; every pointer is NPU memory and every call is ordered on
/// ctx.stream. Members returning a host value (crossentropy unless given host_losses,
/// sum_of_squares, all_finite) synchronize the stream. One member more than the CPU's:
/// split_windows (the trainer's batches are split on the NPU). Storage types: float, Eigen::half, Eigen::bfloat16 — what the aclnn
/// operators document. Any other T compiles until a member is used; using one is a compile error
/// naming the member, its aclnn operator and the type (static_assert in each member). A model's
/// (operator, precision) pairs are checked once more by kernels::coverage (kernels/ascend/
/// coverage.hpp): there fp32 matmul needs the opt-in precision::fp32_ascend_matmul.
/// Which aclnn call implements which member: docs/ascend.md, and each kernels/ascend/*.hpp file.
#include <cstddef>
#include <cstdint>

#include <loom/device/ascend.hpp>
#include <loom/kernels/ascend/attention_fused.hpp>
#include <loom/kernels/ascend/common.hpp>
#include <loom/kernels/ascend/coverage.hpp>
#include <loom/kernels/ascend/crossentropy.hpp>
#include <loom/kernels/ascend/elementwise.hpp>
#include <loom/kernels/ascend/encoder.hpp>
#include <loom/kernels/ascend/layernorm.hpp>
#include <loom/kernels/ascend/llama.hpp>
#include <loom/kernels/ascend/matmul.hpp>
#include <loom/kernels/ascend/optimizer.hpp>
#include <loom/kernels/ascend/vocab_parallel.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels {

/// Note [fp32 gradients on Ascend]. As on the CPU, parameter gradients have the type
/// kernels::gradient_t<ascend, P> = P::master (the primary template): fp32 for bf16/fp16 storage,
/// so accumulation over micro-batches, the gradient norm and the optimizer read fp32 (the design
/// of kernels/cpu/matmul.hpp's Note [gradient precision]; Megatron's fp32 main_grad). The
/// members below that write parameter gradients (encoder_backward, layernorm_backward,
/// matmul_backward) take them as G*. aclnn's GEMM, LayerNormBackward and EmbeddingDenseBackward
/// document outputs of their inputs' dtype (reference §2.5; no documented fp32 output for 16-bit
/// inputs, and BF16xFP32 mixes "cannot be deduced"), so for G != T each micro-batch's
/// contribution is formed in T scratch — the cube accumulates in fp32 and rounds once — then
/// widened with aclnnInplaceCopy and added in fp32 (ascend::accumulate). Difference from the CPU:
/// that one rounding of each micro-batch's contribution to T (relative 2^-9 for bf16); the sum
/// over micro-batches does not round. Costs per call: a T and an fp32 scratch of the gradient's
/// size and two extra elementwise launches.

template <class T>
struct ops<device::ascend, T> {
  using ctx_t = context<device::ascend>;
  using acc = float;  ///< statistics, losses and reductions are fp32 on the NPU

  static void encoder_forward(ctx_t& ctx, T* out, const std::int32_t* tok, const T* wte, const T* wpe, int B, int Tn,
                              int C) {
    const kernel_scope k(ctx.hook, "encoder_forward");
    static_assert(ascend::supports_v<ascend::op::embedding, T>,
                  "loom::kernels::ops<ascend, T>::encoder_forward: aclnnEmbedding has no kernel for this storage type "
                  "on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::encoder_forward(ctx, out, tok, wte, wpe, B, Tn, C);
  }
  /// dwte, dwpe +=, in the gradient type G (Note [fp32 gradients on Ascend]).
  template <class G>
  static void encoder_backward(ctx_t& ctx, G* dwte, G* dwpe, const T* dout, const std::int32_t* tok, int B, int Tn,
                               int C) {
    const kernel_scope k(ctx.hook, "encoder_backward");
    static_assert(ascend::supports_v<ascend::op::embedding, T>,
                  "loom::kernels::ops<ascend, T>::encoder_backward: aclnnEmbeddingDenseBackward has no kernel for this "
                  "storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::encoder_backward(ctx, dwte, dwpe, dout, tok, B, Tn, C);
  }
  static void layernorm_forward(ctx_t& ctx, T* out, acc* mean, acc* rstd, const T* in, const T* w, const T* b, int N,
                                int C) {
    const kernel_scope k(ctx.hook, "layernorm_forward");
    static_assert(ascend::supports_v<ascend::op::layernorm, T>,
                  "loom::kernels::ops<ascend, T>::layernorm_forward: aclnnLayerNorm has no kernel for this storage "
                  "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::layernorm_forward(ctx, out, mean, rstd, in, w, b, N, C);
  }
  /// din +=; dw, db += in the gradient type G (Note [fp32 gradients on Ascend]).
  template <class G>
  static void layernorm_backward(ctx_t& ctx, T* din, G* dw, G* db, const T* dout, const T* in, const T* w,
                                 const acc* mean, const acc* rstd, int N, int C) {
    const kernel_scope k(ctx.hook, "layernorm_backward");
    static_assert(ascend::supports_v<ascend::op::layernorm, T>,
                  "loom::kernels::ops<ascend, T>::layernorm_backward: aclnnLayerNormBackward has no kernel for this "
                  "storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::layernorm_backward(ctx, din, dw, db, dout, in, w, mean, rstd, N, C);
  }
  static void matmul_forward(ctx_t& ctx, T* out, const T* in, const T* w, const T* bias, int N, int C, int OC) {
    const kernel_scope k(ctx.hook, "matmul_forward");
    static_assert(ascend::supports_v<ascend::op::matmul, T>,
                  "loom::kernels::ops<ascend, T>::matmul_forward: aclnnMatmul/aclnnAddmm have no kernel for this "
                  "storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::matmul_forward(ctx, out, in, w, bias, N, C, OC);
  }
  /// din += (or =); dw, dbias += in the gradient type G (Note [fp32 gradients on Ascend]).
  template <class G>
  static void matmul_backward(ctx_t& ctx, T* din, G* dw, G* dbias, const T* dout, const T* in, const T* w, int N,
                              int C, int OC, bool accumulate_din) {
    const kernel_scope k(ctx.hook, "matmul_backward");
    static_assert(ascend::supports_v<ascend::op::matmul, T>,
                  "loom::kernels::ops<ascend, T>::matmul_backward: aclnnMatmul/aclnnInplaceAddmm have no kernel for "
                  "this storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::matmul_backward(ctx, din, dw, dbias, dout, in, w, N, C, OC, accumulate_din);
  }
  static void gelu_forward(ctx_t& ctx, T* out, const T* in, std::size_t n) {
    const kernel_scope k(ctx.hook, "gelu_forward");
    static_assert(ascend::supports_v<ascend::op::gelu, T>,
                  "loom::kernels::ops<ascend, T>::gelu_forward: aclnnGeluV2 has no kernel for this storage type on "
                  "Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::gelu_forward(ctx, out, in, n);
  }
  static void gelu_backward(ctx_t& ctx, T* din, const T* in, const T* dout, std::size_t n) {
    const kernel_scope k(ctx.hook, "gelu_backward");
    static_assert(ascend::supports_v<ascend::op::gelu, T>,
                  "loom::kernels::ops<ascend, T>::gelu_backward: aclnnGeluBackwardV2 has no kernel for this storage "
                  "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::gelu_backward(ctx, din, in, dout, n);
  }
  // The Llama block's RMSNorm, SwiGLU and rotary embedding (kernels/ascend/llama.hpp).
  static void rmsnorm_forward(ctx_t& ctx, T* out, acc* rstd, const T* in, const T* w, int N, int C, acc eps) {
    const kernel_scope k(ctx.hook, "rmsnorm_forward");
    static_assert(ascend::supports_v<ascend::op::rmsnorm, T>,
                  "loom::kernels::ops<ascend, T>::rmsnorm_forward: aclnnRmsNorm has no kernel for this storage type "
                  "on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::rmsnorm_forward(ctx, out, rstd, in, w, N, C, eps);
  }
  /// din +=; dw += in the gradient type G (Note [fp32 gradients on Ascend]).
  template <class G>
  static void rmsnorm_backward(ctx_t& ctx, T* din, G* dw, const T* dout, const T* in, const T* w, const acc* rstd, int N,
                               int C) {
    const kernel_scope k(ctx.hook, "rmsnorm_backward");
    static_assert(ascend::supports_v<ascend::op::rmsnorm, T>,
                  "loom::kernels::ops<ascend, T>::rmsnorm_backward: aclnnRmsNormGrad has no kernel for this storage "
                  "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::rmsnorm_backward(ctx, din, dw, dout, in, w, rstd, N, C);
  }
  static void swiglu_forward(ctx_t& ctx, T* out, const T* in, int N, int H) {
    const kernel_scope k(ctx.hook, "swiglu_forward");
    static_assert(ascend::supports_v<ascend::op::swiglu, T>,
                  "loom::kernels::ops<ascend, T>::swiglu_forward: aclnnSwiGlu has no kernel for this storage type on "
                  "Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::swiglu_forward(ctx, out, in, N, H);
  }
  static void swiglu_backward(ctx_t& ctx, T* din, const T* dout, const T* in, int N, int H) {
    const kernel_scope k(ctx.hook, "swiglu_backward");
    static_assert(ascend::supports_v<ascend::op::swiglu, T>,
                  "loom::kernels::ops<ascend, T>::swiglu_backward: aclnnSwiGluGrad has no kernel for this storage "
                  "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::swiglu_backward(ctx, din, dout, in, N, H);
  }
  /// cos, sin: kernels::rope_table's fp32 (>= Tn, hd/2) tables in device memory.
  static void rope_forward(ctx_t& ctx, T* x, const acc* cos, const acc* sin, int B, int Tn, int heads, int hd,
                           std::size_t ld) {
    const kernel_scope k(ctx.hook, "rope_forward");
    static_assert(ascend::supports_v<ascend::op::rope, T>,
                  "loom::kernels::ops<ascend, T>::rope_forward: aclnnRotaryPositionEmbedding has no kernel for this "
                  "storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::rope_forward(ctx, x, cos, sin, B, Tn, heads, hd, ld);
  }
  static void rope_backward(ctx_t& ctx, T* dx, const acc* cos, const acc* sin, int B, int Tn, int heads, int hd,
                            std::size_t ld) {
    const kernel_scope k(ctx.hook, "rope_backward");
    static_assert(ascend::supports_v<ascend::op::rope, T>,
                  "loom::kernels::ops<ascend, T>::rope_backward: aclnnRotaryPositionEmbeddingGrad has no kernel for "
                  "this storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::rope_backward(ctx, dx, cos, sin, B, Tn, heads, hd, ld);
  }
  static void residual_forward(ctx_t& ctx, T* out, const T* a, const T* b, std::size_t n) {
    const kernel_scope k(ctx.hook, "residual_forward");
    static_assert(ascend::supports_v<ascend::op::add, T>,
                  "loom::kernels::ops<ascend, T>::residual_forward: aclnnAdd has no kernel for this storage type on "
                  "Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::residual_forward(ctx, out, a, b, n);
  }
  /// host_losses: see ascend::crossentropy (the row losses copied to pinned host memory without a
  /// wait; the return value is then 0).
  static acc crossentropy(ctx_t& ctx, T* logits, acc* losses, const std::int32_t* targets, int N, int V, int Vp,
                          bool write_dlogits, acc grad_scale, acc* host_losses = nullptr) {
    const kernel_scope k(ctx.hook, "crossentropy");
    static_assert(ascend::supports_v<ascend::op::crossentropy, T>,
                  "loom::kernels::ops<ascend, T>::crossentropy: aclnnCrossEntropyLoss has no kernel for this storage "
                  "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    return ascend::crossentropy(ctx, logits, losses, targets, N, V, Vp, write_dlogits, grad_scale, host_losses);
  }
  /// Token windows (rows, T+1) -> inputs and targets (rows, T), int32 device memory
  /// (ascend::split_windows).
  static void split_windows(ctx_t& ctx, const std::int32_t* windows, std::int32_t* inputs, std::int32_t* targets,
                            int rows, int seq_len) {
    const kernel_scope k(ctx.hook, "split_windows");
    ascend::split_windows(ctx, windows, inputs, targets, rows, seq_len);
  }
  /// Sum of squares of n values of any supported type X (storage or fp32 gradients).
  template <class X>
  static double sum_of_squares(ctx_t& ctx, const X* x, std::size_t n) {
    const kernel_scope k(ctx.hook, "sum_of_squares");
    static_assert(ascend::supports_v<ascend::op::matmul, X>,
                  "loom::kernels::ops<ascend, T>::sum_of_squares: aclnnMatmul/aclnnInplaceCopy have no kernel for "
                  "this storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    return ascend::sum_of_squares(ctx, x, n);
  }
  /// Ascend extension (not in the CPU set yet): true when all n values are finite.
  template <class X>
  static bool all_finite(ctx_t& ctx, const X* x, std::size_t n) {
    const kernel_scope k(ctx.hook, "all_finite");
    static_assert(ascend::supports_v<ascend::op::add, X>,
                  "loom::kernels::ops<ascend, T>::all_finite: aclnnIsFinite has no kernel for this storage type on "
                  "Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    return ascend::all_finite(ctx, x, n);
  }
  /// dst = D(src), n values (aclnnInplaceCopy casts): parameters <-> master weights.
  template <class D, class S>
  static void cast(ctx_t& ctx, D* dst, const S* src, std::size_t n) {
    const kernel_scope k(ctx.hook, "cast");
    if (n) ascend::copy(ctx, ascend::tensor(ctx, dst, ascend::dtype_of<D>(), {int64_t(n)}),
                        ascend::tensor(ctx, src, ascend::dtype_of<S>(), {int64_t(n)}));
  }
  /// AdamW on fp32 master weights, then p = T(master) (ascend::adamw_master).
  template <class M, class G>
  static void adamw_master(ctx_t& ctx, T* p, M* master, M* m, M* v, const G* g, std::size_t n, M lr, M b1, M b2,
                           M eps, M wd, M gscale, long t) {
    const kernel_scope k(ctx.hook, "adamw_master");
    static_assert(ascend::supports_v<ascend::op::adamw, T>,
                  "loom::kernels::ops<ascend, T>::adamw_master: aclnnApplyAdamWV2/aclnnInplaceCopy have no kernel for "
                  "this storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::adamw_master(ctx, p, master, m, v, g, n, lr, b1, b2, eps, wd, gscale, t);
  }
  // The local pieces of the vocab-parallel embedding and cross-entropy (tensor parallelism;
  // kernels/ascend/vocab_parallel.hpp, which documents each one's aclnn calls and its differences
  // from the CPU's; the communication between them is parallel/tensor_parallel.hpp). Same
  // arguments and write modes as ops<cpu, T>'s.
  /// out (B*Tn, C) = this shard's embedding rows (zero for foreign tokens) + wpe (if not null).
  static void embedding_shard_forward(ctx_t& ctx, T* out, const std::int32_t* tok, const T* wte_local, const T* wpe,
                                      int B, int Tn, int C, int begin, int rows) {
    const kernel_scope k(ctx.hook, "embedding_forward");
    static_assert(ascend::supports_v<ascend::op::embedding, T>,
                  "loom::kernels::ops<ascend, T>::embedding_shard_forward: aclnnEmbedding has no kernel for this "
                  "storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::embedding_shard_forward(ctx, out, tok, wte_local, wpe, B, Tn, C, begin, rows);
  }
  /// dwte_local (rows, C) += for owned tokens; dwpe += when not null; in the gradient type G.
  template <class G>
  static void embedding_shard_backward(ctx_t& ctx, G* dwte_local, G* dwpe, const T* dout, const std::int32_t* tok, int B,
                                       int Tn, int C, int begin, int rows) {
    const kernel_scope k(ctx.hook, "embedding_backward");
    static_assert(ascend::supports_v<ascend::op::embedding, T>,
                  "loom::kernels::ops<ascend, T>::embedding_shard_backward: aclnnEmbeddingDenseBackward has no kernel "
                  "for this storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::embedding_shard_backward(ctx, dwte_local, dwpe, dout, tok, B, Tn, C, begin, rows);
  }
  /// row_max (N) = max of the shard's real logit columns (targets are not read on the NPU).
  static void vocab_shard_max(ctx_t& ctx, acc* row_max, const T* logits, const std::int32_t* /*targets*/, int N,
                              int rows, int valid) {
    const kernel_scope k(ctx.hook, "crossentropy_max");
    static_assert(ascend::supports_v<ascend::op::crossentropy, T>,
                  "loom::kernels::ops<ascend, T>::vocab_shard_max: aclnnAmax has no kernel for this storage type on "
                  "Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::vocab_shard_max(ctx, row_max, logits, N, rows, valid);
  }
  /// stats (2N) = softmax denominators over the shard's real columns, owned target logits.
  static void vocab_shard_sums(ctx_t& ctx, acc* stats, const T* logits, const acc* row_max, const std::int32_t* targets,
                               int N, int rows, int valid, int begin) {
    const kernel_scope k(ctx.hook, "crossentropy_sums");
    static_assert(ascend::supports_v<ascend::op::crossentropy, T>,
                  "loom::kernels::ops<ascend, T>::vocab_shard_sums: aclnnInplaceExp/aclnnReduceSum have no kernel for "
                  "this storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::vocab_shard_sums(ctx, stats, logits, row_max, targets, N, rows, valid, begin);
  }
  /// losses (N) =, dlogits into logits when write_dlogits; returns the loss sum (synchronizes).
  static acc vocab_shard_finish(ctx_t& ctx, T* logits, acc* losses, const acc* row_max, const acc* stats,
                                const std::int32_t* targets, int N, int rows, int valid, int begin, bool write_dlogits,
                                acc grad_scale) {
    const kernel_scope k(ctx.hook, "crossentropy_finish");
    static_assert(ascend::supports_v<ascend::op::crossentropy, T>,
                  "loom::kernels::ops<ascend, T>::vocab_shard_finish: aclnnCrossEntropyLossGrad has no kernel for this "
                  "storage type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    return ascend::vocab_shard_finish(ctx, logits, losses, row_max, stats, targets, N, rows, valid, begin,
                                      write_dlogits, grad_scale);
  }
  template <class M>
  static void adamw(ctx_t& ctx, T* p, M* m, M* v, const T* g, std::size_t n, M lr, M b1, M b2, M eps, M wd, M gscale,
                    long t) {
    const kernel_scope k(ctx.hook, "adamw");
    static_assert(ascend::supports_v<ascend::op::adamw, T> && ascend::supports_v<ascend::op::adamw, M>,
                  "loom::kernels::ops<ascend, T>::adamw: aclnnApplyAdamWV2 has no kernel for this parameter/moment "
                  "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
    ascend::adamw(ctx, p, m, v, g, n, lr, b1, b2, eps, wd, gscale, t);
  }
};

/// Flash attention on the NPU (aclnnFlashAttentionScore / Grad, causal via sparseMode 2).
/// Saved state per layer: softmax max and sum, fp32 [B, NH, T, 8] each; no backward scratch.
template <class T>
struct attention<device::ascend, T, fused> {
  static_assert(ascend::supports_v<ascend::op::flash_attention, T>,
                "loom::kernels::attention<ascend, T, fused>: aclnnFlashAttentionScore has no kernel for this storage "
                "type on Ascend (documented: float, Eigen::half, Eigen::bfloat16)");
  using acc = float;
  using impl = ascend::flash_attention<T>;
  static constexpr std::size_t saved_elems(std::size_t B, std::size_t NH, std::size_t Tn) {
    return impl::saved_elems(B, NH, Tn);
  }
  static constexpr std::size_t scratch_elems(std::size_t, std::size_t) { return 0; }
  /// forward and backward take the key/value heads after key_padding (0 = NH; grouped-query).
  static constexpr bool supports_gqa = true;
  /// out (B,T,C) =; saved =; qkv (B,T,3C), or (B,T,(NH + 2 kv_heads) C/NH) with kv_heads key/value
  /// heads; key_padding (B,T) optional, non-zero = padded key (same arguments as attention<cpu, T,
  /// fused>, without dropout).
  static void forward(context<device::ascend>& ctx, T* out, acc* saved, const T* qkv, int B, int Tn, int C, int NH,
                      const std::uint8_t* key_padding = nullptr, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_forward");
    impl::forward(ctx, out, saved, qkv, B, Tn, C, NH, key_padding, kv_heads);
  }
  /// dqkv (same layout as qkv) =. Recomputes the forward output, which this overload does not receive.
  static void backward(context<device::ascend>& ctx, T* dqkv, const T* dout, const T* qkv, const acc* saved, acc*,
                       int B, int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_backward");
    impl::backward(ctx, dqkv, dout, qkv, nullptr, saved, B, Tn, C, NH, key_padding, kv_heads);
  }
  /// dqkv =, given the forward output `out` (B,T,C): no recomputation.
  static void backward(context<device::ascend>& ctx, T* dqkv, const T* dout, const T* qkv, const T* out,
                       const acc* saved, acc*, int B, int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr,
                       int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_backward");
    impl::backward(ctx, dqkv, dout, qkv, out, saved, B, Tn, C, NH, key_padding, kv_heads);
  }
};

/// The Ascend backend has no unfused attention: say so instead of the generic message.
template <class T>
struct attention<device::ascend, T, reference> {
  static_assert(dependent_false<T>,
                "loom::kernels::attention<ascend, T, reference>: the Ascend backend implements attention only as "
                "aclnnFlashAttentionScore; use kernels::fused (e.g. loom::nn::transformer<M, Policy, loom::kernels::fused>)");
};

}  // namespace loom::kernels
