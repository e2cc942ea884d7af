// Compiled against CANN's own headers (see CMakeLists.txt here): the whole Ascend side of loom.
#if !LOOM_ASCEND_USE_CANN_HEADERS
#error "configure with LOOM_ASCEND_USE_CANN_HEADERS=ON"
#endif
#include <loom/device/ascend.hpp>
#include <loom/device/ascend_profiler.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>

#include <acl/acl.h>

// The vendor's own types, not loom's restatements, are in use.
static_assert(std::is_same_v<loom::device::acl::aclTensor, ::aclTensor>);
static_assert(std::is_same_v<loom::device::acl::HcclCommConfig, ::HcclCommConfig>);

template struct loom::kernels::ops<loom::device::ascend, float>;
template struct loom::kernels::ops<loom::device::ascend, Eigen::bfloat16>;
