/*
 * loom's HOST EMULATION of the Huawei CANN aclnn operator API — NOT the vendor header and NOT the
 * vendor library. The phase-1 parameter list restates the prototype documented in
 * hicann/ops-transformer v9.0.0 posembedding/rotary_position_embedding/docs/
 * aclnnRotaryPositionEmbedding.md ("函数原型"); nothing was copied. The emulated operator computes on
 * host memory.
 */
#ifndef LOOM_EMULATION_ACLNNOP_ACLNN_ROTARY_POSITION_EMBEDDING_H_
#define LOOM_EMULATION_ACLNNOP_ACLNN_ROTARY_POSITION_EMBEDDING_H_

#include "acl/acl_base.h"
#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnRotaryPositionEmbeddingGetWorkspaceSize(
    const aclTensor *x,
    const aclTensor *cos,
    const aclTensor *sin,
    int64_t mode,
    aclTensor *out,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnRotaryPositionEmbedding(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNNOP_ACLNN_ROTARY_POSITION_EMBEDDING_H_ */
