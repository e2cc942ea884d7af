/*
 * loom's HOST EMULATION of the Huawei CANN aclnn operator API — NOT the vendor header and NOT the
 * vendor library. The phase-1 parameter list restates the signature documented in loom's API
 * reference (§2.5/§2.6, CANN 8.1.RC1 headers) or, where noted in docs/ascend.md, the op's
 * official documentation; nothing was copied. The emulated operator computes on host memory.
 */
#ifndef LOOM_EMULATION_ACLNNOP_ACLNN_FLASH_ATTENTION_SCORE_GRAD_H_
#define LOOM_EMULATION_ACLNNOP_ACLNN_FLASH_ATTENTION_SCORE_GRAD_H_

#include "acl/acl_base.h"
#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradGetWorkspaceSize(
    const aclTensor *query,
    const aclTensor *keyIn,
    const aclTensor *value,
    const aclTensor *dy,
    const aclTensor *pseShiftOptional,
    const aclTensor *dropMaskOptional,
    const aclTensor *paddingMaskOptional,
    const aclTensor *attenMaskOptional,
    const aclTensor *softmaxMaxOptional,
    const aclTensor *softmaxSumOptional,
    const aclTensor *softmaxInOptional,
    const aclTensor *attentionInOptional,
    const aclIntArray *prefixOptional,
    double scaleValue,
    double keepProb,
    int64_t preTokens,
    int64_t nextTokens,
    int64_t headNum,
    char *inputLayout,
    int64_t innerPrecise,
    int64_t sparseMode,
    const aclTensor *dqOut,
    const aclTensor *dkOut,
    const aclTensor *dvOut,
    const aclTensor *dpseOut,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnFlashAttentionScoreGrad(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNNOP_ACLNN_FLASH_ATTENTION_SCORE_GRAD_H_ */
