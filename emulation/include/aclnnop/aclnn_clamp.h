/*
 * loom's HOST EMULATION of the Huawei CANN aclnn operator API — NOT the vendor header and NOT the
 * vendor library. The phase-1 parameter list restates the prototype documented in hicann/ops-math
 * conversion/clip_by_value_v2/docs/aclnnClamp.md ("函数原型"); nothing was copied. The emulated
 * operator computes on host memory.
 */
#ifndef LOOM_EMULATION_ACLNNOP_ACLNN_CLAMP_H_
#define LOOM_EMULATION_ACLNNOP_ACLNN_CLAMP_H_

#include "acl/acl_base.h"
#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnClampGetWorkspaceSize(
    const aclTensor *self,
    const aclScalar *clipValueMin,
    const aclScalar *clipValueMax,
    aclTensor *out,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnClamp(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    const aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNNOP_ACLNN_CLAMP_H_ */
