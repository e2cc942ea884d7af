#pragma once
/// \file acl_check, aclnn_check: ACL and aclnn status codes become loom::device_error.
///
/// ggml-cann's ACL_CHECK idea without a macro (STYLE §3.11): the call site comes from
/// loom::source_location, the message from aclGetRecentErrMsg(), which the reference recommends
/// reading after any failing acl/aclnn call. what() reads
///   "<file>:<line>: <api> failed with code <code>: <recent error message> [hint]".
/// Cleanup paths (destructors, deallocate) use acl_warn, which reports on stderr and never throws.
/// Source: loom's API reference (shared/reference/ascend-api.md) §1.2, §1.3, §2.4, §7.
#include <cstdio>
#include <string>
#include <string_view>

#include <loom/core/error.hpp>
#include <loom/device/detail/acl_api.hpp>

namespace loom::device::detail {

/// Status codes loom reacts to. Spelled out here rather than taken from the vendor headers,
/// because the aclnn status macros' home header differs across CANN versions.
namespace acl_status {
inline constexpr int repeat_initialize = 100002;        // ACL_ERROR_REPEAT_INITIALIZE
inline constexpr int uninitialized = 100001;            // ACL_ERROR_UNINITIALIZE
inline constexpr int bad_alloc = 200000;                // ACL_ERROR_BAD_ALLOC
inline constexpr int invalid_device = 200002;           // ACL_ERROR_INVALID_DEVICE
inline constexpr int rt_invalid_device_id = 107001;     // ACL_ERROR_RT_INVALID_DEVICEID
inline constexpr int rt_memory_allocation = 207001;     // ACL_ERROR_RT_MEMORY_ALLOCATION (device OOM)
inline constexpr int rt_no_device = 207004;             // ACL_ERROR_RT_NO_DEVICE
inline constexpr int rt_aicore_exception = 507015;      // ACL_ERROR_RT_AICORE_EXCEPTION
inline constexpr int rt_stream_sync_timeout = 507046;   // ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
inline constexpr int rt_event_sync_timeout = 507047;    // ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
inline constexpr int rt_task_timeout = 107020;          // ACL_ERROR_RT_TASK_TIMEOUT (e.g. HCCL_EXEC_TIMEOUT)
inline constexpr int aclnn_param_nullptr = 161001;      // ACLNN_ERR_PARAM_NULLPTR
inline constexpr int aclnn_param_invalid = 161002;      // ACLNN_ERR_PARAM_INVALID
inline constexpr int aclnn_tiling_error = 561002;       // ACLNN_ERR_INNER_TILING_ERROR
inline constexpr int aclnn_find_kernel_error = 561003;  // ACLNN_ERR_INNER_FIND_KERNEL_ERROR
inline constexpr int aclnn_opp_path_not_found = 561107; // ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND
}  // namespace acl_status

/// What the user can do about a status code, or "" when there is nothing specific to say.
inline std::string_view acl_hint(int code) noexcept {
  switch (code) {
    case acl_status::uninitialized: return "ACL is not initialised: create a loom::device::ascend_device first";
    case acl_status::invalid_device:
    case acl_status::rt_invalid_device_id:
      return "no such NPU, or no current NPU on this thread: every thread that issues work needs a "
             "loom::device::ascend_device or device_guard (aclrtSetDevice is per thread); check "
             "ASCEND_RT_VISIBLE_DEVICES";
    case acl_status::rt_no_device: return "no NPU is visible: check the driver (npu-smi info) and ASCEND_RT_VISIBLE_DEVICES";
    case acl_status::rt_memory_allocation:
    case acl_status::bad_alloc: return "out of device memory: lower the micro-batch or enable recomputation";
    case acl_status::rt_aicore_exception:
      return "a kernel faulted on the NPU (often an index out of range or a freed buffer); errors of asynchronous "
             "work surface at the next synchronize, not at the call that caused them";
    case acl_status::aclnn_param_invalid: return "the operator rejected a dtype, shape or stride (see the message)";
    case acl_status::aclnn_tiling_error: return "the operator does not support this shape/attribute combination";
    case acl_status::aclnn_find_kernel_error:
      return "no kernel binary for this operator on this SoC: the operator package is missing or the op is not "
             "supported on this chip";
    case acl_status::aclnn_opp_path_not_found: return "ASCEND_OPP_PATH is not set: source the CANN set_env.sh";
    default: return {};
  }
}

/// The thread's most recent ACL error text ("" when the runtime has none).
inline std::string acl_recent_message(const acl::api_table& api) {
  const char* m = api.aclGetRecentErrMsg ? api.aclGetRecentErrMsg() : nullptr;
  return m ? std::string(m) : std::string();
}

/// Builds the exception for a failed call (message + hint).
inline device_error acl_error(const acl::api_table& t, int rc, std::string_view api, loom::source_location where) {
  std::string msg = acl_recent_message(t);
  if (const auto hint = acl_hint(rc); !hint.empty()) msg += (msg.empty() ? "" : " — ") + std::string(hint);
  return device_error(rc, api, msg, where);
}

/// Throws loom::device_error unless rc == ACL_SUCCESS. Usage:
///   acl_check(api, api.aclrtSynchronizeStream(s), "aclrtSynchronizeStream");
inline void acl_check(const acl::api_table& t, int rc, std::string_view api,
                      loom::source_location where = loom::source_location::current()) {
  if (rc == acl::success) [[likely]]
    return;
  throw acl_error(t, rc, api, where);
}

/// Same for aclnnStatus (an int32, 0 = success) of the two-phase operator calls.
inline void aclnn_check(const acl::api_table& t, int rc, std::string_view api,
                        loom::source_location where = loom::source_location::current()) {
  if (rc == 0) [[likely]]
    return;
  throw acl_error(t, rc, api, where);
}

/// For destructors and deallocation: reports a failure on stderr, never throws.
inline void acl_warn(const acl::api_table& t, int rc, std::string_view api) noexcept {
  if (rc == acl::success) return;
  const char* m = t.aclGetRecentErrMsg ? t.aclGetRecentErrMsg() : nullptr;
  std::fprintf(stderr, "loom: warning: %.*s failed with code %d during cleanup: %s\n", int(api.size()), api.data(),
               rc, m ? m : "");
}

}  // namespace loom::device::detail
