/*
 * loom's HOST EMULATION of the Huawei CANN ACL API — NOT the vendor header (see acl/acl_base.h).
 *
 * acl/acl_prof.h: the profiling C API (library libmsprofiler.so), the subset loom calls, restated
 * from loom's API reference (shared/reference/ascend-api.md §5.1, CANN 8.1.RC1 [H]): a session
 * (aclprofInit/aclprofFinalize), a config naming devices and data switches, start/stop. As in CANN,
 * acl/acl.h does not include this header.
 */
#ifndef LOOM_EMULATION_ACL_ACL_PROF_H_
#define LOOM_EMULATION_ACL_ACL_PROF_H_

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dataTypeConfig switches (uint64 bit flags, 8.1.RC1) */
#define ACL_PROF_ACL_API 0x0001ULL
#define ACL_PROF_TASK_TIME 0x0002ULL
#define ACL_PROF_AICORE_METRICS 0x0004ULL
#define ACL_PROF_AICPU 0x0008ULL
#define ACL_PROF_L2CACHE 0x0010ULL
#define ACL_PROF_HCCL_TRACE 0x0020ULL
#define ACL_PROF_TRAINING_TRACE 0x0040ULL
#define ACL_PROF_MSPROFTX 0x0080ULL
#define ACL_PROF_RUNTIME_API 0x0100ULL
#define ACL_PROF_TASK_TIME_L0 0x0800ULL
#define ACL_PROF_TASK_MEMORY 0x1000ULL
#define ACL_PROF_OP_ATTR 0x4000ULL

typedef enum aclprofAicoreMetrics {
  ACL_AICORE_ARITHMETIC_UTILIZATION = 0,
  ACL_AICORE_PIPE_UTILIZATION = 1,
  ACL_AICORE_MEMORY_BANDWIDTH = 2,
  ACL_AICORE_L0B_AND_WIDTH = 3,
  ACL_AICORE_RESOURCE_CONFLICT_RATIO = 4,
  ACL_AICORE_MEMORY_UB = 5,
  ACL_AICORE_L2_CACHE = 6,
  ACL_AICORE_PIPE_EXECUTE_UTILIZATION = 7,
  ACL_AICORE_MEMORY_ACCESS = 8,
  ACL_AICORE_NONE = 0xFF
} aclprofAicoreMetrics;

typedef struct aclprofConfig aclprofConfig;
typedef struct aclprofAicoreEvents aclprofAicoreEvents;

ACL_FUNC_VISIBILITY aclError aclprofInit(const char *profilerResultPath, size_t length);
ACL_FUNC_VISIBILITY aclprofConfig *aclprofCreateConfig(uint32_t *deviceIdList, uint32_t deviceNums,
                                                       aclprofAicoreMetrics aicoreMetrics,
                                                       const aclprofAicoreEvents *aicoreEvents,
                                                       uint64_t dataTypeConfig);
ACL_FUNC_VISIBILITY aclError aclprofStart(const aclprofConfig *profilerConfig);
ACL_FUNC_VISIBILITY aclError aclprofStop(const aclprofConfig *profilerConfig);
ACL_FUNC_VISIBILITY aclError aclprofDestroyConfig(const aclprofConfig *profilerConfig);
ACL_FUNC_VISIBILITY aclError aclprofFinalize();

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACL_ACL_PROF_H_ */
