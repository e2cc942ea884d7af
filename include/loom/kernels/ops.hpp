#pragma once
/// \file kernels::ops<Device, T>: the operator set one training step needs, per device.
///
/// The model calls kernels only through this seam, so a device is added by one partial
/// specialization (kernels/cpu.hpp, kernels/ascend.hpp) and nothing above it changes. The
/// primary template refuses with a sentence instead of a "kernel not found" at step 1.
/// All pointers are device pointers in D's memory; every call is ordered on ctx.stream.
/// Write modes follow Note [grad accumulation]: parameter gradients +=, activation gradients =,
/// residual-stream gradients +=.
#include <cstdint>
#include <string_view>

#include <loom/core/context.hpp>

namespace loom::kernels {

template <class...>
inline constexpr bool dependent_false = false;

/// A target equal to ignore_index is padding: it contributes no loss and no gradient
/// (llm.c's convention; PyTorch's default is -100).
inline constexpr std::int32_t ignore_index = -1;

/// Attention implementations, chosen by tag (STYLE §3.8).
/// Materialises the (T,T) probabilities; O(B·NH·T²) saved memory.
struct reference {
  static constexpr std::string_view name = "reference";
};
/// Flash-style, online softmax; O(B·NH·T) saved memory.
struct fused {
  static constexpr std::string_view name = "fused";
};

/// Element type of the parameter-gradient buffer for precision P on Device. The primary gives
/// P::master: fp32 gradients for 16-bit storage, so accumulation over micro-batches and the
/// gradient norm are fp32 (Note [gradient precision] in kernels/cpu/matmul.hpp); for fp32 and
/// fp64 this is the storage type. No device specializes it today: Ascend's aclnn operators write
/// 16-bit gradients into a scratch that is widened to fp32 (kernels/ascend.hpp); a device that
/// could only keep storage-type gradients would specialize it.
template <class Device, class P>
struct gradient_type {
  using type = typename P::master;
};
template <class Device, class P>
using gradient_t = typename gradient_type<Device, P>::type;

template <class Device, class T>
struct ops {
  static_assert(dependent_false<Device, T>,
                "loom::kernels::ops<Device, T>: this device has no kernels for this storage type. "
                "Include the device's kernel header (loom/kernels/cpu.hpp, loom/kernels/ascend.hpp) "
                "or choose a precision the device supports.");
};

/// Compile-time operator coverage of a device for a precision policy: which (operator,
/// precision) pairs a model may use. A device lacking some specializes coverage<Device, P> with
/// one static_assert per operator whose message names the operator and the precision, and
/// `static constexpr bool ok = true;`. Models check coverage<device, precision>::ok where the
/// policy meets the kernels (nn::transformer), so a missing pair is a compile error there, not a
/// "kernel not found" at step 1 (DESIGN §1). Primary: everything (the CPU).
template <class Device, class Precision>
struct coverage {
  static constexpr bool ok = true;
};

/// Whether ops<Device, T> has the local pieces of the vocab-parallel embedding and
/// cross-entropy (embedding_shard_forward/backward, vocab_shard_max/sums/finish) that tensor
/// parallelism needs (parallel/tensor_parallel.hpp). A model split with TP > 1 on a device
/// without them fails to compile with a sentence (nn::transformer).
template <class Device, class T>
concept has_vocab_parallel = requires { &ops<Device, T>::vocab_shard_max; &ops<Device, T>::vocab_shard_finish; };

/// Whether ops<Device, T> has the elementwise dropout kernel
/// `dropout(ctx, T* out, const T* in, std::size_t n, const dropout_mask&)` (core/dropout.hpp).
/// The CPU has it; Ascend does not (dropout runs on the CPU only so far).
template <class Device, class T>
concept has_dropout = requires { &ops<Device, T>::dropout; };

/// Whether ops<Device, T> has the Llama family's kernels: RMSNorm, SwiGLU and rotary embedding,
/// forward and backward (rmsnorm_forward/backward, swiglu_forward/backward,
/// rope_forward/backward). A model whose recipe asks for them on a device without them fails to
/// compile with a sentence (nn::transformer).
template <class Device, class T>
concept has_llama_ops = requires {
  &ops<Device, T>::rmsnorm_forward;
  &ops<Device, T>::swiglu_forward;
  &ops<Device, T>::swiglu_backward;
  &ops<Device, T>::rope_forward;
  &ops<Device, T>::rope_backward;
};

/// Whether an attention implementation A (an attention<Device, T, Impl>) computes grouped-query
/// attention: its forward and backward take the number of key/value heads as their last
/// argument, and it says so with `static constexpr bool supports_gqa = true`.
template <class A>
concept has_gqa = requires { requires A::supports_gqa; };

/// Whether an attention implementation A (an attention<Device, T, Impl>) applies
/// attention-probability dropout: its forward and backward take an attention_dropout after the
/// key-padding mask, and it says so with `static constexpr bool supports_dropout = true`.
template <class A>
concept has_attention_dropout = requires { requires A::supports_dropout; };

template <class Device, class T, class Impl>
struct attention {
  static_assert(dependent_false<Device, T, Impl>,
                "loom::kernels::attention<Device, T, Impl>: no attention kernel for this (device, "
                "storage type, implementation). Use kernels::reference, or add a specialization "
                "under include/loom/kernels/.");
};

}  // namespace loom::kernels
