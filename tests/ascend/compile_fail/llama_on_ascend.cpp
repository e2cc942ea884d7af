// expect: asks for RMSNorm, rotary positions or SwiGLU, whose kernels
// The NPU's kernels::ops has no RMSNorm, RoPE or SwiGLU yet: a Llama on device::ascend must not
// compile, and the message must name what is missing; GPT-2 on the NPU is fine.
#include <loom/kernels/ascend.hpp>
#include <loom/nn/gpt.hpp>

#ifdef LOOM_SHOULD_FAIL
using M = loom::models::llama_tiny;
#else
using M = loom::models::tiny;
#endif

static_assert(sizeof(loom::nn::gpt<M, loom::policy<loom::device::ascend, loom::precision::bf16>>) > 0);

int main() { return 0; }
