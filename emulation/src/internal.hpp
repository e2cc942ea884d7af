// loom's HOST EMULATION of CANN (ACL runtime, aclnn, HCCL) — NOT the vendor library.
// Internal declarations shared by the emulation's translation units.
//
// Model of the device: memory is host memory tracked in a registry (device id, size, kind); a
// stream is an in-order queue drained by its own worker thread, so work really runs
// asynchronously and a missing synchronize shows up as stale data; aclnn phase 1 validates the
// descriptors and captures a closure, phase 2 enqueues it. Every rejected call sets the thread's
// recent error message (aclGetRecentErrMsg) and counts as a failed check.
#pragma once

#include <acl/acl.h>
#include <aclnn/acl_meta.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

// --- descriptor objects (opaque in the public headers) -------------------------------------------
struct aclTensor {
  std::vector<int64_t> dims, strides, storage;
  aclDataType dtype = ACL_DT_UNDEFINED;
  int64_t offset = 0;
  aclFormat format = ACL_FORMAT_ND;
  void* data = nullptr;
};
struct aclScalar {
  aclDataType dtype = ACL_FLOAT;
  double value = 0;
};
struct aclIntArray {
  std::vector<int64_t> v;
};
struct aclFloatArray {
  std::vector<float> v;
};
struct aclBoolArray {
  std::vector<bool> v;
};
struct aclTensorList {
  std::vector<aclTensor> v;
};
struct aclOpExecutor {
  std::string name;               // e.g. "aclnnMatmul": phase 2 must be the same op
  uint64_t workspace = 0;         // bytes phase 1 asked for
  int device = -1;                // device of the tensors
  std::vector<std::pair<const void*, std::size_t>> ranges;  // device memory the op touches
  std::function<void(void*)> run; // the computation (workspace pointer)
  bool repeatable = false;
};

namespace loomemu {

/// Thrown inside a stream task; recorded as the stream's error, reported by the next synchronize.
struct task_error {
  int code;
  std::string message;
};

// --- errors and fault injection
void set_message(std::string msg);
/// Sets the recent error message to msg, counts a failed check, returns code.
int fail(int code, std::string msg);
/// Nonzero when a failure was injected for `api` (message already set).
int injected(const char* api);

// --- runtime state
bool initialized();
/// This thread's device, or -1 before aclrtSetDevice.
int current_device();

enum class mem_kind { device, pinned };
struct allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device = -1;
  mem_kind kind = mem_kind::device;
};
/// The live allocation containing p.
bool lookup(const void* p, allocation* out);
/// True when [p, p+bytes) lies inside one live device allocation of `device`; else explains why.
bool check_device_range(const void* p, std::size_t bytes, int device, std::string* why);

struct stream;
/// Resolves a stream handle (NULL = the current device's default stream when allow_null).
/// On failure returns nullptr with *err set (and the message set).
stream* resolve_stream(aclrtStream s, bool allow_null, int* err);
int stream_device(const stream* s);
/// Appends a task; it runs after every task enqueued before it on the same stream.
void enqueue(stream* s, std::function<void()> task);
/// enqueue for an aclnn launch (phase 2): counted as pending operator work until it has run.
void enqueue_op(stream* s, std::function<void()> task);

// --- counters
void count_executor_created();
void count_executor_run();

// --- element access
std::size_t dtype_size(aclDataType dt);
bool is_float_type(aclDataType dt);
const char* dtype_name(aclDataType dt);
double load(aclDataType dt, const void* base, int64_t index);
void store(aclDataType dt, void* base, int64_t index, double v);

// --- tensors
int64_t numel(const aclTensor& t);
/// Element offsets (relative to t.data, in elements) of the view in row-major order.
std::vector<int64_t> offsets(const aclTensor& t);
/// Reads the view as doubles, row-major.
std::vector<double> gather(const aclTensor& t);
/// Writes the view from doubles (rounded to t's dtype).
void scatter(const aclTensor& t, const std::vector<double>& v);
std::string shape_string(const aclTensor& t);

// --- aclnn plumbing (meta.cpp)
/// Result of validating an op's arguments: empty = ok, else the reason (-> 161002).
using check = std::string;
/// Builds the executor of a validated op: checks that every non-null tensor is well formed and
/// lies in device memory of the current device, then returns ACLNN_SUCCESS with *executor set.
aclnnStatus make_executor(const char* name, std::vector<const aclTensor*> tensors, uint64_t workspace,
                          std::function<void(void*)> run, uint64_t* workspaceSize, aclOpExecutor** executor);
/// Phase 2: validates the executor, workspace and stream, then enqueues the computation.
aclnnStatus launch(const char* name, void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                   aclrtStream stream);
/// Reports a rejected phase-1 call: 161001 for a missing required pointer, 161002 otherwise.
aclnnStatus reject(const char* name, int code, const std::string& why);

inline constexpr aclnnStatus ok = 0;
inline constexpr aclnnStatus param_nullptr = 161001;
inline constexpr aclnnStatus param_invalid = 161002;
inline constexpr aclnnStatus runtime_error = 361001;
/// ACLNN_ERR_INNER_TILING_ERROR: a shape or attribute value outside what the kernel tiles
/// (aclnn return codes, ops-nn docs/zh/context/aclnn_return_code.md).
inline constexpr aclnnStatus inner_tiling_error = 561002;

}  // namespace loomemu
