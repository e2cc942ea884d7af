/*
 * loom's HOST EMULATION of the Huawei CANN ACL API — NOT the vendor header (see acl/acl_base.h).
 *
 * acl/acl.h: the umbrella header; process init/finalize, versions, the last error message.
 * As in CANN 8.1.RC1 these are declared here (newer ACL moved them to acl_rt.h; including
 * acl/acl.h works for both).
 */
#ifndef LOOM_EMULATION_ACL_ACL_H_
#define LOOM_EMULATION_ACL_ACL_H_

#include "acl/acl_rt.h"
#include "acl/error_codes/rt_error_codes.h"

#define ACL_MAJOR_VERSION 1
#define ACL_MINOR_VERSION 13
#define ACL_PATCH_VERSION 0
#define ACL_PKG_VERSION_MAX_SIZE 128
#define ACL_PKG_VERSION_PARTS_MAX_SIZE 64

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ACL_PKG_NAME_CANN,
  ACL_PKG_NAME_RUNTIME,
  ACL_PKG_NAME_COMPILER,
  ACL_PKG_NAME_HCCL,
  ACL_PKG_NAME_TOOLKIT,
  ACL_PKG_NAME_OPP,
  ACL_PKG_NAME_OPP_KERNEL,
  ACL_PKG_NAME_DRIVER
} aclCANNPackageName;

typedef struct {
  char version[ACL_PKG_VERSION_MAX_SIZE];
  char majorVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char minorVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char releaseVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char patchVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char reserved[ACL_PKG_VERSION_MAX_SIZE];
} aclCANNPackageVersion;

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
ACL_FUNC_VISIBILITY aclError aclFinalize();
ACL_FUNC_VISIBILITY aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion);
ACL_FUNC_VISIBILITY const char *aclGetRecentErrMsg();
ACL_FUNC_VISIBILITY aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion *version);

/* Newer runtime (ACL 1.17, CANN 9.0, declared in acl/acl_rt.h there); the emulation exports them
 * too so both of loom's paths run. The ACL interface version above stays 1.13 (8.1.RC1). */
ACL_FUNC_VISIBILITY aclError aclFinalizeReference(uint64_t *refCount);
ACL_FUNC_VISIBILITY aclError aclsysGetVersionStr(char *pkgName, char *versionStr);
ACL_FUNC_VISIBILITY aclError aclsysGetVersionNum(char *pkgName, int32_t *versionNum);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_ACL_ACL_H_ */
