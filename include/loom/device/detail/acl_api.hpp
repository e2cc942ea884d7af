#pragma once
/// \file loom's declarations of the subset of the CANN C APIs it calls (ACL runtime, aclnn meta
/// objects and operators, HCCL), and the table of function pointers the loader fills.
///
/// Two modes, chosen by the compile definition LOOM_ASCEND_USE_CANN_HEADERS (CMake option of the
/// same name, see docs/ascend.md):
///   * 0 (default): nothing from a vendor header. Types are restated here in namespace
///     loom::device::acl from loom's API reference (shared/reference/ascend-api.md §1.2, §1.6,
///     §2.2, §2.3, §3.2 — CANN 8.1.RC1 [H] signatures); the Ascend policy compiles on any machine.
///   * 1: the types are the vendor's (acl/acl.h, aclnn/acl_meta.h, aclnnop/aclnn_*.h,
///     hccl/hccl.h), and every function pointer type of the table and every constant below is
///     static_assert-ed equal to the vendor declaration, so API drift is a compile error.
///     (Never compiled against a real toolkit: none is available to the project. CI compiles it
///     against the host emulation's headers, which restate the same reference.)
/// In both modes the functions are *never linked*: ascend_runtime (device/ascend_runtime.hpp)
/// resolves them with dlsym from the libraries it loads.
///
/// One list (LOOM_ACL_*_FUNCTIONS) names each function once, with its exact signature; the table,
/// the loader and the drift checks are generated from it.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if LOOM_ASCEND_USE_CANN_HEADERS
#include <acl/acl.h>
#include <acl/acl_prof.h>
#include <aclnn/acl_meta.h>
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_addmm.h>
#include <aclnnop/aclnn_apply_adam_w_v2.h>
#include <aclnnop/aclnn_copy.h>
#include <aclnnop/aclnn_embedding.h>
#include <aclnnop/aclnn_embedding_dense_backward.h>
#include <aclnnop/aclnn_flash_attention_score.h>
#include <aclnnop/aclnn_flash_attention_score_grad.h>
#include <aclnnop/aclnn_gelu_backward_v2.h>
#include <aclnnop/aclnn_gelu_v2.h>
#include <aclnnop/aclnn_isfinite.h>
#include <aclnnop/aclnn_layer_norm.h>
#include <aclnnop/aclnn_layer_norm_backward.h>
#include <aclnnop/aclnn_matmul.h>
#include <aclnnop/aclnn_mul.h>
#include <aclnnop/aclnn_reduce_sum.h>
#include <aclnnop/aclnn_rotary_position_embedding.h>
#include <hccl/hccl.h>
// Operators whose header CANN's open-source set lacks: acl_ops_declared.hpp.
#include <loom/device/detail/acl_ops_declared.hpp>
#endif

namespace loom::device::acl {

// --- types ---------------------------------------------------------------------------------------
#if LOOM_ASCEND_USE_CANN_HEADERS
using ::aclBoolArray;
using ::aclDataType;
using ::aclError;
using ::aclFormat;
using ::aclIntArray;
using ::aclnnStatus;
using ::aclOpExecutor;
using ::aclrtEvent;
using ::aclrtEventRecordedStatus;
using ::aclrtMemAttr;
using ::aclrtMemcpyKind;
using ::aclrtMemMallocPolicy;
using ::aclrtStream;
using ::aclScalar;
using ::aclSysParamOpt;
using ::aclTensor;
using ::HcclComm;
using ::HcclCommConfig;
using ::HcclDataType;
using ::HcclReduceOp;
using ::HcclResult;
using ::HcclRootInfo;
using ::aclprofAicoreEvents;
using ::aclprofAicoreMetrics;
using ::aclprofConfig;
#else
using aclError = int;          // typedef int aclError                        (§1.2)
using aclnnStatus = int32_t;   // typedef int32_t aclnnStatus                 (§2.1)
using aclrtStream = void*;     // typedef void *aclrtStream                   (§1.2)
using aclrtEvent = void*;      // typedef void *aclrtEvent                    (§1.2)
using HcclComm = void*;        // typedef void *HcclComm                      (§3.2)
// C enums, passed by value as int: only their values matter (constants below).
enum aclDataType : int {};
enum aclFormat : int {};
enum aclrtMemMallocPolicy : int {};
enum aclrtMemcpyKind : int {};
enum aclrtMemAttr : int {};
enum aclrtEventRecordedStatus : int {};
enum aclSysParamOpt : int {};
enum HcclResult : int {};
enum HcclDataType : int {};
enum HcclReduceOp : int {};
enum aclprofAicoreMetrics : int {};
// Opaque descriptor objects (typedef struct X X; in acl_meta.h, §2.2).
struct aclTensor;
struct aclScalar;
struct aclIntArray;
struct aclBoolArray;
struct aclOpExecutor;
// Opaque profiling objects (acl/acl_prof.h, §5.1).
struct aclprofConfig;
struct aclprofAicoreEvents;
/// The opaque 4108-byte root info HCCL ranks exchange out of band (§3.2).
struct HcclRootInfo {
  char internal[4108];
};
#endif
/// HcclCommConfig as of CANN 9.0.0 (config version 10; hicann/hcomm v9.0.0
/// include/hccl/hccl_types.h, HcclCommConfigDef), loom's own declaration for the build without
/// CANN's headers. Versioned: only initialise it with hccl_comm_config_init below. Its first 24
/// bytes are the header {size_t size, uint32 magicWord, uint32 version, uint64 reserved}; HCCL
/// copies min(size, its own sizeof) bytes and reads the fields of min(version, its own version),
/// so a library of an older config version (8.1.RC1: 5, the fields up to hcclRdmaServiceLevel)
/// reads this layout too. With CANN's headers the layout is static_assert-checked below.
struct hccl_comm_config_v10 {
  char reserved[24];
  uint32_t hcclBufferSize;
  uint32_t hcclDeterministic;
  char hcclCommName[128];
  char hcclUdi[128];
  uint32_t hcclOpExpansionMode;
  uint32_t hcclRdmaTrafficClass;
  uint32_t hcclRdmaServiceLevel;
  uint32_t hcclWorldRankID;
  uint64_t hcclJobID;
  uint8_t aclGraphZeroCopyEnable;
  int32_t hcclExecTimeOut;
  char hcclAlgo[1600];
  char hcclRetryEnable[50];
  char hcclRetryParams[128];
  char hcclBufferName[128];
  uint32_t hcclQos;
  uint64_t hcclSymWinMaxMemSizePerRank;
};
#if !LOOM_ASCEND_USE_CANN_HEADERS
using HcclCommConfig = hccl_comm_config_v10;
#endif

// --- constants (loom names; values from the reference, checked against the vendor's in mode 1) ---
inline constexpr aclError success = 0;                                           // ACL_SUCCESS
inline constexpr aclDataType dt_float = aclDataType(0);                          // ACL_FLOAT
inline constexpr aclDataType dt_float16 = aclDataType(1);                        // ACL_FLOAT16
inline constexpr aclDataType dt_int8 = aclDataType(2);                           // ACL_INT8
inline constexpr aclDataType dt_int32 = aclDataType(3);                          // ACL_INT32
inline constexpr aclDataType dt_uint8 = aclDataType(4);                          // ACL_UINT8
inline constexpr aclDataType dt_int64 = aclDataType(9);                          // ACL_INT64 (not 5)
inline constexpr aclDataType dt_double = aclDataType(11);                        // ACL_DOUBLE
inline constexpr aclDataType dt_bool = aclDataType(12);                          // ACL_BOOL
inline constexpr aclDataType dt_bf16 = aclDataType(27);                          // ACL_BF16
inline constexpr aclFormat format_nd = aclFormat(2);                             // ACL_FORMAT_ND
inline constexpr aclrtMemMallocPolicy malloc_huge_first = aclrtMemMallocPolicy(0);  // ACL_MEM_MALLOC_HUGE_FIRST
inline constexpr aclrtMemcpyKind memcpy_host_to_device = aclrtMemcpyKind(1);    // ACL_MEMCPY_HOST_TO_DEVICE
inline constexpr aclrtMemcpyKind memcpy_device_to_host = aclrtMemcpyKind(2);    // ACL_MEMCPY_DEVICE_TO_HOST
inline constexpr aclrtMemcpyKind memcpy_device_to_device = aclrtMemcpyKind(3);  // ACL_MEMCPY_DEVICE_TO_DEVICE
inline constexpr aclrtMemAttr mem_ddr = aclrtMemAttr(0);                         // ACL_DDR_MEM
inline constexpr aclrtMemAttr mem_hbm = aclrtMemAttr(1);                         // ACL_HBM_MEM
inline constexpr uint32_t event_sync = 0x1u;                                     // ACL_EVENT_SYNC
inline constexpr uint32_t event_time_line = 0x8u;                                // ACL_EVENT_TIME_LINE
inline constexpr aclrtEventRecordedStatus event_recorded_complete = aclrtEventRecordedStatus(1);  // ..._COMPLETE
inline constexpr aclSysParamOpt opt_deterministic = aclSysParamOpt(0);          // ACL_OPT_DETERMINISTIC
inline constexpr std::size_t pkg_version_max = 128;                              // ACL_PKG_VERSION_MAX_SIZE
inline constexpr HcclResult hccl_success = HcclResult(0);                        // HCCL_SUCCESS
inline constexpr HcclResult hccl_e_timeout = HcclResult(9);                      // HCCL_E_TIMEOUT
inline constexpr HcclDataType hccl_int8 = HcclDataType(0);                       // HCCL_DATA_TYPE_INT8
inline constexpr HcclDataType hccl_int32 = HcclDataType(2);                      // HCCL_DATA_TYPE_INT32
inline constexpr HcclDataType hccl_fp16 = HcclDataType(3);                       // HCCL_DATA_TYPE_FP16
inline constexpr HcclDataType hccl_fp32 = HcclDataType(4);                       // HCCL_DATA_TYPE_FP32
inline constexpr HcclDataType hccl_int64 = HcclDataType(5);                      // HCCL_DATA_TYPE_INT64
inline constexpr HcclDataType hccl_uint8 = HcclDataType(7);                      // HCCL_DATA_TYPE_UINT8
inline constexpr HcclDataType hccl_fp64 = HcclDataType(10);                      // HCCL_DATA_TYPE_FP64
inline constexpr HcclDataType hccl_bfp16 = HcclDataType(11);                     // HCCL_DATA_TYPE_BFP16 (not 27)
inline constexpr HcclReduceOp hccl_sum = HcclReduceOp(0);                        // HCCL_REDUCE_SUM
inline constexpr HcclReduceOp hccl_prod = HcclReduceOp(1);                       // HCCL_REDUCE_PROD
inline constexpr HcclReduceOp hccl_max = HcclReduceOp(2);                        // HCCL_REDUCE_MAX
inline constexpr HcclReduceOp hccl_min = HcclReduceOp(3);                        // HCCL_REDUCE_MIN
inline constexpr std::size_t hccl_root_info_bytes = 4108;                        // HCCL_ROOT_INFO_BYTES
// aclprofCreateConfig's dataTypeConfig switches and AI-core metric (§5.1, 8.1.RC1 acl_prof.h)
inline constexpr uint64_t prof_acl_api = 0x1u;                                   // ACL_PROF_ACL_API
inline constexpr uint64_t prof_task_time = 0x2u;                                 // ACL_PROF_TASK_TIME
inline constexpr uint64_t prof_aicore_metrics = 0x4u;                            // ACL_PROF_AICORE_METRICS
inline constexpr uint64_t prof_hccl_trace = 0x20u;                               // ACL_PROF_HCCL_TRACE
inline constexpr uint64_t prof_training_trace = 0x40u;                           // ACL_PROF_TRAINING_TRACE
inline constexpr uint64_t prof_msproftx = 0x80u;                                 // ACL_PROF_MSPROFTX
inline constexpr uint64_t prof_runtime_api = 0x100u;                             // ACL_PROF_RUNTIME_API
inline constexpr aclprofAicoreMetrics aicore_none = aclprofAicoreMetrics(0xFF);  // ACL_AICORE_NONE
inline constexpr aclprofAicoreMetrics aicore_pipe_utilization = aclprofAicoreMetrics(1);  // ACL_AICORE_PIPE_UTILIZATION

#if LOOM_ASCEND_USE_CANN_HEADERS
static_assert(success == ACL_SUCCESS && dt_float == ACL_FLOAT && dt_float16 == ACL_FLOAT16 && dt_int8 == ACL_INT8 &&
                  dt_int32 == ACL_INT32 && dt_uint8 == ACL_UINT8 && dt_int64 == ACL_INT64 &&
                  dt_double == ACL_DOUBLE && dt_bool == ACL_BOOL && dt_bf16 == ACL_BF16,
              "CANN header drift: an aclDataType value differs from loom's declarations");
static_assert(format_nd == ACL_FORMAT_ND && malloc_huge_first == ACL_MEM_MALLOC_HUGE_FIRST &&
                  memcpy_host_to_device == ACL_MEMCPY_HOST_TO_DEVICE &&
                  memcpy_device_to_host == ACL_MEMCPY_DEVICE_TO_HOST &&
                  memcpy_device_to_device == ACL_MEMCPY_DEVICE_TO_DEVICE && mem_ddr == ACL_DDR_MEM &&
                  mem_hbm == ACL_HBM_MEM,
              "CANN header drift: an aclFormat/aclrtMem* value differs from loom's declarations");
static_assert(event_sync == ACL_EVENT_SYNC && event_time_line == ACL_EVENT_TIME_LINE &&
                  event_recorded_complete == ACL_EVENT_RECORDED_STATUS_COMPLETE &&
                  pkg_version_max == ACL_PKG_VERSION_MAX_SIZE && opt_deterministic == ACL_OPT_DETERMINISTIC,
              "CANN header drift: an event flag or the package-version size differs from loom's declarations");
// ascend_runtime::cann_version reads the deprecated aclsysGetCANNVersion's result by this layout
static_assert(sizeof(aclCANNPackageVersion) == 2 * pkg_version_max + 4 * 64 &&
                  offsetof(aclCANNPackageVersion, version) == 0 && ACL_PKG_NAME_CANN == 0,
              "CANN header drift: aclCANNPackageVersion's layout differs from loom's (ascend_runtime::cann_version)");
static_assert(hccl_success == HCCL_SUCCESS && hccl_e_timeout == HCCL_E_TIMEOUT && hccl_int8 == HCCL_DATA_TYPE_INT8 &&
                  hccl_int32 == HCCL_DATA_TYPE_INT32 && hccl_fp16 == HCCL_DATA_TYPE_FP16 &&
                  hccl_fp32 == HCCL_DATA_TYPE_FP32 && hccl_int64 == HCCL_DATA_TYPE_INT64 &&
                  hccl_uint8 == HCCL_DATA_TYPE_UINT8 && hccl_fp64 == HCCL_DATA_TYPE_FP64 &&
                  hccl_bfp16 == HCCL_DATA_TYPE_BFP16 && hccl_sum == HCCL_REDUCE_SUM && hccl_prod == HCCL_REDUCE_PROD &&
                  hccl_max == HCCL_REDUCE_MAX && hccl_min == HCCL_REDUCE_MIN &&
                  hccl_root_info_bytes == HCCL_ROOT_INFO_BYTES && sizeof(HcclRootInfo) == HCCL_ROOT_INFO_BYTES,
              "CANN header drift: an HCCL value differs from loom's declarations");
static_assert(prof_acl_api == ACL_PROF_ACL_API && prof_task_time == ACL_PROF_TASK_TIME &&
                  prof_aicore_metrics == ACL_PROF_AICORE_METRICS && prof_hccl_trace == ACL_PROF_HCCL_TRACE &&
                  prof_training_trace == ACL_PROF_TRAINING_TRACE && prof_msproftx == ACL_PROF_MSPROFTX &&
                  prof_runtime_api == ACL_PROF_RUNTIME_API && aicore_none == ACL_AICORE_NONE &&
                  aicore_pipe_utilization == ACL_AICORE_PIPE_UTILIZATION,
              "CANN header drift: an aclprof value differs from loom's declarations");
#endif

// HcclCommConfigInit's constants, CANN 9.0.0 (hicann/hcomm v9.0.0 include/hccl/hccl_types.h).
inline constexpr uint32_t hccl_comm_config_magic_word = 0xf0f0f0f0u;   // HCCL_COMM_CONFIG_MAGIC_WORD
inline constexpr uint32_t hccl_comm_config_version = 10;               // HCCL_COMM_CONFIG_VERSION
inline constexpr uint32_t hccl_config_not_set = 0xffffffffu;           // HCCL_COMM_*_CONFIG_NOT_SET
inline constexpr uint32_t hccl_default_op_expansion_mode = 0;          // HCCL_COMM_DEFAULT_OP_EXPANSION_MODE
inline constexpr int32_t hccl_exec_timeout_not_set = -1;               // HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET
inline constexpr uint64_t hccl_default_symmetric_memory_stride = 16;  // HCCL_DEFAULT_SYMMETRIC_MEMORY_STRIDE

/// Fills an HcclCommConfig with its versioned header and "not set" defaults. With CANN's headers
/// this is the vendor's inline HcclCommConfigInit. Without them it does what CANN 9.0.0's does
/// (hicann/hcomm v9.0.0 include/hccl/hccl_comm.h), field by field: header {size =
/// sizeof(HcclCommConfig), magic 0xf0f0f0f0, version 10, reserved 0}; hcclBufferSize and
/// hcclDeterministic 0xffffffff ("not set": HCCL then takes HCCL_BUFFSIZE and HCCL_DETERMINISTIC
/// from the environment — a concrete 200 / 0 here would override them); empty name, UDI, algo,
/// retry and buffer-name strings; op expansion mode 0; RDMA traffic class and service level
/// 0xffffffff; world rank id, job id and ACL-graph zero copy 0; exec timeout 0xffffffff (-1); QoS
/// 0xffffffff; symmetric-memory stride 16 (GB). Unlike the vendor's, it first zeroes the whole
/// struct (the vendor leaves the bytes it does not name as they were).
inline void hccl_comm_config_init(HcclCommConfig* config) noexcept {
#if LOOM_ASCEND_USE_CANN_HEADERS
  HcclCommConfigInit(config);
#else
  if (!config) return;
  *config = HcclCommConfig{};
  struct header {
    std::size_t size;
    uint32_t magic_word;
    uint32_t version;
    uint64_t reserved;
  };
  static_assert(sizeof(header) == sizeof(config->reserved));
  const header h{sizeof(HcclCommConfig), hccl_comm_config_magic_word, hccl_comm_config_version, 0};
  __builtin_memcpy(config->reserved, &h, sizeof h);
  config->hcclBufferSize = hccl_config_not_set;
  config->hcclDeterministic = hccl_config_not_set;
  config->hcclCommName[0] = '\0';
  config->hcclUdi[0] = '\0';
  config->hcclOpExpansionMode = hccl_default_op_expansion_mode;
  config->hcclRdmaTrafficClass = hccl_config_not_set;
  config->hcclRdmaServiceLevel = hccl_config_not_set;
  config->hcclWorldRankID = 0;
  config->hcclJobID = 0;
  config->aclGraphZeroCopyEnable = 0;
  config->hcclExecTimeOut = hccl_exec_timeout_not_set;
  config->hcclAlgo[0] = '\0';
  config->hcclRetryEnable[0] = '\0';
  config->hcclRetryParams[0] = '\0';
  config->hcclBufferName[0] = '\0';
  config->hcclQos = hccl_config_not_set;
  config->hcclSymWinMaxMemSizePerRank = hccl_default_symmetric_memory_stride;
#endif
}

#if LOOM_ASCEND_USE_CANN_HEADERS
namespace detail {
/// True when C (the vendor's HcclCommConfig) has loom's version-10 layout; vacuously true for a
/// header of an older config version (no hcclSymWinMaxMemSizePerRank), e.g. CANN 8.1.RC1's. The
/// initialiser's "not set" constants exist only in newer headers: tests/ascend/cann_headers/
/// check.cpp compares them with loom's against CANN 9.0.0's.
template <class C>
constexpr bool hccl_comm_config_layout_matches() {
  if constexpr (requires { &C::hcclSymWinMaxMemSizePerRank; }) {
    using L = hccl_comm_config_v10;
    return sizeof(C) == sizeof(L) && offsetof(C, hcclBufferSize) == offsetof(L, hcclBufferSize) &&
           offsetof(C, hcclDeterministic) == offsetof(L, hcclDeterministic) &&
           offsetof(C, hcclCommName) == offsetof(L, hcclCommName) && offsetof(C, hcclUdi) == offsetof(L, hcclUdi) &&
           offsetof(C, hcclOpExpansionMode) == offsetof(L, hcclOpExpansionMode) &&
           offsetof(C, hcclRdmaTrafficClass) == offsetof(L, hcclRdmaTrafficClass) &&
           offsetof(C, hcclRdmaServiceLevel) == offsetof(L, hcclRdmaServiceLevel) &&
           offsetof(C, hcclWorldRankID) == offsetof(L, hcclWorldRankID) &&
           offsetof(C, hcclJobID) == offsetof(L, hcclJobID) &&
           offsetof(C, aclGraphZeroCopyEnable) == offsetof(L, aclGraphZeroCopyEnable) &&
           offsetof(C, hcclExecTimeOut) == offsetof(L, hcclExecTimeOut) &&
           offsetof(C, hcclAlgo) == offsetof(L, hcclAlgo) &&
           offsetof(C, hcclRetryEnable) == offsetof(L, hcclRetryEnable) &&
           offsetof(C, hcclRetryParams) == offsetof(L, hcclRetryParams) &&
           offsetof(C, hcclBufferName) == offsetof(L, hcclBufferName) && offsetof(C, hcclQos) == offsetof(L, hcclQos) &&
           offsetof(C, hcclSymWinMaxMemSizePerRank) == offsetof(L, hcclSymWinMaxMemSizePerRank) &&
           HCCL_COMM_CONFIG_VERSION == hccl_comm_config_version;
  } else {
    return true;
  }
}
}  // namespace detail
static_assert(HCCL_COMM_CONFIG_MAGIC_WORD == hccl_comm_config_magic_word &&
                  detail::hccl_comm_config_layout_matches<HcclCommConfig>(),
              "CANN header drift: HcclCommConfig (config version 10) differs from loom's hccl_comm_config_v10");
#endif

// --- functions: X(name, return type, (parameters)) — exact signatures, reference section noted ----
/// libascendcl.so (§1.3–§1.7). Required: the loader refuses a libascendcl without them.
#define LOOM_ACL_RUNTIME_FUNCTIONS(X)                                                                          \
  X(aclInit, aclError, (const char* configPath))                                                               \
  X(aclFinalize, aclError, ())                                                                                 \
  X(aclGetRecentErrMsg, const char*, ())                                                                       \
  X(aclrtSetDevice, aclError, (int32_t deviceId))                                                              \
  X(aclrtGetDevice, aclError, (int32_t * deviceId))                                                            \
  X(aclrtGetDeviceCount, aclError, (uint32_t * count))                                                         \
  X(aclrtSynchronizeDevice, aclError, ())                                                                      \
  X(aclrtCreateStream, aclError, (aclrtStream * stream))                                                       \
  X(aclrtDestroyStream, aclError, (aclrtStream stream))                                                        \
  X(aclrtSynchronizeStream, aclError, (aclrtStream stream))                                                    \
  X(aclrtSynchronizeStreamWithTimeout, aclError, (aclrtStream stream, int32_t timeout))                        \
  X(aclrtMalloc, aclError, (void** devPtr, std::size_t size, aclrtMemMallocPolicy policy))                     \
  X(aclrtFree, aclError, (void* devPtr))                                                                       \
  X(aclrtMallocHost, aclError, (void** hostPtr, std::size_t size))                                             \
  X(aclrtFreeHost, aclError, (void* hostPtr))                                                                  \
  X(aclrtMemcpy, aclError,                                                                                     \
    (void* dst, std::size_t destMax, const void* src, std::size_t count, aclrtMemcpyKind kind))                \
  X(aclrtMemcpyAsync, aclError,                                                                                \
    (void* dst, std::size_t destMax, const void* src, std::size_t count, aclrtMemcpyKind kind,                 \
     aclrtStream stream))                                                                                      \
  X(aclrtMemset, aclError, (void* devPtr, std::size_t maxCount, int32_t value, std::size_t count))            \
  X(aclrtMemsetAsync, aclError,                                                                                \
    (void* devPtr, std::size_t maxCount, int32_t value, std::size_t count, aclrtStream stream))                \
  X(aclrtGetMemInfo, aclError, (aclrtMemAttr attr, std::size_t * free, std::size_t * total))                   \
  X(aclrtCreateEventWithFlag, aclError, (aclrtEvent * event, uint32_t flag))                                   \
  X(aclrtDestroyEvent, aclError, (aclrtEvent event))                                                           \
  X(aclrtRecordEvent, aclError, (aclrtEvent event, aclrtStream stream))                                        \
  X(aclrtStreamWaitEvent, aclError, (aclrtStream stream, aclrtEvent event))                                    \
  X(aclrtSynchronizeEvent, aclError, (aclrtEvent event))                                                       \
  X(aclrtSynchronizeEventWithTimeout, aclError, (aclrtEvent event, int32_t timeout))                           \
  X(aclrtQueryEventStatus, aclError, (aclrtEvent event, aclrtEventRecordedStatus * status))                    \
  X(aclrtEventElapsedTime, aclError, (float* ms, aclrtEvent startEvent, aclrtEvent endEvent))

/// libascendcl.so, optional: null when missing. aclrtGetVersion (the ACL interface version) is
/// deprecated in the newest runtime, so it is not required. aclrtCreateEventExWithFlag (CANN
/// 8.0.RC2+) makes events that may be re-recorded; without it device::ascend_event falls back to
/// aclrtCreateEventWithFlag events reset after every wait (aclrtResetEvent), the order CANN
/// documents for those (reference ascend-runtime-audit.md §2.1). aclrtCtxSetSysParamOpt
/// (ACL_OPT_DETERMINISTIC: deterministic kernels in the current context) serves --deterministic.
#define LOOM_ACL_OPTIONAL_FUNCTIONS(X)                                                                         \
  X(aclrtGetVersion, aclError, (int32_t * majorVersion, int32_t * minorVersion, int32_t * patchVersion))       \
  X(aclrtGetSocName, const char*, ())                                                                          \
  X(aclrtCreateEventExWithFlag, aclError, (aclrtEvent * event, uint32_t flag))                                 \
  X(aclrtResetEvent, aclError, (aclrtEvent event, aclrtStream stream))                                         \
  X(aclrtCtxSetSysParamOpt, aclError, (aclSysParamOpt opt, int64_t value))                                     \
  X(aclrtCtxGetSysParamOpt, aclError, (aclSysParamOpt opt, int64_t * value))

/// libascendcl.so of the newer runtimes (ACL interface 1.17, CANN 9.0; absent from 8.x): null when
/// missing, drift-checked only against headers that declare ACL 1.17 or later.
///   aclsysGetVersionStr   a CANN package's version by package name, e.g. "runtime" (hicann/runtime
///                         9.0.0 docs/api_docs/aclsysGetVersionStr.md); replaces aclsysGetCANNVersion,
///                         deprecated in 9.0 and only looked up by name (ascend_runtime::cann_version)
///   aclFinalizeReference  reference-counted aclFinalize (§1.3; ascend_runtime::finalize)
#define LOOM_ACL_NEWER_FUNCTIONS(X)                                                                            \
  X(aclsysGetVersionStr, aclError, (char* pkgName, char* versionStr))                                         \
  X(aclFinalizeReference, aclError, (uint64_t * refCount))

/// libmsprofiler.so (§4.2, §5.1; torch_npu dlopens it too): the CANN profiler's session calls,
/// optional — null when the library is absent (profiling then throws when asked for).
#define LOOM_ACL_PROF_FUNCTIONS(X)                                                                             \
  X(aclprofInit, aclError, (const char* profilerResultPath, std::size_t length))                              \
  X(aclprofCreateConfig, aclprofConfig*,                                                                       \
    (uint32_t * deviceIdList, uint32_t deviceNums, aclprofAicoreMetrics aicoreMetrics,                         \
     const aclprofAicoreEvents* aicoreEvents, uint64_t dataTypeConfig))                                        \
  X(aclprofStart, aclError, (const aclprofConfig* profilerConfig))                                             \
  X(aclprofStop, aclError, (const aclprofConfig* profilerConfig))                                              \
  X(aclprofDestroyConfig, aclError, (const aclprofConfig* profilerConfig))                                     \
  X(aclprofFinalize, aclError, ())

/// libnnopbase.so (§2.2).
#define LOOM_ACL_META_FUNCTIONS(X)                                                                             \
  X(aclCreateTensor, aclTensor*,                                                                               \
    (const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t* stride,               \
     int64_t offset, aclFormat format, const int64_t* storageDims, uint64_t storageDimsNum, void* tensorData))  \
  X(aclCreateScalar, aclScalar*, (void* value, aclDataType dataType))                                          \
  X(aclCreateIntArray, aclIntArray*, (const int64_t* value, uint64_t size))                                    \
  X(aclCreateBoolArray, aclBoolArray*, (const bool* value, uint64_t size))                                     \
  X(aclDestroyTensor, aclnnStatus, (const aclTensor* tensor))                                                  \
  X(aclDestroyScalar, aclnnStatus, (const aclScalar* scalar))                                                  \
  X(aclDestroyIntArray, aclnnStatus, (const aclIntArray* array))                                               \
  X(aclDestroyBoolArray, aclnnStatus, (const aclBoolArray* array))

/// The second phase every aclnn operator shares: aclnnXxx(workspace, size, executor, stream).
#define LOOM_ACLNN_PHASE2 (void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream)

/// The op-API libraries: libopapi.so (CANN 8.x) or the split libopapi_{math,nn,transformer}.so
/// (§2.1, §2.5, §2.6). Phase-1 lists end in (uint64_t* workspaceSize, aclOpExecutor** executor).
#define LOOM_ACLNN_FUNCTIONS(X)                                                                                \
  X(aclnnMatmulGetWorkspaceSize, aclnnStatus,                                                                  \
    (const aclTensor* self, const aclTensor* mat2, aclTensor* out, int8_t cubeMathType,                        \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnMatmul, aclnnStatus, LOOM_ACLNN_PHASE2)                                                               \
  X(aclnnAddmmGetWorkspaceSize, aclnnStatus,                                                                   \
    (const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2, const aclScalar* beta,               \
     const aclScalar* alpha, aclTensor* out, int8_t cubeMathType, uint64_t* workspaceSize,                     \
     aclOpExecutor** executor))                                                                                \
  X(aclnnAddmm, aclnnStatus, LOOM_ACLNN_PHASE2)                                                                \
  X(aclnnInplaceAddmmGetWorkspaceSize, aclnnStatus,                                                            \
    (const aclTensor* selfRef, const aclTensor* mat1, const aclTensor* mat2, const aclScalar* beta,            \
     const aclScalar* alpha, int8_t cubeMathType, uint64_t* workspaceSize, aclOpExecutor** executor))          \
  X(aclnnInplaceAddmm, aclnnStatus, LOOM_ACLNN_PHASE2)                                                         \
  X(aclnnLayerNormGetWorkspaceSize, aclnnStatus,                                                               \
    (const aclTensor* input, const aclIntArray* normalizedShape, const aclTensor* weightOptional,              \
     const aclTensor* biasOptional, double eps, aclTensor* out, aclTensor* meanOutOptional,                    \
     aclTensor* rstdOutOptional, uint64_t* workspaceSize, aclOpExecutor** executor))                           \
  X(aclnnLayerNorm, aclnnStatus, LOOM_ACLNN_PHASE2)                                                            \
  X(aclnnLayerNormBackwardGetWorkspaceSize, aclnnStatus,                                                       \
    (const aclTensor* gradOut, const aclTensor* input, const aclIntArray* normalizedShape,                     \
     const aclTensor* mean, const aclTensor* rstd, const aclTensor* weightOptional,                            \
     const aclTensor* biasOptional, const aclBoolArray* outputMask, aclTensor* gradInputOut,                   \
     aclTensor* gradWeightOut, aclTensor* gradBiasOut, uint64_t* workspaceSize, aclOpExecutor** executor))     \
  X(aclnnLayerNormBackward, aclnnStatus, LOOM_ACLNN_PHASE2)                                                    \
  X(aclnnRmsNormGetWorkspaceSize, aclnnStatus,                                                                 \
    (const aclTensor* x, const aclTensor* gamma, double epsilon, const aclTensor* yOut,                        \
     const aclTensor* rstdOut, uint64_t* workspaceSize, aclOpExecutor** executor))                             \
  X(aclnnRmsNorm, aclnnStatus, LOOM_ACLNN_PHASE2)                                                              \
  X(aclnnRmsNormGradGetWorkspaceSize, aclnnStatus,                                                             \
    (const aclTensor* dy, const aclTensor* x, const aclTensor* rstd, const aclTensor* gamma,                   \
     const aclTensor* dxOut, const aclTensor* dgammaOut, uint64_t* workspaceSize, aclOpExecutor** executor))   \
  X(aclnnRmsNormGrad, aclnnStatus, LOOM_ACLNN_PHASE2)                                                          \
  X(aclnnSwiGluGetWorkspaceSize, aclnnStatus,                                                                  \
    (const aclTensor* x, int64_t dim, const aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor)) \
  X(aclnnSwiGlu, aclnnStatus, LOOM_ACLNN_PHASE2)                                                               \
  X(aclnnSwiGluGradGetWorkspaceSize, aclnnStatus,                                                              \
    (const aclTensor* yGrad, const aclTensor* x, int64_t dim, const aclTensor* out, uint64_t* workspaceSize,   \
     aclOpExecutor** executor))                                                                                \
  X(aclnnSwiGluGrad, aclnnStatus, LOOM_ACLNN_PHASE2)                                                           \
  X(aclnnRotaryPositionEmbeddingGetWorkspaceSize, aclnnStatus,                                                 \
    (const aclTensor* x, const aclTensor* cos, const aclTensor* sin, int64_t mode, aclTensor* out,            \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnRotaryPositionEmbedding, aclnnStatus, LOOM_ACLNN_PHASE2)                                              \
  X(aclnnRotaryPositionEmbeddingGradGetWorkspaceSize, aclnnStatus,                                             \
    (const aclTensor* dy, const aclTensor* cos, const aclTensor* sin, const aclTensor* xOptional,             \
     int64_t mode, const aclTensor* dxOut, const aclTensor* dcosOut, const aclTensor* dsinOut,                 \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnRotaryPositionEmbeddingGrad, aclnnStatus, LOOM_ACLNN_PHASE2)                                          \
  X(aclnnGeluV2GetWorkspaceSize, aclnnStatus,                                                                  \
    (const aclTensor* x, int64_t approximate, aclTensor* y, uint64_t* workspaceSize, aclOpExecutor** executor)) \
  X(aclnnGeluV2, aclnnStatus, LOOM_ACLNN_PHASE2)                                                               \
  X(aclnnGeluBackwardV2GetWorkspaceSize, aclnnStatus,                                                          \
    (const aclTensor* gradOutput, const aclTensor* self, char* approximate, aclTensor* gradInput,              \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnGeluBackwardV2, aclnnStatus, LOOM_ACLNN_PHASE2)                                                       \
  X(aclnnAddGetWorkspaceSize, aclnnStatus,                                                                     \
    (const aclTensor* self, const aclTensor* other, const aclScalar* alpha, aclTensor* out,                    \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnAdd, aclnnStatus, LOOM_ACLNN_PHASE2)                                                                  \
  X(aclnnInplaceAddGetWorkspaceSize, aclnnStatus,                                                              \
    (const aclTensor* selfRef, const aclTensor* other, const aclScalar* alpha, uint64_t* workspaceSize,        \
     aclOpExecutor** executor))                                                                                \
  X(aclnnInplaceAdd, aclnnStatus, LOOM_ACLNN_PHASE2)                                                           \
  X(aclnnInplaceAddsGetWorkspaceSize, aclnnStatus,                                                             \
    (const aclTensor* selfRef, const aclScalar* other, const aclScalar* alpha, uint64_t* workspaceSize,        \
     aclOpExecutor** executor))                                                                                \
  X(aclnnInplaceAdds, aclnnStatus, LOOM_ACLNN_PHASE2)                                                          \
  X(aclnnInplaceMulsGetWorkspaceSize, aclnnStatus,                                                             \
    (aclTensor * selfRef, const aclScalar* other, uint64_t* workspaceSize, aclOpExecutor** executor))          \
  X(aclnnInplaceMuls, aclnnStatus, LOOM_ACLNN_PHASE2)                                                          \
  X(aclnnInplaceMulGetWorkspaceSize, aclnnStatus,                                                              \
    (aclTensor * selfRef, const aclTensor* other, uint64_t* workspaceSize, aclOpExecutor** executor))          \
  X(aclnnInplaceMul, aclnnStatus, LOOM_ACLNN_PHASE2)                                                           \
  X(aclnnAmaxGetWorkspaceSize, aclnnStatus,                                                                    \
    (const aclTensor* self, const aclIntArray* dim, bool keepDim, aclTensor* out, uint64_t* workspaceSize,     \
     aclOpExecutor** executor))                                                                                \
  X(aclnnAmax, aclnnStatus, LOOM_ACLNN_PHASE2)                                                                 \
  X(aclnnReduceSumGetWorkspaceSize, aclnnStatus,                                                               \
    (const aclTensor* self, const aclIntArray* dims, bool keepDims, aclDataType dtype, aclTensor* out,         \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnReduceSum, aclnnStatus, LOOM_ACLNN_PHASE2)                                                            \
  X(aclnnClampGetWorkspaceSize, aclnnStatus,                                                                   \
    (const aclTensor* self, const aclScalar* clipValueMin, const aclScalar* clipValueMax, aclTensor* out,      \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnClamp, aclnnStatus, LOOM_ACLNN_PHASE2)                                                                \
  X(aclnnInplaceExpGetWorkspaceSize, aclnnStatus,                                                              \
    (aclTensor * selfRef, uint64_t* workspaceSize, aclOpExecutor** executor))                                  \
  X(aclnnInplaceExp, aclnnStatus, LOOM_ACLNN_PHASE2)                                                           \
  X(aclnnInplaceLogGetWorkspaceSize, aclnnStatus,                                                              \
    (aclTensor * selfRef, uint64_t* workspaceSize, aclOpExecutor** executor))                                  \
  X(aclnnInplaceLog, aclnnStatus, LOOM_ACLNN_PHASE2)                                                           \
  X(aclnnInplaceCopyGetWorkspaceSize, aclnnStatus,                                                             \
    (aclTensor * selfRef, const aclTensor* src, uint64_t* workspaceSize, aclOpExecutor** executor))            \
  X(aclnnInplaceCopy, aclnnStatus, LOOM_ACLNN_PHASE2)                                                          \
  X(aclnnEmbeddingGetWorkspaceSize, aclnnStatus,                                                               \
    (const aclTensor* weight, const aclTensor* indices, const aclTensor* out, uint64_t* workspaceSize,         \
     aclOpExecutor** executor))                                                                                \
  X(aclnnEmbedding, aclnnStatus, LOOM_ACLNN_PHASE2)                                                            \
  X(aclnnEmbeddingDenseBackwardGetWorkspaceSize, aclnnStatus,                                                  \
    (const aclTensor* grad, const aclTensor* indices, uint64_t numWeights, uint64_t paddingIdx,                \
     bool scaleGradByFreq, const aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor))           \
  X(aclnnEmbeddingDenseBackward, aclnnStatus, LOOM_ACLNN_PHASE2)                                               \
  X(aclnnCrossEntropyLossGetWorkspaceSize, aclnnStatus,                                                        \
    (const aclTensor* input, const aclTensor* target, const aclTensor* weightOptional, char* reductionOptional, \
     int64_t ignoreIndex, double labelSmoothing, double lseSquareScaleForZloss, bool returnZloss,              \
     const aclTensor* lossOut, const aclTensor* logProbOut, const aclTensor* zlossOut,                         \
     const aclTensor* lseForZlossOut, uint64_t* workspaceSize, aclOpExecutor** executor))                      \
  X(aclnnCrossEntropyLoss, aclnnStatus, LOOM_ACLNN_PHASE2)                                                     \
  X(aclnnCrossEntropyLossGradGetWorkspaceSize, aclnnStatus,                                                    \
    (const aclTensor* gradLoss, const aclTensor* logProb, const aclTensor* target,                             \
     const aclTensor* weightOptional, const aclTensor* gradZlossOptional, const aclTensor* lseForZlossOptional, \
     char* reductionOptional, int64_t ignoreIndex, double labelSmoothing, double lseSquareScaleForZloss,       \
     const aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor))                                 \
  X(aclnnCrossEntropyLossGrad, aclnnStatus, LOOM_ACLNN_PHASE2)                                                 \
  X(aclnnApplyAdamWV2GetWorkspaceSize, aclnnStatus,                                                            \
    (aclTensor * varRef, aclTensor * mRef, aclTensor * vRef, aclTensor * maxGradNormOptionalRef,               \
     const aclTensor* grad, const aclTensor* step, float lr, float beta1, float beta2, float weightDecay,       \
     float eps, bool amsgrad, bool maximize, uint64_t* workspaceSize, aclOpExecutor** executor))               \
  X(aclnnApplyAdamWV2, aclnnStatus, LOOM_ACLNN_PHASE2)                                                         \
  X(aclnnIsFiniteGetWorkspaceSize, aclnnStatus,                                                                \
    (const aclTensor* self, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor))                \
  X(aclnnIsFinite, aclnnStatus, LOOM_ACLNN_PHASE2)                                                             \
  X(aclnnFlashAttentionScoreGetWorkspaceSize, aclnnStatus,                                                     \
    (const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional, \
     const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,                                  \
     const aclTensor* attenMaskOptional, const aclIntArray* prefixOptional, double scaleValue,                 \
     double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,               \
     int64_t innerPrecise, int64_t sparseMode, const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut, \
     const aclTensor* softmaxOutOut, const aclTensor* attentionOutOut, uint64_t* workspaceSize,                \
     aclOpExecutor** executor))                                                                                \
  X(aclnnFlashAttentionScore, aclnnStatus, LOOM_ACLNN_PHASE2)                                                  \
  X(aclnnFlashAttentionScoreGradGetWorkspaceSize, aclnnStatus,                                                 \
    (const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,              \
     const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional,                                     \
     const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,                                 \
     const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,                                 \
     const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional,                                 \
     const aclIntArray* prefixOptional, double scaleValue, double keepProb, int64_t preTokens,                 \
     int64_t nextTokens, int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode,         \
     const aclTensor* dqOut, const aclTensor* dkOut, const aclTensor* dvOut, const aclTensor* dpseOut,         \
     uint64_t* workspaceSize, aclOpExecutor** executor))                                                       \
  X(aclnnFlashAttentionScoreGrad, aclnnStatus, LOOM_ACLNN_PHASE2)

/// libhccl.so (+ libhcomm.so for communicator management on the newest CANN, §3.1, §3.3).
#define LOOM_HCCL_FUNCTIONS(X)                                                                                 \
  X(HcclCommInitClusterInfo, HcclResult, (const char* clusterInfo, uint32_t rank, HcclComm* comm))             \
  X(HcclGetRootInfo, HcclResult, (HcclRootInfo * rootInfo))                                                    \
  X(HcclCommInitRootInfo, HcclResult,                                                                          \
    (uint32_t nRanks, const HcclRootInfo* rootInfo, uint32_t rank, HcclComm* comm))                            \
  X(HcclCreateSubCommConfig, HcclResult,                                                                       \
    (HcclComm * comm, uint32_t rankNum, uint32_t * rankIds, uint64_t subCommId, uint32_t subCommRankId,        \
     HcclCommConfig * config, HcclComm * subComm))                                                             \
  X(HcclCommDestroy, HcclResult, (HcclComm comm))                                                              \
  X(HcclGetErrorString, const char*, (HcclResult code))                                                        \
  X(HcclAllReduce, HcclResult,                                                                                 \
    (void* sendBuf, void* recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op, HcclComm comm,      \
     aclrtStream stream))                                                                                      \
  X(HcclAllGather, HcclResult,                                                                                 \
    (void* sendBuf, void* recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,                   \
     aclrtStream stream))                                                                                      \
  X(HcclReduceScatter, HcclResult,                                                                             \
    (void* sendBuf, void* recvBuf, uint64_t recvCount, HcclDataType dataType, HcclReduceOp op, HcclComm comm,  \
     aclrtStream stream))                                                                                      \
  X(HcclBroadcast, HcclResult,                                                                                 \
    (void* buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm, aclrtStream stream))      \
  X(HcclSend, HcclResult,                                                                                      \
    (void* sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,                   \
     aclrtStream stream))                                                                                      \
  X(HcclRecv, HcclResult,                                                                                      \
    (void* recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm, aclrtStream stream)) \
  X(HcclBarrier, HcclResult, (HcclComm comm, aclrtStream stream))

/// The resolved entry points. A null member means the loaded libraries do not export it
/// (ascend_runtime reports which; only the optional/op/HCCL groups may be partly null).
struct api_table {
#define LOOM_ACL_MEMBER(name, ret, params) ret(*name) params = nullptr;
  LOOM_ACL_RUNTIME_FUNCTIONS(LOOM_ACL_MEMBER)
  LOOM_ACL_OPTIONAL_FUNCTIONS(LOOM_ACL_MEMBER)
  LOOM_ACL_NEWER_FUNCTIONS(LOOM_ACL_MEMBER)
  LOOM_ACL_META_FUNCTIONS(LOOM_ACL_MEMBER)
  LOOM_ACLNN_FUNCTIONS(LOOM_ACL_MEMBER)
  LOOM_HCCL_FUNCTIONS(LOOM_ACL_MEMBER)
  LOOM_ACL_PROF_FUNCTIONS(LOOM_ACL_MEMBER)
#undef LOOM_ACL_MEMBER
};

#if LOOM_ASCEND_USE_CANN_HEADERS
// Drift check: each pointer type of the table equals the type of the vendor's declaration.
#define LOOM_ACL_DRIFT_CHECK(name, ret, params)                                        \
  static_assert(std::is_same_v<decltype(&::name), decltype(api_table::name)>,           \
                "CANN header drift: the vendor's " #name " differs from loom's declaration " \
                "(include/loom/device/detail/acl_api.hpp)");
LOOM_ACL_RUNTIME_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
LOOM_ACL_OPTIONAL_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
#if ACL_MAJOR_VERSION * 100 + ACL_MINOR_VERSION >= 117 || LOOM_ACL_CHECK_NEWER_FUNCTIONS
LOOM_ACL_NEWER_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
#endif
LOOM_ACL_META_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
LOOM_ACLNN_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
LOOM_HCCL_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
LOOM_ACL_PROF_FUNCTIONS(LOOM_ACL_DRIFT_CHECK)
#undef LOOM_ACL_DRIFT_CHECK
#endif

}  // namespace loom::device::acl
