// expect: the Ascend backend implements attention only as aclnnFlashAttentionScore
// There is no unfused attention on the NPU: asking for kernels::reference there must say to use
// kernels::fused, instead of the generic "no attention kernel" message.
#include <loom/kernels/ascend.hpp>

#ifdef LOOM_SHOULD_FAIL
using Impl = loom::kernels::reference;
#else
using Impl = loom::kernels::fused;
#endif

int main() { return int(loom::kernels::attention<loom::device::ascend, float, Impl>::saved_elems(1, 1, 1) == 0); }
