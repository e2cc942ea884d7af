#pragma once
/// \file Which (operator, precision) pairs the Ascend kernels support, checked at compile time.
///
/// kernels::coverage<device::ascend, P> (the hook in kernels/ops.hpp, checked by nn::transformer) has one
/// static_assert per operator the GPT step uses; the message names the operator, its aclnn calls
/// and the precision. Documented storage types (ops-nn / ops-transformer docs, reference §2.5,
/// §2.6): FLOAT, FLOAT16, BFLOAT16 for every operator below; nothing on the NPU takes double.
///
/// fp32 matmul is a deliberate choice: the cube unit runs fp32 GEMMs (cubeMathType 0, KEEP_DTYPE)
/// exactly but at a fraction of its bf16/fp16 rate, and first-generation Atlas training parts
/// reject fp32 with KEEP_DTYPE. precision::fp32 on Ascend therefore fails to compile; say
/// precision::fp32_ascend_matmul to mean it, or train with bf16 storage. (The kernels' own internal fp32
/// GEMMs — the sum-of-squares reduction — are not affected: the check is on the model's policy.)
#include <type_traits>

#include <Eigen/Core>

#include <loom/device/ascend.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/precision/policy.hpp>

namespace loom::kernels::ascend {

/// Storage types the aclnn operators document.
template <class T>
inline constexpr bool documented_storage_v =
    std::is_same_v<T, float> || std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;

/// True when the precision policy opts in to fp32 GEMMs on the NPU (precision::fp32_ascend_matmul).
template <class P>
inline constexpr bool deliberate_fp32_matmul_v = [] {
  if constexpr (requires { P::deliberate_fp32_matmul; }) return bool(P::deliberate_fp32_matmul);
  else return false;
}();

}  // namespace loom::kernels::ascend

namespace loom::kernels {

template <class P>
struct coverage<device::ascend, P> {
  using T = typename P::storage;
  static constexpr bool fp64 = std::is_same_v<T, double>;
  static constexpr bool known = ascend::documented_storage_v<T>;
  static_assert(!fp64, "loom on Ascend: (matmul, fp64) — aclnnMatmul/aclnnAddmm have no float64 kernel on the NPU "
                       "(and neither has any other operator); use bf16 storage or precision::fp32_ascend_matmul");
  static_assert(fp64 || known, "loom on Ascend: (matmul, layernorm, gelu, embedding, crossentropy, add, adamw, "
                               "flash_attention, rmsnorm, swiglu, rope) x this precision — the aclnn operators document only float, "
                               "Eigen::half and Eigen::bfloat16 storage");
  static_assert(!std::is_same_v<T, float> || ascend::deliberate_fp32_matmul_v<P>,
                "loom on Ascend: (matmul, fp32) must be a deliberate choice — fp32 GEMMs run the cube unit in "
                "KEEP_DTYPE mode at a fraction of its bf16 rate and are rejected on first-generation Atlas training "
                "parts; use bf16 storage, or precision::fp32_ascend_matmul to mean fp32");
  static constexpr bool ok = true;
};

}  // namespace loom::kernels
