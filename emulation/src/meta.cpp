// loom's HOST EMULATION of the CANN aclnn meta API (libnnopbase) — NOT the vendor library.
// Descriptors, element conversions, and the two-phase plumbing shared by all emulated operators:
//   phase 1 (make_executor): every tensor must be well formed (≤ 8 dims, non-negative strides, a
//     storage shape that covers the view) and its storage must lie in a live device allocation of
//     the calling thread's device — a host pointer or a freed pointer is rejected with 161002;
//   phase 2 (launch): the executor must be live and unused (single use unless made repeatable),
//     the stream explicit and on the same device, the workspace at least as large as phase 1
//     asked and in device memory. The computation then runs on the stream's worker, after
//     re-checking that the memory is still allocated (a free before the stream ran it is caught).
#include "internal.hpp"

#include <cmath>
#include <cstring>
#include <mutex>
#include <set>

namespace loomemu {

// element conversions, dtype_size, load/store: elements.cpp (in libascendcl, which every other
// emulation library links)

// --- tensors -------------------------------------------------------------------------------------------------
int64_t numel(const aclTensor& t) {
  int64_t n = 1;
  for (auto d : t.dims) n *= d;
  return n;
}

std::vector<int64_t> offsets(const aclTensor& t) {
  const int64_t n = numel(t);
  std::vector<int64_t> out(std::size_t(n > 0 ? n : 0));
  if (n <= 0) return out;
  const std::size_t nd = t.dims.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = t.offset;
  for (int64_t k = 0; k < n; ++k) {
    out[std::size_t(k)] = off;
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < t.dims[d]) {
        off += t.strides[d];
        break;
      }
      off -= t.strides[d] * (t.dims[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<double> gather(const aclTensor& t) {
  const auto off = offsets(t);
  std::vector<double> v(off.size());
  for (std::size_t i = 0; i < off.size(); ++i) v[i] = load(t.dtype, t.data, off[i]);
  return v;
}

void scatter(const aclTensor& t, const std::vector<double>& v) {
  const auto off = offsets(t);
  for (std::size_t i = 0; i < off.size(); ++i) store(t.dtype, t.data, off[i], v[i]);
}

std::string shape_string(const aclTensor& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[";
  for (std::size_t i = 0; i < t.dims.size(); ++i) s += (i ? "," : "") + std::to_string(t.dims[i]);
  return s + "]";
}

// --- executors -------------------------------------------------------------------------------------------------
namespace {
std::mutex executor_mutex;
std::set<aclOpExecutor*>& live_executors() {
  static auto* s = new std::set<aclOpExecutor*>;
  return *s;
}

/// Checks one tensor's descriptor and memory. Returns "" when fine.
std::string check_tensor(const aclTensor& t, int device) {
  if (t.dims.size() > 8) return "more than 8 dimensions";
  if (t.strides.size() != t.dims.size()) return "strides and dims differ in length";
  if (dtype_size(t.dtype) == 0) return "unsupported data type";
  int64_t max_off = t.offset;
  for (std::size_t d = 0; d < t.dims.size(); ++d) {
    if (t.dims[d] < 0) return "negative dimension";
    if (t.strides[d] < 0) return "negative stride (not emulated)";
    if (t.dims[d] > 0) max_off += (t.dims[d] - 1) * t.strides[d];
  }
  if (t.offset < 0) return "negative offset";
  int64_t storage = 1;
  for (auto s : t.storage) storage *= s;
  const int64_t n = numel(t);
  if (n == 0) return "";
  if (max_off >= storage)
    return "the view (offset " + std::to_string(t.offset) + ", last element " + std::to_string(max_off) +
           ") does not fit in the storage shape of " + std::to_string(storage) + " elements (check viewDims, stride, "
           "offset and storageDims; strides and offset are in elements, not bytes)";
  if (!t.data) return "tensor data pointer is NULL";
  std::string why;
  if (!check_device_range(t.data, std::size_t(storage) * dtype_size(t.dtype), device, &why)) return why;
  return "";
}
}  // namespace

aclnnStatus reject(const char* name, int code, const std::string& why) {
  return fail(code, std::string(name) + "GetWorkspaceSize: " + why);
}

aclnnStatus make_executor(const char* name, std::vector<const aclTensor*> tensors, uint64_t workspace,
                          std::function<void(void*)> run, uint64_t* workspaceSize, aclOpExecutor** executor) {
  if (!workspaceSize || !executor) return reject(name, param_nullptr, "workspaceSize or executor is NULL");
  const int dev = current_device();
  if (dev < 0) return reject(name, runtime_error, "no current device on this thread (aclrtSetDevice)");
  auto* ex = new aclOpExecutor;
  ex->name = name;
  ex->workspace = workspace;
  ex->device = dev;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const aclTensor* t = tensors[i];
    if (!t) continue;
    const std::string why = check_tensor(*t, dev);
    if (!why.empty()) {
      delete ex;
      return reject(name, param_invalid, "tensor argument " + std::to_string(i) + " " + shape_string(*t) + ": " + why);
    }
    int64_t storage = 1;
    for (auto s : t->storage) storage *= s;
    if (numel(*t) > 0) ex->ranges.emplace_back(t->data, std::size_t(storage) * dtype_size(t->dtype));
  }
  ex->run = std::move(run);
  {
    std::lock_guard lock(executor_mutex);
    live_executors().insert(ex);
  }
  count_executor_created();
  *workspaceSize = workspace;
  *executor = ex;
  return ok;
}

aclnnStatus launch(const char* name, void* workspace, uint64_t workspaceSize, aclOpExecutor* ex, aclrtStream s) {
  if (int code = injected(name)) return code;
  if (!ex) return fail(param_nullptr, std::string(name) + ": executor is NULL");
  {
    std::lock_guard lock(executor_mutex);
    if (!live_executors().count(ex))
      return fail(param_invalid, std::string(name) +
                                     ": executor is not live (already run once — executors are single use unless "
                                     "aclSetAclOpExecutorRepeatable — or destroyed)");
  }
  if (ex->name != name)
    return fail(param_invalid, std::string(name) + ": the executor was created by " + ex->name + "GetWorkspaceSize");
  if (!s)
    return fail(param_invalid, std::string(name) +
                                   ": NULL stream; whether aclnn accepts NULL as the default stream is unconfirmed, "
                                   "pass an explicit aclrtStream");
  int err = 0;
  stream* st = resolve_stream(s, false, &err);
  if (!st) return err;
  if (stream_device(st) != ex->device || current_device() != ex->device)
    return fail(param_invalid, std::string(name) + ": stream of device " + std::to_string(stream_device(st)) +
                                   ", tensors on device " + std::to_string(ex->device) + ", current device " +
                                   std::to_string(current_device()));
  if (workspaceSize < ex->workspace)
    return fail(param_invalid, std::string(name) + ": workspaceSize " + std::to_string(workspaceSize) +
                                   " is smaller than the " + std::to_string(ex->workspace) +
                                   " bytes phase 1 asked for");
  if (ex->workspace > 0) {
    std::string why;
    if (!workspace) return fail(param_nullptr, std::string(name) + ": workspace is NULL but phase 1 asked for bytes");
    if (!check_device_range(workspace, ex->workspace, ex->device, &why))
      return fail(param_invalid, std::string(name) + ": workspace: " + why);
  }
  auto run = ex->run;
  auto ranges = ex->ranges;
  const uint64_t ws_bytes = ex->workspace;
  const int dev = ex->device;
  std::string op = name;
  if (!ex->repeatable) {
    std::lock_guard lock(executor_mutex);
    live_executors().erase(ex);
    delete ex;
  }
  count_executor_run();
  enqueue_op(st, [run, ranges, workspace, ws_bytes, dev, op] {
    for (const auto& [p, bytes] : ranges) {
      std::string why;
      if (!check_device_range(p, bytes, dev, &why))
        throw task_error{ACL_ERROR_RT_DEVICE_MEM_ERROR, op + " ran after its memory was freed: " + why};
    }
    if (ws_bytes) {
      std::string why;
      if (!check_device_range(workspace, ws_bytes, dev, &why))
        throw task_error{ACL_ERROR_RT_DEVICE_MEM_ERROR, op + " ran after its workspace was freed: " + why};
      std::memset(workspace, 0xA5, std::size_t(ws_bytes));  // the op really uses its workspace
    }
    run(workspace);
  });
  return ok;
}

}  // namespace loomemu

using namespace loomemu;

extern "C" {

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format, const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
  if ((viewDimsNum && (!viewDims || !stride)) || (storageDimsNum && !storageDims) || viewDimsNum > 8) {
    fail(param_invalid, "aclCreateTensor: NULL dims/strides or more than 8 dimensions");
    return nullptr;
  }
  auto* t = new aclTensor;
  t->dims.assign(viewDims, viewDims + viewDimsNum);
  t->strides.assign(stride, stride + viewDimsNum);
  t->storage.assign(storageDims, storageDims + storageDimsNum);
  t->dtype = dataType;
  t->offset = offset;
  t->format = format;
  t->data = tensorData;
  return t;
}

aclScalar* aclCreateScalar(void* value, aclDataType dataType) {
  if (!value || dtype_size(dataType) == 0) {
    fail(param_invalid, "aclCreateScalar: NULL value or unsupported type");
    return nullptr;
  }
  auto* s = new aclScalar;
  s->dtype = dataType;
  s->value = load(dataType, value, 0);  // copied at creation
  return s;
}

aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size) {
  if (size && !value) return nullptr;
  auto* a = new aclIntArray;
  a->v.assign(value, value + size);
  return a;
}

aclFloatArray* aclCreateFloatArray(const float* value, uint64_t size) {
  if (size && !value) return nullptr;
  auto* a = new aclFloatArray;
  a->v.assign(value, value + size);
  return a;
}

aclBoolArray* aclCreateBoolArray(const bool* value, uint64_t size) {
  if (size && !value) return nullptr;
  auto* a = new aclBoolArray;
  a->v.assign(value, value + size);
  return a;
}

aclTensorList* aclCreateTensorList(const aclTensor* const* value, uint64_t size) {
  if (size && !value) return nullptr;
  auto* l = new aclTensorList;
  for (uint64_t i = 0; i < size; ++i) l->v.push_back(*value[i]);
  return l;
}

aclnnStatus aclDestroyTensor(const aclTensor* t) {
  delete t;
  return ok;
}
aclnnStatus aclDestroyScalar(const aclScalar* s) {
  delete s;
  return ok;
}
aclnnStatus aclDestroyIntArray(const aclIntArray* a) {
  delete a;
  return ok;
}
aclnnStatus aclDestroyFloatArray(const aclFloatArray* a) {
  delete a;
  return ok;
}
aclnnStatus aclDestroyBoolArray(const aclBoolArray* a) {
  delete a;
  return ok;
}
aclnnStatus aclDestroyTensorList(const aclTensorList* l) {
  delete l;
  return ok;
}

aclnnStatus aclGetViewShape(const aclTensor* t, int64_t** viewDims, uint64_t* viewDimsNum) {
  if (!t || !viewDims || !viewDimsNum) return param_nullptr;
  *viewDims = new int64_t[t->dims.size() ? t->dims.size() : 1];
  std::memcpy(*viewDims, t->dims.data(), t->dims.size() * sizeof(int64_t));
  *viewDimsNum = t->dims.size();
  return ok;
}

aclnnStatus aclGetDataType(const aclTensor* t, aclDataType* dataType) {
  if (!t || !dataType) return param_nullptr;
  *dataType = t->dtype;
  return ok;
}

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor* ex) {
  std::lock_guard lock(executor_mutex);
  if (!ex || !live_executors().count(ex)) return fail(param_invalid, "aclSetAclOpExecutorRepeatable: not a live executor");
  ex->repeatable = true;
  return ok;
}

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor* ex) {
  std::lock_guard lock(executor_mutex);
  if (!ex || !live_executors().count(ex)) return fail(param_invalid, "aclDestroyAclOpExecutor: not a live executor");
  live_executors().erase(ex);
  delete ex;
  return ok;
}

aclnnStatus aclnnInit(const char*) { return ok; }
aclnnStatus aclnnFinalize() { return ok; }

}  // extern "C"
