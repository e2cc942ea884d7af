/*
 * loom's HOST EMULATION of the Huawei HCCL API — NOT the vendor header and NOT the vendor library.
 * Signatures as documented in loom's API reference §3.3 (CANN 8.1.RC1); nothing copied.
 * Emulation: ranks are threads of one process (each calls aclrtSetDevice for its own emulated
 * device); the root info is a process-local id; collectives execute, in stream order, on the
 * emulated stream's worker thread and rendezvous with the other ranks' workers.
 */
#ifndef LOOM_EMULATION_HCCL_HCCL_H_
#define LOOM_EMULATION_HCCL_HCCL_H_

#include <string.h>

#include "acl/acl.h"
#include "hccl/hccl_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the versioned header {size, magic, version} and the "not set" defaults. */
static inline void HcclCommConfigInit(HcclCommConfig *config) {
  typedef struct {
    size_t size;
    uint32_t magicWord;
    uint32_t version;
    uint64_t reserved;
  } header_t;
  header_t *h = (header_t *)config->reserved;
  h->size = sizeof(HcclCommConfig);
  h->magicWord = HCCL_COMM_CONFIG_MAGIC_WORD;
  h->version = HCCL_COMM_CONFIG_VERSION;
  h->reserved = 0;
  config->hcclBufferSize = HCCL_COMM_DEFAULT_BUFFSIZE;
  config->hcclDeterministic = 0;
  memset(config->hcclCommName, 0, sizeof(config->hcclCommName));
  memset(config->hcclUdi, 0, sizeof(config->hcclUdi));
  config->hcclOpExpansionMode = 0;
  config->hcclRdmaTrafficClass = 0xffffffffu;
  config->hcclRdmaServiceLevel = 0xffffffffu;
}

/* Joins the ranks listed in the rank table file clusterInfo (JSON, template version 1.0) as rank
 * `rank`; every rank of the table must call it (HCCL_CONNECT_TIMEOUT). */
extern HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm);
extern HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
extern HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm);
extern HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                             const HcclCommConfig *config, HcclComm *comm);
extern HcclResult HcclCreateSubCommConfig(HcclComm *comm, uint32_t rankNum, uint32_t *rankIds, uint64_t subCommId,
                                          uint32_t subCommRankId, HcclCommConfig *config, HcclComm *subComm);
extern HcclResult HcclCommDestroy(HcclComm comm);
extern HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
extern HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
extern HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError);
extern const char *HcclGetErrorString(HcclResult code);

extern HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                                HcclComm comm, aclrtStream stream);
extern HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
                                HcclComm comm, aclrtStream stream);
extern HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                    HcclReduceOp op, HcclComm comm, aclrtStream stream);
extern HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                                aclrtStream stream);
extern HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                           aclrtStream stream);
extern HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                           aclrtStream stream);
extern HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_HCCL_HCCL_H_ */
