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

// loom's HcclCommConfig for the build without CANN's headers restates this release's (config
// version 10), and its initialiser writes this release's HcclCommConfigInit values (hccl_comm.h).
namespace acl = loom::device::acl;
static_assert(acl::detail::hccl_comm_config_layout_matches<::HcclCommConfig>() &&
              sizeof(::HcclCommConfig) == sizeof(acl::hccl_comm_config_v10));
static_assert(HCCL_COMM_CONFIG_MAGIC_WORD == acl::hccl_comm_config_magic_word &&
              HCCL_COMM_CONFIG_VERSION == acl::hccl_comm_config_version &&
              HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET == acl::hccl_config_not_set &&
              HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET == acl::hccl_config_not_set &&
              HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET == acl::hccl_config_not_set &&
              HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET == acl::hccl_config_not_set &&
              HCCL_COMM_QOS_CONFIG_NOT_SET == acl::hccl_config_not_set &&
              HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET == acl::hccl_exec_timeout_not_set &&
              HCCL_COMM_DEFAULT_OP_EXPANSION_MODE == acl::hccl_default_op_expansion_mode &&
              HCCL_DEFAULT_SYMMETRIC_MEMORY_STRIDE == acl::hccl_default_symmetric_memory_stride);

template struct loom::kernels::ops<loom::device::ascend, float>;
template struct loom::kernels::ops<loom::device::ascend, Eigen::bfloat16>;
