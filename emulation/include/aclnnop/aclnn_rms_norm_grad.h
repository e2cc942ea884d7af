/*
 * loom's HOST EMULATION of the Huawei CANN aclnn operator API — NOT the vendor header and NOT the
 * vendor library. CANN generates this header with its closed op_build; the phase-1 parameter list
 * restates the prototype documented in the operator repository (hicann/ops-nn v9.0.0
 * docs/aclnnRmsNormGrad.md, "函数原型"); nothing was copied. The emulated operator computes on host memory.
 */
#ifndef LOOM_EMULATION_ACLNNOP_ACLNN_RMS_NORM_GRAD_H_
#define LOOM_EMULATION_ACLNNOP_ACLNN_RMS_NORM_GRAD_H_

#include "acl/acl_base.h"
#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnRmsNormGradGetWorkspaceSize(
    const aclTensor *dy,
    const aclTensor *x,
    const aclTensor *rstd,
    const aclTensor *gamma,
    const aclTensor *dxOut,
    const aclTensor *dgammaOut,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnRmsNormGrad(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNNOP_ACLNN_RMS_NORM_GRAD_H_ */
