/*
 * loom's HOST EMULATION of the Huawei CANN aclnn operator API — NOT the vendor header and NOT the
 * vendor library. CANN generates this header with its closed op_build; the phase-1 parameter list
 * restates the prototype documented in hicann/ops-transformer v9.0.0
 * posembedding/rotary_position_embedding_grad/docs/aclnnRotaryPositionEmbeddingGrad.md
 * ("函数原型"); nothing was copied. The emulated operator computes on host memory.
 */
#ifndef LOOM_EMULATION_ACLNNOP_ACLNN_ROTARY_POSITION_EMBEDDING_GRAD_H_
#define LOOM_EMULATION_ACLNNOP_ACLNN_ROTARY_POSITION_EMBEDDING_GRAD_H_

#include "acl/acl_base.h"
#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnRotaryPositionEmbeddingGradGetWorkspaceSize(
    const aclTensor *dy,
    const aclTensor *cos,
    const aclTensor *sin,
    const aclTensor *xOptional,
    int64_t mode,
    const aclTensor *dxOut,
    const aclTensor *dcosOut,
    const aclTensor *dsinOut,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnRotaryPositionEmbeddingGrad(void *workspace, uint64_t workspaceSize,
    aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNNOP_ACLNN_ROTARY_POSITION_EMBEDDING_GRAD_H_ */
