/*
 * Control interface of loom's HOST EMULATION of CANN (ACL / aclnn / HCCL). NOT part of CANN: a real
 * toolkit has no such functions. Tests use it to inject failures, shrink device memory, and read
 * counters that prove the emulation's checks ran.
 */
#ifndef LOOM_EMULATION_CONTROL_H_
#define LOOM_EMULATION_CONTROL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes calls to the API named `api` (e.g. "aclrtMalloc", "aclnnMatmulGetWorkspaceSize",
 * "aclnnMatmul", "HcclAllReduce") fail with `code`: the first `skip` calls succeed, the next
 * `count` calls fail (count < 0: every call fails until cleared). The failing call sets
 * aclGetRecentErrMsg() to "loom emulation: injected failure of <api>". */
void loomemu_inject_failure(const char *api, int code, int skip, int count);

/* Clears every injected failure and restores default limits. Does not free memory. */
void loomemu_reset(void);

/* Limits the emulated device memory of `device` to `bytes` (default 16 GiB per device). An
 * allocation beyond it fails with ACL_ERROR_RT_MEMORY_ALLOCATION. */
void loomemu_set_device_memory_limit(int device, size_t bytes);

/* Number of emulated devices (default 8); takes effect for later aclrtGetDeviceCount calls. */
void loomemu_set_device_count(int count);

/* The buffer size (MB) and determinism (0 off, 1 on, 2 strict) a live HCCL communicator was
 * created with: its HcclCommConfig's values, or HCCL_BUFFSIZE / HCCL_DETERMINISTIC (defaults 200,
 * 0) where the config says "not set" (0xffffffff) or there is no config. Returns 0, or
 * HCCL_E_PARA (1) for a handle that is not a live communicator. Exported by the emulated
 * libhccl.so. */
int loomemu_hccl_comm_config(void *comm, uint32_t *buffsize_mb, uint32_t *deterministic);

/* Counters since process start. */
typedef struct {
  uint64_t device_mallocs;      /* successful aclrtMalloc */
  uint64_t device_frees;        /* successful aclrtFree */
  uint64_t live_device_allocs;  /* allocated and not freed */
  size_t live_device_bytes;     /* requested bytes of live device allocations */
  uint64_t host_pinned_allocs;  /* live aclrtMallocHost blocks */
  uint64_t executors_created;   /* phase-1 calls that returned an executor */
  uint64_t executors_run;       /* phase-2 calls enqueued */
  uint64_t tasks_executed;      /* stream tasks run by the workers */
  uint64_t checks_failed;       /* API calls rejected by a validation check */
  uint64_t async_copies;        /* aclrtMemcpyAsync calls accepted */
  uint64_t sync_copies;         /* aclrtMemcpy calls accepted */
  uint64_t host_waits;          /* aclrtSynchronize{Stream,Event,Device}[WithTimeout] calls: the host
                                   waits for the device */
  uint64_t h2d_copies_behind_work; /* host-to-device aclrtMemcpyAsync calls enqueued while their
                                      stream still had aclnn operators queued or running: the
                                      host prepared the data while the device computed */
  uint64_t h2d_copies_beside_work; /* host-to-device copy tasks that started executing while another
                                      stream of the same NPU had aclnn operators queued or running:
                                      the copy overlapped computation (a copy stream) */
} loomemu_counters;
loomemu_counters loomemu_get_counters(void);

/* The emulated profiler (libmsprofiler.so, acl/acl_prof.h) logs every successful session call.
 * `executors_run` is loomemu_counters.executors_run at the call: the aclnn launches enqueued
 * before it, so a test can tell exactly which launches (steps) fell inside start..stop. */
typedef enum { LOOMEMU_PROF_INIT, LOOMEMU_PROF_START, LOOMEMU_PROF_STOP, LOOMEMU_PROF_FINALIZE } loomemu_prof_kind;
typedef struct {
  int kind;                  /* loomemu_prof_kind */
  uint64_t executors_run;    /* aclnn phase-2 calls enqueued before this call */
  uint64_t data_type_config; /* START/STOP: the config's dataTypeConfig */
  uint32_t device_count;     /* START/STOP: the config's device count */
} loomemu_prof_event;
/* Copies up to `capacity` logged events (oldest first) to `out`; returns how many are logged.
 * Exported by the emulated libmsprofiler.so. */
size_t loomemu_profiler_log(loomemu_prof_event *out, size_t capacity);
/* Forgets the log (not the session state). */
void loomemu_profiler_clear(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_EMULATION_CONTROL_H_ */
