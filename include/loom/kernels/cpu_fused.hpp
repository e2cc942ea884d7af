#pragma once
/// \file The CPU specialization attention<device::cpu, T, fused> (STYLE §3.8): flash-style
/// attention that saves only the per-row log-sum-exp. Included by kernels/cpu.hpp.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <loom/core/context.hpp>
#include <loom/core/dropout.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu/attention_fused.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels {

/// Fused (flash-style) attention on the CPU, for float and double storage (the storage type
/// is its own accumulator); 16-bit storage has its own specialization below.
/// Saved state: the (B,NH,T) log-sum-exp of each score row — B·NH·T elements instead of the
/// reference's B·NH·T². Same argument order as attention<cpu, T, reference>, plus an
/// optional key-padding mask, an optional attention-probability dropout (the same `drop` must
/// reach forward and backward; its mask is regenerated, not saved) and a backward overload
/// that takes the forward's output.
/// Kernel docs (shapes, write modes, cost): kernels/cpu/attention_fused.hpp.
template <class T>
  requires std::is_same_v<T, cpu::acc_t<T>>
struct attention<device::cpu, T, fused> {
  using acc = T;
  /// forward and backward take an attention_dropout (core/dropout.hpp) after key_padding.
  static constexpr bool supports_dropout = true;
  /// forward and backward take the key/value heads last (0 = NH; grouped-query attention).
  static constexpr bool supports_gqa = true;
  /// Saved-activation elements (accumulator type) for a (B,NH,T) problem: one per row.
  static constexpr std::size_t saved_elems(std::size_t B, std::size_t NH, std::size_t Tn) { return B * NH * Tn; }
  /// Backward scratch elements for `threads` worker threads (D rows and two score tiles each).
  static constexpr std::size_t scratch_elems(std::size_t threads, std::size_t Tn) {
    return cpu::attention_fused_scratch_elems(threads, Tn);
  }
  /// out (B,T,C) =, saved (B,NH,T) = log-sum-exp; qkv (B,T,3C), or (B,T,(NH + 2 kv_heads) C/NH) with
  /// kv_heads key/value heads (grouped-query attention). key_padding (B,T) optional,
  /// non-zero = padded key (a query with no visible key gets zeros).
  static void forward(context<device::cpu>& ctx, T* out, acc* saved, const T* qkv, int B, int Tn, int C, int NH,
                      const std::uint8_t* key_padding = nullptr, const attention_dropout& drop = {}, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_forward");
    cpu::attention_fused_forward(out, saved, qkv, B, Tn, C, NH, key_padding, drop, kv_heads);
  }
  /// dqkv (B,T,3C) =. Without the forward's output, D = rowsum(dO .* O) is recomputed from
  /// the scores (about one extra forward); prefer the overload below when `out` is kept.
  static void backward(context<device::cpu>& ctx, T* dqkv, const T* dout, const T* qkv, const acc* saved, acc* scratch,
                       int B, int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr,
                       const attention_dropout& drop = {}, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_backward");
    cpu::attention_fused_backward(dqkv, dout, qkv, static_cast<const T*>(nullptr), saved, scratch, B, Tn, C, NH,
                                  key_padding, drop, kv_heads);
  }
  /// dqkv (B,T,3C) =, given the forward's output `out` (B,T,C) for D = rowsum(dO .* O).
  static void backward(context<device::cpu>& ctx, T* dqkv, const T* dout, const T* qkv, const T* out, const acc* saved,
                       acc* scratch, int B, int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr,
                       const attention_dropout& drop = {}, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_backward");
    cpu::attention_fused_backward(dqkv, dout, qkv, out, saved, scratch, B, Tn, C, NH, key_padding, drop, kv_heads);
  }
};

/// Fused attention for 16-bit storage (bfloat16, half): fp32 softmax and accumulation; with
/// bf16 on an AVX512-BF16 CPU the tile products take bf16 operands (P and dS rounded per tile),
/// elsewhere fp32 ones (Note [fused attention in 16-bit storage] in
/// kernels/cpu/attention_fused.hpp; chosen at run time). Same interface as the float specialization; the saved
/// log-sum-exp is fp32; no scratch (a per-thread workspace instead).
template <class T>
  requires(sizeof(T) == 2 && std::is_same_v<cpu::acc_t<T>, float>)
struct attention<device::cpu, T, fused> {
  using acc = float;
  static constexpr bool supports_dropout = true;
  /// forward and backward take the key/value heads last (0 = NH; grouped-query attention).
  static constexpr bool supports_gqa = true;
  static constexpr std::size_t saved_elems(std::size_t B, std::size_t NH, std::size_t Tn) { return B * NH * Tn; }
  static constexpr std::size_t scratch_elems(std::size_t, std::size_t) { return 0; }
  /// out (B,T,C) =, saved (B,NH,T) = log-sum-exp (fp32); qkv (B,T,3C); key_padding (B,T) optional.
  static void forward(context<device::cpu>& ctx, T* out, acc* saved, const T* qkv, int B, int Tn, int C, int NH,
                      const std::uint8_t* key_padding = nullptr, const attention_dropout& drop = {}, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_forward");
    cpu::attention_fused_forward_16(out, saved, qkv, B, Tn, C, NH, key_padding, drop, kv_heads);
  }
  /// dqkv (B,T,3C) =; D = rowsum(dO .* O) recomputed from the scores.
  static void backward(context<device::cpu>& ctx, T* dqkv, const T* dout, const T* qkv, const acc* saved, acc*, int B,
                       int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr,
                       const attention_dropout& drop = {}, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_backward");
    cpu::attention_fused_backward_16(dqkv, dout, qkv, static_cast<const T*>(nullptr), saved, B, Tn, C, NH,
                                     key_padding, drop, kv_heads);
  }
  /// dqkv (B,T,3C) =, given the forward's output `out` (B,T,C).
  static void backward(context<device::cpu>& ctx, T* dqkv, const T* dout, const T* qkv, const T* out, const acc* saved,
                       acc*, int B, int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr,
                       const attention_dropout& drop = {}, int kv_heads = 0) {
    const kernel_scope k(ctx.hook, "attention_backward");
    cpu::attention_fused_backward_16(dqkv, dout, qkv, out, saved, B, Tn, C, NH, key_padding, drop, kv_heads);
  }
};

}  // namespace loom::kernels
