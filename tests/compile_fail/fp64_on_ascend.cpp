// expect: (matmul, fp64)
// No operator on the NPU takes float64: a GPT with precision::fp64 on Ascend must not compile, and
// the message must name the operator and the precision; deliberate fp32 is fine.
#include <loom/kernels/ascend/coverage.hpp>

#ifdef LOOM_SHOULD_FAIL
using P = loom::precision::fp64;
#else
using P = loom::precision::fp32_ascend_matmul;
#endif

static_assert(loom::kernels::coverage<loom::device::ascend, P>::ok);

int main() { return 0; }
