// The CPU kernels for float storage, compiled once for all of loom's own programs (CMake target
// loom_kernel_instances): Note [explicit kernel instantiations] in kernels/cpu/attention_fused.hpp.
#include <loom/kernels/cpu.hpp>

namespace loom::kernels::cpu {
LOOM_CPU_FUSED_ATTENTION_INSTANCES(template, float)
LOOM_CPU_MATMUL_INSTANCES(template, float, float)
}  // namespace loom::kernels::cpu
