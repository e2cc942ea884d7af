#pragma once
/// \file The CPU specializations of kernels::ops and kernels::attention.
#include <cstddef>
#include <cstdint>
#include <memory>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu/adamw.hpp>
#include <loom/kernels/cpu/attention_reference.hpp>
#include <loom/kernels/cpu/crossentropy.hpp>
#include <loom/kernels/cpu/dropout.hpp>
#include <loom/kernels/cpu/encoder.hpp>
#include <loom/kernels/cpu/gelu.hpp>
#include <loom/kernels/cpu/layernorm.hpp>
#include <loom/kernels/cpu/matmul.hpp>
#include <loom/kernels/cpu/residual.hpp>
#include <loom/kernels/cpu/rmsnorm.hpp>
#include <loom/kernels/cpu/rope.hpp>
#include <loom/kernels/cpu/swiglu.hpp>
#include <loom/kernels/cpu/vocab_parallel.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/kernels/cpu_fused.hpp>  // attention<cpu, T, fused>

namespace loom::kernels {

namespace cpu::detail {
/// The oneDNN matmul primitives of ctx's linear layers on storage type T, created on the first
/// call; null where T's linear layers do not use them (linear_uses_onednn_matmul).
template <class T>
onednn_matmul_cache* linear_gemm_cache(context<device::cpu>& ctx) {
  if (!linear_uses_onednn_matmul<T>()) return nullptr;
  if (!ctx.gemm_cache) ctx.gemm_cache = std::make_shared<onednn_matmul_cache>();
  return ctx.gemm_cache.get();
}
}  // namespace cpu::detail

/// CPU operator set for storage type T (float, Eigen::bfloat16, Eigen::half; double for the
/// finite-difference tests). Accumulation is fp32 (double for double) everywhere.
/// Each member forwards to the kernel of the same name in loom::kernels::cpu, whose docstring
/// gives shapes, write modes and cost.
template <class T>
struct ops<device::cpu, T> {
  using ctx_t = context<device::cpu>;
  using acc = cpu::acc_t<T>;
  static void encoder_forward(ctx_t& ctx, T* out, const std::int32_t* tok, const T* wte, const T* wpe, int B, int Tn, int C) {
    const kernel_scope k(ctx.hook, "encoder_forward");
    cpu::encoder_forward(out, tok, wte, wpe, B, Tn, C);
  }
  // Parameter gradients have their own type G (fp32 for 16-bit T; kernels::gradient_t).
  template <class G>
  static void encoder_backward(ctx_t& ctx, G* dwte, G* dwpe, const T* dout, const std::int32_t* tok, int B, int Tn, int C) {
    const kernel_scope k(ctx.hook, "encoder_backward");
    cpu::encoder_backward(dwte, dwpe, dout, tok, B, Tn, C);
  }
  static void layernorm_forward(ctx_t& ctx, T* out, acc* mean, acc* rstd, const T* in, const T* w, const T* b, int N, int C) {
    const kernel_scope k(ctx.hook, "layernorm_forward");
    cpu::layernorm_forward(out, mean, rstd, in, w, b, N, C);
  }
  template <class G>
  static void layernorm_backward(ctx_t& ctx, T* din, G* dw, G* db, const T* dout, const T* in, const T* w, const acc* mean,
                                 const acc* rstd, int N, int C) {
    const kernel_scope k(ctx.hook, "layernorm_backward");
    cpu::layernorm_backward(din, dw, db, dout, in, w, mean, rstd, N, C);
  }
  // The Llama family's pieces (kernels/cpu/rmsnorm.hpp, swiglu.hpp, rope.hpp).
  static void rmsnorm_forward(ctx_t& ctx, T* out, acc* rstd, const T* in, const T* w, int N, int C, acc eps) {
    const kernel_scope k(ctx.hook, "rmsnorm_forward");
    cpu::rmsnorm_forward(out, rstd, in, w, N, C, eps);
  }
  template <class G>
  static void rmsnorm_backward(ctx_t& ctx, T* din, G* dw, const T* dout, const T* in, const T* w, const acc* rstd, int N,
                               int C) {
    const kernel_scope k(ctx.hook, "rmsnorm_backward");
    cpu::rmsnorm_backward(din, dw, dout, in, w, rstd, N, C);
  }
  static void swiglu_forward(ctx_t& ctx, T* out, const T* in, int N, int H) {
    const kernel_scope k(ctx.hook, "swiglu_forward");
    cpu::swiglu_forward(out, in, N, H);
  }
  static void swiglu_backward(ctx_t& ctx, T* din, const T* dout, const T* in, int N, int H) {
    const kernel_scope k(ctx.hook, "swiglu_backward");
    cpu::swiglu_backward(din, dout, in, N, H);
  }
  /// cos, sin: kernels::rope_table's (T, hd/2) tables in the accumulator type, in device memory.
  static void rope_forward(ctx_t& ctx, T* x, const acc* cos, const acc* sin, int B, int Tn, int heads, int hd,
                           std::size_t ld) {
    const kernel_scope k(ctx.hook, "rope_forward");
    cpu::rope_forward(x, cos, sin, B, Tn, heads, hd, ld);
  }
  static void rope_backward(ctx_t& ctx, T* dx, const acc* cos, const acc* sin, int B, int Tn, int heads, int hd,
                            std::size_t ld) {
    const kernel_scope k(ctx.hook, "rope_backward");
    cpu::rope_backward(dx, cos, sin, B, Tn, heads, hd, ld);
  }
  static void matmul_forward(ctx_t& ctx, T* out, const T* in, const T* w, const T* bias, int N, int C, int OC) {
    const kernel_scope k(ctx.hook, "matmul_forward");
    cpu::matmul_forward(out, in, w, bias, N, C, OC, cpu::detail::linear_gemm_cache<T>(ctx));
  }
  template <class G>
  static void matmul_backward(ctx_t& ctx, T* din, G* dw, G* dbias, const T* dout, const T* in, const T* w, int N, int C, int OC,
                              bool accumulate_din) {
    const kernel_scope k(ctx.hook, "matmul_backward");
    cpu::matmul_backward(din, dw, dbias, dout, in, w, N, C, OC, accumulate_din, cpu::detail::linear_gemm_cache<T>(ctx));
  }
  static void gelu_forward(ctx_t& ctx, T* out, const T* in, std::size_t n) {
    const kernel_scope k(ctx.hook, "gelu_forward");
    cpu::gelu_forward(out, in, n);
  }
  static void gelu_backward(ctx_t& ctx, T* din, const T* in, const T* dout, std::size_t n) {
    const kernel_scope k(ctx.hook, "gelu_backward");
    cpu::gelu_backward(din, in, dout, n);
  }
  static void residual_forward(ctx_t& ctx, T* out, const T* a, const T* b, std::size_t n) {
    const kernel_scope k(ctx.hook, "residual_forward");
    cpu::residual_forward(out, a, b, n);
  }
  /// Inverted dropout, forward and backward alike: out (n) = in (n) .* keep factors of `mask`
  /// (kernels::cpu::dropout). out =; out may equal in.
  static void dropout(ctx_t& ctx, T* out, const T* in, std::size_t n, const dropout_mask& mask) {
    const kernel_scope k(ctx.hook, "dropout");
    cpu::dropout(out, in, n, mask);
  }
  static acc crossentropy(ctx_t& ctx, T* logits, acc* losses, const std::int32_t* targets, int N, int V, int Vp,
                          bool write_dlogits, acc grad_scale) {
    const kernel_scope k(ctx.hook, "crossentropy");
    return cpu::crossentropy_forward_backward(logits, losses, targets, N, V, Vp, write_dlogits, grad_scale);
  }
  template <class X>
  static double sum_of_squares(ctx_t& ctx, const X* x, std::size_t n) {
    const kernel_scope k(ctx.hook, "sum_of_squares");
    return cpu::sum_of_squares(x, n);
  }
  /// True when all n values are finite (the loss scaler's overflow check).
  template <class X>
  static bool all_finite(ctx_t& ctx, const X* x, std::size_t n) {
    const kernel_scope k(ctx.hook, "all_finite");
    return cpu::all_finite(x, n);
  }
  /// dst = D(src), n values (parameters <-> master weights).
  template <class D, class S>
  static void cast(ctx_t& ctx, D* dst, const S* src, std::size_t n) {
    const kernel_scope k(ctx.hook, "cast");
    cpu::cast(dst, src, n);
  }
  template <class M>
  static void adamw(ctx_t& ctx, T* p, M* m, M* v, const T* g, std::size_t n, M lr, M b1, M b2, M eps, M wd, M gscale, long t) {
    const kernel_scope k(ctx.hook, "adamw");
    cpu::adamw_update(p, m, v, g, n, lr, b1, b2, eps, wd, gscale, t);
  }
  // The local pieces of the vocab-parallel embedding and cross-entropy (tensor parallelism;
  // kernels/cpu/vocab_parallel.hpp; the communication between them is parallel/tensor_parallel.hpp).
  static void embedding_shard_forward(ctx_t& ctx, T* out, const std::int32_t* tok, const T* wte_local, const T* wpe,
                                      int B, int Tn, int C, int begin, int rows) {
    const kernel_scope k(ctx.hook, "embedding_forward");
    cpu::embedding_shard_forward(out, tok, wte_local, wpe, B, Tn, C, begin, rows);
  }
  template <class G>
  static void embedding_shard_backward(ctx_t& ctx, G* dwte_local, G* dwpe, const T* dout, const std::int32_t* tok, int B,
                                       int Tn, int C, int begin, int rows) {
    const kernel_scope k(ctx.hook, "embedding_backward");
    cpu::embedding_shard_backward(dwte_local, dwpe, dout, tok, B, Tn, C, begin, rows);
  }
  static void vocab_shard_max(ctx_t& ctx, acc* row_max, const T* logits, const std::int32_t* targets, int N, int rows,
                              int valid) {
    const kernel_scope k(ctx.hook, "crossentropy_max");
    cpu::vocab_shard_max(row_max, logits, targets, N, rows, valid);
  }
  static void vocab_shard_sums(ctx_t& ctx, acc* stats, const T* logits, const acc* row_max, const std::int32_t* targets,
                               int N, int rows, int valid, int begin) {
    const kernel_scope k(ctx.hook, "crossentropy_sums");
    cpu::vocab_shard_sums(stats, logits, row_max, targets, N, rows, valid, begin);
  }
  static acc vocab_shard_finish(ctx_t& ctx, T* logits, acc* losses, const acc* row_max, const acc* stats,
                                const std::int32_t* targets, int N, int rows, int valid, int begin, bool write_dlogits,
                                acc grad_scale) {
    const kernel_scope k(ctx.hook, "crossentropy_finish");
    return cpu::vocab_shard_finish(logits, losses, row_max, stats, targets, N, rows, valid, begin, write_dlogits,
                                   grad_scale);
  }
  /// AdamW on fp32 master weights, then p = T(master) (kernels::cpu::adamw_update_master).
  template <class M, class G>
  static void adamw_master(ctx_t& ctx, T* p, M* master, M* m, M* v, const G* g, std::size_t n, M lr, M b1, M b2, M eps,
                           M wd, M gscale, long t) {
    const kernel_scope k(ctx.hook, "adamw_master");
    cpu::adamw_update_master(p, master, m, v, g, n, lr, b1, b2, eps, wd, gscale, t);
  }
};

/// Unfused reference attention on the CPU. Saved state: the (B,NH,T,T) probabilities.
template <class T>
struct attention<device::cpu, T, reference> {
  using acc = cpu::acc_t<T>;
  /// Saved-activation elements (accumulator type) for a (B,NH,T) problem.
  static constexpr std::size_t saved_elems(std::size_t B, std::size_t NH, std::size_t Tn) { return B * NH * Tn * Tn; }
  /// Backward scratch elements for `threads` worker threads.
  static constexpr std::size_t scratch_elems(std::size_t threads, std::size_t Tn) { return threads * Tn * Tn; }
  static void forward(context<device::cpu>& ctx, T* out, acc* saved, const T* qkv, int B, int Tn, int C, int NH) {
    const kernel_scope k(ctx.hook, "attention_forward");
    cpu::attention_forward(out, saved, qkv, B, Tn, C, NH);
  }
  static void backward(context<device::cpu>& ctx, T* dqkv, const T* dout, const T* qkv, const acc* saved, acc* scratch,
                       int B, int Tn, int C, int NH) {
    const kernel_scope k(ctx.hook, "attention_backward");
    cpu::attention_backward(dqkv, dout, qkv, saved, scratch, B, Tn, C, NH);
  }
  /// Same as above, in the signature of the fused kernel (which takes the forward's output
  /// to form D = rowsum(dout ∘ out)); the reference does not need `out`.
  static void backward(context<device::cpu>& ctx, T* dqkv, const T* dout, const T* qkv, const T* /*out*/,
                       const acc* saved, acc* scratch, int B, int Tn, int C, int NH) {
    backward(ctx, dqkv, dout, qkv, saved, scratch, B, Tn, C, NH);
  }
};

}  // namespace loom::kernels
