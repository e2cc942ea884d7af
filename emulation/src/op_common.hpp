// loom's HOST EMULATION of CANN aclnn operators: what every operator file shares — the phase-1
// fault injection, the required-pointer check, the phase-2 entry point and the 161002 rejection.
#pragma once

#include <string>

#include "internal.hpp"

namespace loomemu {

/// FLOAT, FLOAT16 or BFLOAT16: the storage types the nn operators document.
inline bool is_nn_float(aclDataType dt) { return dt == ACL_FLOAT || dt == ACL_FLOAT16 || dt == ACL_BF16; }

/// Rejects a phase-1 call with 161002 (ACLNN_ERR_PARAM_INVALID) and the reason.
inline aclnnStatus invalid(const char* name, const std::string& why) { return reject(name, param_invalid, why); }

}  // namespace loomemu

/// Returns the status a test injected for `name`'s phase 1, if any.
#define INJECT_PHASE1(name)                                    \
  do {                                                         \
    if (int injected_code = injected(name "GetWorkspaceSize")) \
      return injected_code;                                    \
  } while (0)

/// Rejects a phase-1 call with 161001 (ACLNN_ERR_PARAM_NULLPTR) when a required pointer is null.
#define NEED(ptr, name, what)                                                       \
  do {                                                                              \
    if (!(ptr)) return reject(name, param_nullptr, std::string(what) + " is NULL"); \
  } while (0)

/// Defines operator `op`'s phase 2: validates the executor and enqueues its computation.
#define PHASE2(op)                                                                              \
  extern "C" aclnnStatus op(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, \
                            aclrtStream stream) {                                              \
    return launch(#op, workspace, workspaceSize, executor, stream);                            \
  }
