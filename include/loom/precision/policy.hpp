#pragma once
/// \file Precision policies: storage, compute and master types, and the loss-scaling duty.
#include <concepts>
#include <string_view>

#include <Eigen/Core>  // Eigen::bfloat16, Eigen::half

namespace loom::precision {

/// Requirements on a precision policy P:
///   P::storage              element type of parameters and activations in memory
///   P::compute              accumulator type inside kernels (reductions, GEMM accumulation)
///   P::master               optimizer copy of the weights (fp32 below fp32 storage)
///   P::needs_loss_scaling   true when training without a dynamic loss scaler is unsafe (fp16)
///   P::name                 "fp32", "bf16", "fp16"
template <class P>
concept precision_policy = requires {
  typename P::storage;
  typename P::compute;
  typename P::master;
  { P::needs_loss_scaling } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<std::string_view>;
};

/// IEEE single precision everywhere; master weights are the parameters themselves.
struct fp32 {
  using storage = float;
  using compute = float;
  using master = float;
  static constexpr bool needs_loss_scaling = false;
  static constexpr std::string_view name = "fp32";
};
static_assert(precision_policy<fp32>);

/// fp32 including fp32 GEMMs on an accelerator that would rather not: the opt-in Ascend asks for
/// (kernels::coverage<device::ascend, P>). On Ascend A2/A3, fp32 matmul runs the cube unit with
/// cubeMathType KEEP_DTYPE — exact fp32, at a fraction of its bf16/fp16 throughput — and
/// first-generation Atlas training parts reject it (loom's API reference §2.5). Same types and
/// name as fp32; on the CPU the two are interchangeable.
struct fp32_ascend_matmul : fp32 {
  static constexpr bool deliberate_fp32_matmul = true;
};
static_assert(precision_policy<fp32_ascend_matmul>);

/// bfloat16 storage (8 significand bits, fp32's exponent range): parameters and activations in
/// memory are Eigen::bfloat16; reductions, GEMM accumulation, softmax, LayerNorm statistics and
/// the loss are fp32; parameter gradients are accumulated in fp32 (kernels::gradient_t); the
/// optimizer keeps fp32 master weights and fp32 AdamW moments and casts to bf16 after each update.
/// No loss scaling needed: bf16 has fp32's range. See docs/precision.md.
struct bf16 {
  using storage = Eigen::bfloat16;
  using compute = float;
  using master = float;
  static constexpr bool needs_loss_scaling = false;
  static constexpr std::string_view name = "bf16";
};
static_assert(precision_policy<bf16>);

/// IEEE half storage (11 significand bits, largest finite 65504, smallest normal 2^-14), with
/// the same fp32 compute, gradients, master weights and moments as bf16. Small gradients
/// underflow and large ones overflow in half, so training needs dynamic loss scaling: a
/// train::trainer with fp16 and no loss scaler does not compile. See docs/precision.md.
struct fp16 {
  using storage = Eigen::half;
  using compute = float;
  using master = float;
  static constexpr bool needs_loss_scaling = true;
  static constexpr std::string_view name = "fp16";
};
static_assert(precision_policy<fp16>);

/// IEEE double everywhere. Not a training policy: it runs the CPU kernels in float64 so
/// tests can check gradients by central finite differences and compare against references.
struct fp64 {
  using storage = double;
  using compute = double;
  using master = double;
  static constexpr bool needs_loss_scaling = false;
  static constexpr std::string_view name = "fp64";
};
static_assert(precision_policy<fp64>);

/// True when storage is narrower than the master copy, so the optimizer keeps separate
/// fp32 master weights.
template <class P>
inline constexpr bool has_master_copy_v = sizeof(typename P::storage) < sizeof(typename P::master);

/// 16-bit storage (bf16 or fp16).
template <class P>
concept half_precision = precision_policy<P> && sizeof(typename P::storage) == 2;

}  // namespace loom::precision
