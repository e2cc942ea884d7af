// expect: (matmul, fp32) must be a deliberate choice
// A GPT on Ascend with plain fp32 storage must not compile: fp32 GEMMs on the NPU are slow (cube
// unit in KEEP_DTYPE mode) and rejected on first-generation Atlas parts, so the policy must say
// precision::fp32_ascend_matmul. Builds on a machine without CANN: loom::device::ascend compiles
// from loom's own declarations of the CANN APIs.
#include <loom/kernels/ascend.hpp>
#include <loom/models/configs.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/policy.hpp>

#ifdef LOOM_SHOULD_FAIL
using P = loom::precision::fp32;
#else
using P = loom::precision::fp32_ascend_matmul;
#endif

using model = loom::nn::transformer<loom::models::tiny, loom::policy<loom::device::ascend, P>, loom::kernels::fused>;
static_assert(model::num_parameters > 0);

int main() { return 0; }
