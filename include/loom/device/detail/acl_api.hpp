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
#include <hccl/hccl.h>
#include <aclnnop/aclnn_cross_entropy_loss.h>
#include <aclnnop/aclnn_cross_entropy_loss_grad.h>
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
/// HcclCommConfig as of CANN 8.1.RC1 (config version 5, §3.2). Versioned: only initialise it
/// with hccl_comm_config_init below.
struct HcclCommConfig {
  char reserved[24];
  uint32_t hcclBufferSize;
  uint32_t hcclDeterministic;
  char hcclCommName[128];
  char hcclUdi[128];
  uint32_t hcclOpExpansionMode;
  uint32_t hcclRdmaTrafficClass;
  uint32_t hcclRdmaServiceLevel;
};
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
                  pkg_version_max == ACL_PKG_VERSION_MAX_SIZE,
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

/// Fills an HcclCommConfig with its versioned header and "not set" defaults. With the vendor
/// headers this is the vendor's inline HcclCommConfigInit. Without them it restates what that
/// inline function does in CANN 8.1.RC1 (§3.2: header {size, magic 0xf0f0f0f0, version 5} in
/// `reserved`, buffer size 200 MB, 0xffffffff sentinels); the header's exact byte layout is
/// unconfirmed — loom itself only passes the defaults.
inline void hccl_comm_config_init(HcclCommConfig* config) noexcept {
#if LOOM_ASCEND_USE_CANN_HEADERS
  HcclCommConfigInit(config);
#else
  *config = HcclCommConfig{};
  struct header {
    std::size_t size;
    uint32_t magic;
    uint32_t version;
    uint64_t reserved;
  };
  static_assert(sizeof(header) <= sizeof(config->reserved));
  header h{sizeof(HcclCommConfig), 0xf0f0f0f0u, 5u, 0};
  __builtin_memcpy(config->reserved, &h, sizeof h);
  config->hcclBufferSize = 200;
  config->hcclRdmaTrafficClass = 0xffffffffu;
  config->hcclRdmaServiceLevel = 0xffffffffu;
#endif
}

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
/// deprecated in the newest runtime, so it is not required.
#define LOOM_ACL_OPTIONAL_FUNCTIONS(X)                                                                         \
  X(aclrtGetVersion, aclError, (int32_t * majorVersion, int32_t * minorVersion, int32_t * patchVersion))       \
  X(aclrtGetSocName, const char*, ())

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
