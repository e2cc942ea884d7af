// The CPU kernels for double storage, compiled once for all of loom's own programs (CMake target
// loom_kernel_instances): Note [explicit kernel instantiations] in kernels/cpu/attention_fused.hpp.
#include <loom/kernels/cpu.hpp>

namespace loom::kernels::cpu {
LOOM_CPU_FUSED_ATTENTION_INSTANCES(template, double)
LOOM_CPU_MATMUL_INSTANCES(template, double, double)
}  // namespace loom::kernels::cpu
