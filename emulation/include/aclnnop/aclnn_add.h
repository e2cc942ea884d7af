/*
 * loom's HOST EMULATION of the Huawei CANN aclnn operator API — NOT the vendor header and NOT the
 * vendor library. The phase-1 parameter list restates the signature documented in loom's API
 * reference (§2.5/§2.6, CANN 8.1.RC1 headers) or, where noted in docs/ascend.md, the op's
 * official documentation; nothing was copied. The emulated operator computes on host memory.
 */
#ifndef LOOM_EMULATION_ACLNNOP_ACLNN_ADD_H_
#define LOOM_EMULATION_ACLNNOP_ACLNN_ADD_H_

#include "acl/acl_base.h"
#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnAddGetWorkspaceSize(
    const aclTensor *self,
    const aclTensor *other,
    const aclScalar *alpha,
    aclTensor *out,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnAdd(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);
ACLNN_API aclnnStatus aclnnAddsGetWorkspaceSize(
    const aclTensor *self,
    const aclScalar *other,
    const aclScalar *alpha,
    aclTensor *out,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnAdds(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);
ACLNN_API aclnnStatus aclnnInplaceAddGetWorkspaceSize(
    const aclTensor *selfRef,
    const aclTensor *other,
    const aclScalar *alpha,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnInplaceAdd(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);
ACLNN_API aclnnStatus aclnnInplaceAddsGetWorkspaceSize(
    const aclTensor *selfRef,
    const aclScalar *other,
    const aclScalar *alpha,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnInplaceAdds(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNNOP_ACLNN_ADD_H_ */
