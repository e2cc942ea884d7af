/*
 * loom's HOST EMULATION of the Huawei CANN aclnn API — NOT the vendor header (see acl/acl_base.h).
 * aclnn/aclnn_base.h: includes acl_meta.h and declares the optional global init (§2.1).
 */
#ifndef LOOM_EMULATION_ACLNN_ACLNN_BASE_H_
#define LOOM_EMULATION_ACLNN_ACLNN_BASE_H_

#include "acl/acl_base.h"
#include "aclnn/acl_meta.h"

#define ACLNN_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnInit(const char *configPath);
ACLNN_API aclnnStatus aclnnFinalize();

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACLNN_ACLNN_BASE_H_ */
