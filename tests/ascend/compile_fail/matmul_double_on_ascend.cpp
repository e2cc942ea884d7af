// expect: aclnnMatmul/aclnnAddmm have no kernel for this storage type on Ascend
// The NPU has no fp64 matmul: a model asking for double storage on device::ascend must not compile,
// and the error must name the operator; float is fine.
#include <loom/kernels/ascend.hpp>

#ifdef LOOM_SHOULD_FAIL
using T = double;
#else
using T = float;
#endif

void use(loom::context<loom::device::ascend>& ctx, T* y, const T* x, const T* w) {
  loom::kernels::ops<loom::device::ascend, T>::matmul_forward(ctx, y, x, w, nullptr, 2, 3, 4);
}

int main() { return 0; }
