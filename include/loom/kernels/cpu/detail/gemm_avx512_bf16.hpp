#pragma once
/// \file Private: AVX512-BF16 GEMM for Eigen::bfloat16 operands (placeholder: the micro-kernel
/// lands next; until then the CPU is reported as lacking AVX512-BF16 and the fp32 path runs).
#include <Eigen/Core>

#include <loom/core/error.hpp>

namespace loom::kernels::cpu::detail {

/// True when the VDPBF16PS kernel can run here.
inline bool gemm_avx512_bf16_supported() noexcept { return false; }

template <class OutT>
void gemm_avx512_bf16(bool, bool, int, int, int, float, const Eigen::bfloat16*, int, const Eigen::bfloat16*, int,
                      float, OutT*, int) {
  throw error("loom::kernels::cpu::gemm: the AVX512-BF16 kernel is not built");
}

}  // namespace loom::kernels::cpu::detail
