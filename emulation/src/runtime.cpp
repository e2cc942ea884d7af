// loom's HOST EMULATION of the CANN ACL runtime — NOT the vendor library (libascendcl).
// Implements the subset declared in emulation/include/acl/*.h on the host:
//   devices   ids 0..count-1; each thread has a current device (aclrtSetDevice), as documented
//   memory    host memory in a registry {base, size, device, kind}; device memory is accounted
//             against a per-device limit (default 16 GiB) so out-of-memory paths can be tested
//   streams   in-order queues, each drained by its own worker thread (truly asynchronous)
//   events    record/wait/synchronize/elapsed time in stream order
// and checks arguments as strictly as the documentation describes (see docs/ascend.md):
// async copies need aclrtMallocHost memory and 64-byte aligned addresses, device pointers must
// lie in a live allocation of the current device, frees must be on the owning device, etc.
#include "internal.hpp"

#include <loom_emulation/control.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <unistd.h>

namespace loomemu {
namespace {

constexpr int max_devices = 64;
constexpr std::size_t default_device_bytes = std::size_t(16) << 30;

struct injection {
  int code = 0;
  int skip = 0;
  int count = 0;
};

struct device_state {
  std::size_t limit = default_device_bytes;
  std::size_t used = 0;
  stream* default_stream = nullptr;
  int64_t deterministic = 0;  // ACL_OPT_DETERMINISTIC of the device's default context
};

struct counters {
  std::atomic<uint64_t> device_mallocs{0}, device_frees{0}, host_pinned{0}, executors_created{0},
      executors_run{0}, tasks{0}, checks_failed{0}, async_copies{0}, sync_copies{0}, host_waits{0}, h2d_behind_work{0},
      h2d_beside_work{0};
};

struct global_state {
  std::mutex m;
  bool initialized = false;
  int device_count = 8;
  std::map<std::uintptr_t, allocation> allocs;  // base -> allocation
  device_state devices[max_devices];
  std::map<std::string, injection> injections;
  std::set<stream*> streams;
  counters c;
};

// Leaked on purpose: stream workers and loom's static caches may still call in during exit.
global_state& g() {
  static global_state* s = new global_state;
  return *s;
}

thread_local std::string recent_message;
thread_local int thread_device = -1;

std::size_t accounted(std::size_t size) { return (size + 31) / 32 * 32 + 32; }  // doc: round to 32, +32

}  // namespace

// --- errors --------------------------------------------------------------------------------------
void set_message(std::string msg) { recent_message = std::move(msg); }

int fail(int code, std::string msg) {
  g().c.checks_failed++;
  set_message("loom emulation: " + std::move(msg));
  return code;
}

int injected(const char* api) {
  auto& s = g();
  std::lock_guard lock(s.m);
  auto it = s.injections.find(api);
  if (it == s.injections.end()) return 0;
  injection& inj = it->second;
  if (inj.skip > 0) {
    --inj.skip;
    return 0;
  }
  if (inj.count == 0) return 0;
  if (inj.count > 0) --inj.count;
  set_message(std::string("loom emulation: injected failure of ") + api);
  return inj.code;
}

// --- state queries ---------------------------------------------------------------------------------
bool initialized() {
  std::lock_guard lock(g().m);
  return g().initialized;
}
int current_device() { return thread_device; }

bool lookup(const void* p, allocation* out) {
  auto& s = g();
  std::lock_guard lock(s.m);
  const auto key = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.allocs.upper_bound(key);
  if (it == s.allocs.begin()) return false;
  --it;
  if (key >= it->second.base + it->second.size) {
    if (!(it->second.size == 0 && key == it->second.base)) return false;
  }
  *out = it->second;
  return true;
}

static std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

bool check_device_range(const void* p, std::size_t bytes, int device, std::string* why) {
  allocation a;
  if (!lookup(p, &a)) {
    *why = "address " + hex(p) + " is not in any live device allocation (a host pointer, or memory already freed)";
    return false;
  }
  if (a.kind != mem_kind::device) {
    *why = "address " + hex(p) + " is pinned host memory (aclrtMallocHost), not device memory";
    return false;
  }
  if (a.device != device) {
    *why = "address " + hex(p) + " belongs to device " + std::to_string(a.device) + ", but the current device is " +
           std::to_string(device);
    return false;
  }
  const auto off = reinterpret_cast<std::uintptr_t>(p) - a.base;
  if (off + bytes > a.size) {
    *why = "range [" + hex(p) + ", +" + std::to_string(bytes) + " bytes) runs past the end of its allocation of " +
           std::to_string(a.size) + " bytes (at offset " + std::to_string(off) + ")";
    return false;
  }
  return true;
}

// --- streams -----------------------------------------------------------------------------------------
struct stream {
  int device = 0;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool busy = false;
  bool stop = false;
  int error = 0;
  std::string error_message;
  std::atomic<int> ops_pending{0};  ///< aclnn launches enqueued and not finished (enqueue_op)
  std::thread worker;

  explicit stream(int dev) : device(dev) { worker = std::thread([this] { loop(); }); }
  ~stream() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  void loop() {
    std::unique_lock lock(m);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      auto task = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      int code = 0;
      std::string msg;
      try {
        task();
      } catch (const task_error& e) {
        code = e.code;
        msg = e.message;
      } catch (const std::exception& e) {
        code = ACL_ERROR_RT_DRV_INTERNAL_ERROR;
        msg = std::string("emulated task threw: ") + e.what();
      }
      g().c.tasks++;
      lock.lock();
      if (code && !error) {
        error = code;
        error_message = msg;
      }
      busy = false;
      cv.notify_all();
    }
  }

  void push(std::function<void()> task) {
    {
      std::lock_guard lock(m);
      queue.push_back(std::move(task));
    }
    cv.notify_all();
  }

  /// Waits until drained (timeout_ms < 0: forever). Returns the sticky error (and clears it).
  int drain(int timeout_ms) {
    std::unique_lock lock(m);
    auto idle = [&] { return queue.empty() && !busy; };
    if (timeout_ms < 0) {
      cv.wait(lock, idle);
    } else if (!cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), idle)) {
      return fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                  "aclrtSynchronizeStreamWithTimeout: the stream did not drain within " + std::to_string(timeout_ms) +
                      " ms");
    }
    if (error) {
      const int code = error;
      set_message("loom emulation: an asynchronous task failed: " + error_message);
      error = 0;
      error_message.clear();
      g().c.checks_failed++;
      return code;
    }
    return ACL_SUCCESS;
  }

  bool idle() {
    std::lock_guard lock(m);
    return queue.empty() && !busy;
  }
};

stream* resolve_stream(aclrtStream s, bool allow_null, int* err) {
  auto& st = g();
  if (s == nullptr) {
    if (!allow_null) {
      *err = fail(ACL_ERROR_INVALID_PARAM,
                  "a NULL stream was passed where loom's reference marks the default-stream meaning as "
                  "unconfirmed (aclnn phase 2, HCCL); pass an explicit aclrtStream");
      return nullptr;
    }
    const int dev = thread_device;
    if (dev < 0) {
      *err = fail(ACL_ERROR_INVALID_DEVICE, "NULL (default) stream used before aclrtSetDevice on this thread");
      return nullptr;
    }
    std::lock_guard lock(st.m);
    return st.devices[dev].default_stream;
  }
  std::lock_guard lock(st.m);
  auto* p = static_cast<stream*>(s);
  if (!st.streams.count(p)) {
    *err = fail(ACL_ERROR_INVALID_PARAM, "stream handle " + hex(s) + " is not a live stream (destroyed?)");
    return nullptr;
  }
  return p;
}

int stream_device(const stream* s) { return s->device; }

/// True when another stream of s's NPU has aclnn operators queued or running (enqueue_op): a copy
/// executing now overlaps computation.
bool other_stream_computing(const stream* s) {
  std::lock_guard lock(g().m);
  for (const stream* o : g().streams)
    if (o != s && o->device == s->device && o->ops_pending > 0) return true;
  return false;
}
void enqueue(stream* s, std::function<void()> task) { s->push(std::move(task)); }

void enqueue_op(stream* s, std::function<void()> task) {
  s->ops_pending++;
  s->push([s, task = std::move(task)] {
    struct done {
      stream* s;
      ~done() { s->ops_pending--; }
    } d{s};
    task();
  });
}

void count_executor_created() { g().c.executors_created++; }
void count_executor_run() { g().c.executors_run++; }

}  // namespace loomemu

using namespace loomemu;

namespace {

#define LOOMEMU_INJECT(api)                    \
  do {                                         \
    if (int injected_code = injected(api)) {   \
      return injected_code;                    \
    }                                          \
  } while (0)

int require_init(const char* api) {
  if (!initialized()) return fail(ACL_ERROR_UNINITIALIZE, std::string(api) + " called before aclInit");
  return 0;
}

int require_device(const char* api) {
  if (int rc = require_init(api)) return rc;
  if (current_device() < 0)
    return fail(ACL_ERROR_INVALID_DEVICE,
                std::string(api) + ": this thread has no current device; call aclrtSetDevice on every thread that "
                                   "issues ACL work");
  return 0;
}

bool is_pinned_range(const void* p, std::size_t bytes) {
  allocation a;
  if (!lookup(p, &a) || a.kind != mem_kind::pinned) return false;
  return reinterpret_cast<std::uintptr_t>(p) - a.base + bytes <= a.size;
}

bool is_device_address(const void* p) {
  allocation a;
  return lookup(p, &a) && a.kind == mem_kind::device;
}

struct event_state {
  uint32_t flags = 0;
  bool plain = true;   // created by aclrtCreateEvent (timing and sync capable)
  bool ex = false;     // created by aclrtCreateEventExWithFlag: may be re-recorded ("reused naturally")
  bool waited = false; // an aclrtStreamWaitEvent since the last aclrtResetEvent (flag events)
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  int waiters = 0;  // stream waits enqueued and not yet finished
  std::chrono::steady_clock::time_point when{};
};

std::mutex event_mutex;
std::set<event_state*>& events() {
  static auto* s = new std::set<event_state*>;
  return *s;
}
event_state* resolve_event(aclrtEvent e) {
  std::lock_guard lock(event_mutex);
  auto* p = static_cast<event_state*>(e);
  return events().count(p) ? p : nullptr;
}

/// Validates one side of a copy; `device_side` says which kind the documentation requires.
int check_copy_side(const char* api, const char* which, const void* p, std::size_t bytes, bool device_side,
                    bool async) {
  if (device_side) {
    std::string why;
    if (!check_device_range(p, bytes, current_device(), &why))
      return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": " + which + " must be device memory: " + why);
  } else {
    if (is_device_address(p))
      return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": " + which + " " + hex(p) +
                                               " is device memory but the copy kind says host memory");
    if (async && !is_pinned_range(p, bytes))
      return fail(ACL_ERROR_INVALID_PARAM,
                  std::string(api) + ": " + which + " " + hex(p) +
                      " is pageable host memory; asynchronous host<->device copies need memory from "
                      "aclrtMallocHost (CANN 8.0: undefined behaviour otherwise; 8.5: the call turns synchronous)");
  }
  if (async && reinterpret_cast<std::uintptr_t>(p) % 64 != 0)
    return fail(ACL_ERROR_INVALID_PARAM,
                std::string(api) + ": " + which + " " + hex(p) + " is not 64-byte aligned (documented requirement)");
  return 0;
}

int check_copy(const char* api, void* dst, std::size_t destMax, const void* src, std::size_t count,
               aclrtMemcpyKind& kind, bool async) {
  if (!dst || !src) return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": dst or src is NULL");
  if (count > destMax)
    return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": count " + std::to_string(count) +
                                             " exceeds destMax " + std::to_string(destMax));
  if (kind == ACL_MEMCPY_DEFAULT)
    kind = is_device_address(src) ? (is_device_address(dst) ? ACL_MEMCPY_DEVICE_TO_DEVICE : ACL_MEMCPY_DEVICE_TO_HOST)
                                  : (is_device_address(dst) ? ACL_MEMCPY_HOST_TO_DEVICE : ACL_MEMCPY_HOST_TO_HOST);
  switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST:
      if (async)
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, std::string(api) + ": host-to-host is not supported asynchronously");
      if (is_device_address(src) || is_device_address(dst))
        return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": HOST_TO_HOST with a device address");
      return 0;
    case ACL_MEMCPY_HOST_TO_DEVICE:
      if (int rc = check_copy_side(api, "src", src, count, false, async)) return rc;
      return check_copy_side(api, "dst", dst, count, true, async);
    case ACL_MEMCPY_DEVICE_TO_HOST:
      if (int rc = check_copy_side(api, "src", src, count, true, async)) return rc;
      return check_copy_side(api, "dst", dst, count, false, async);
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
      if (int rc = check_copy_side(api, "src", src, count, true, async)) return rc;
      return check_copy_side(api, "dst", dst, count, true, async);
    default:
      return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": copy kind " + std::to_string(int(kind)) +
                                               " is not emulated");
  }
}

}  // namespace

extern "C" {

// --- init, versions, errors -------------------------------------------------------------------------
aclError aclInit(const char*) {
  LOOMEMU_INJECT("aclInit");
  std::lock_guard lock(g().m);
  if (g().initialized) {
    set_message("loom emulation: aclInit: already initialised (8.1.RC1: may be called once per process)");
    return ACL_ERROR_REPEAT_INITIALIZE;
  }
  g().initialized = true;
  return ACL_SUCCESS;
}

aclError aclFinalize() {
  LOOMEMU_INJECT("aclFinalize");
  std::lock_guard lock(g().m);
  if (!g().initialized) return ACL_ERROR_REPEAT_FINALIZE;
  g().initialized = false;
  return ACL_SUCCESS;
}

aclError aclFinalizeReference(uint64_t* refCount) {
  LOOMEMU_INJECT("aclFinalizeReference");
  std::lock_guard lock(g().m);
  if (!g().initialized) return ACL_ERROR_REPEAT_FINALIZE;
  g().initialized = false;  // one reference: the emulation's aclInit is not counted
  if (refCount) *refCount = 0;
  return ACL_SUCCESS;
}

// aclsysGetVersionStr / aclsysGetVersionNum (CANN 9.0): by package name; the emulation knows the
// names its hicann/runtime sample and tests use ("runtime", "compiler", "CANN"), others fail with
// ACL_ERROR_INVALID_FILE (no version.info for that package), as documented.
/// The version the emulated runtime reports: "8.1.RC1 (loom host emulation, not CANN)", or the
/// text of $LOOMEMU_CANN_VERSION (tests of version checks, e.g. examples/doctor's statement).
static const char* reported_version() {
  const char* v = std::getenv("LOOMEMU_CANN_VERSION");
  return v && *v ? v : "8.1.RC1 (loom host emulation, not CANN)";
}
static bool known_package(const char* name) {
  return name && (std::strcmp(name, "runtime") == 0 || std::strcmp(name, "compiler") == 0 ||
                  std::strcmp(name, "CANN") == 0);
}
aclError aclsysGetVersionStr(char* pkgName, char* versionStr) {
  LOOMEMU_INJECT("aclsysGetVersionStr");
  if (!versionStr) return fail(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionStr: NULL output");
  if (!known_package(pkgName)) return fail(ACL_ERROR_INVALID_FILE, "aclsysGetVersionStr: no version.info for package");
  std::snprintf(versionStr, ACL_PKG_VERSION_MAX_SIZE, "%s", reported_version());
  return ACL_SUCCESS;
}
aclError aclsysGetVersionNum(char* pkgName, int32_t* versionNum) {
  LOOMEMU_INJECT("aclsysGetVersionNum");
  if (!versionNum) return fail(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionNum: NULL output");
  if (!known_package(pkgName)) return fail(ACL_ERROR_INVALID_FILE, "aclsysGetVersionNum: no version.info for package");
  *versionNum = 80100000;  // encoding unconfirmed; the emulation's own
  return ACL_SUCCESS;
}

aclError aclrtGetVersion(int32_t* major, int32_t* minor, int32_t* patch) {
  LOOMEMU_INJECT("aclrtGetVersion");
  if (!major || !minor || !patch) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetVersion: NULL output");
  *major = ACL_MAJOR_VERSION;
  *minor = ACL_MINOR_VERSION;
  *patch = ACL_PATCH_VERSION;
  return ACL_SUCCESS;
}

const char* aclGetRecentErrMsg() { return recent_message.empty() ? nullptr : recent_message.c_str(); }

aclError aclsysGetCANNVersion(aclCANNPackageName, aclCANNPackageVersion* version) {
  LOOMEMU_INJECT("aclsysGetCANNVersion");
  if (!version) return fail(ACL_ERROR_INVALID_PARAM, "aclsysGetCANNVersion: NULL output");
  std::memset(version, 0, sizeof *version);
  std::snprintf(version->version, sizeof version->version, "%s", reported_version());
  std::snprintf(version->majorVersion, sizeof version->majorVersion, "8");
  std::snprintf(version->minorVersion, sizeof version->minorVersion, "1");
  std::snprintf(version->releaseVersion, sizeof version->releaseVersion, "RC1");
  return ACL_SUCCESS;
}

const char* aclrtGetSocName() { return "Ascend910B-emulated (loom host emulation, not an NPU)"; }

size_t aclDataTypeSize(aclDataType dataType) { return dtype_size(dataType); }

float aclFloat16ToFloat(aclFloat16 value) {
  float f;
  const uint16_t h = value;
  store(ACL_FLOAT, &f, 0, load(ACL_FLOAT16, &h, 0));
  return f;
}

aclFloat16 aclFloatToFloat16(float value) {
  uint16_t h;
  store(ACL_FLOAT16, &h, 0, value);
  return h;
}

// --- devices -------------------------------------------------------------------------------------------
aclError aclrtSetDevice(int32_t deviceId) {
  LOOMEMU_INJECT("aclrtSetDevice");
  if (int rc = require_init("aclrtSetDevice")) return rc;
  auto& s = g();
  std::lock_guard lock(s.m);
  if (deviceId < 0 || deviceId >= s.device_count)
    return fail(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice: device " + std::to_string(deviceId) +
                                                   " does not exist (" + std::to_string(s.device_count) +
                                                   " emulated devices)");
  if (!s.devices[deviceId].default_stream) {
    auto* st = new stream(deviceId);
    s.devices[deviceId].default_stream = st;
    s.streams.insert(st);
  }
  thread_device = deviceId;
  return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId) {
  LOOMEMU_INJECT("aclrtResetDevice");
  if (int rc = require_init("aclrtResetDevice")) return rc;
  std::vector<stream*> mine;
  {
    std::lock_guard lock(g().m);
    if (deviceId < 0 || deviceId >= g().device_count)
      return fail(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtResetDevice: no device " + std::to_string(deviceId));
    for (auto* st : g().streams)
      if (st->device == deviceId) mine.push_back(st);
  }
  for (auto* st : mine) st->drain(-1);
  if (thread_device == deviceId) thread_device = -1;
  return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t* deviceId) {
  LOOMEMU_INJECT("aclrtGetDevice");
  if (!deviceId) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: NULL output");
  if (thread_device < 0) return fail(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtGetDevice: no current device on this thread");
  *deviceId = thread_device;
  return ACL_SUCCESS;
}

// System options of the current context (acl_rt.h: aclrtCtxSetSysParamOpt / GetSysParamOpt;
// ACL_OPT_DETERMINISTIC 0 or 1). The emulation's operators compute in double in a fixed order, so
// they are deterministic either way; the option is kept for the caller to read back.
aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value) {
  LOOMEMU_INJECT("aclrtCtxSetSysParamOpt");
  if (int rc = require_device("aclrtCtxSetSysParamOpt")) return rc;
  if (opt != ACL_OPT_DETERMINISTIC)
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtCtxSetSysParamOpt: the emulation knows ACL_OPT_DETERMINISTIC only");
  if (value != 0 && value != 1)
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtCtxSetSysParamOpt: ACL_OPT_DETERMINISTIC takes 0 or 1, not " +
                                             std::to_string(value));
  std::lock_guard lock(g().m);
  g().devices[current_device()].deterministic = value;
  return ACL_SUCCESS;
}

aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t* value) {
  LOOMEMU_INJECT("aclrtCtxGetSysParamOpt");
  if (int rc = require_device("aclrtCtxGetSysParamOpt")) return rc;
  if (!value) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCtxGetSysParamOpt: NULL output");
  if (opt != ACL_OPT_DETERMINISTIC)
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtCtxGetSysParamOpt: the emulation knows ACL_OPT_DETERMINISTIC only");
  std::lock_guard lock(g().m);
  *value = g().devices[current_device()].deterministic;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t* count) {
  LOOMEMU_INJECT("aclrtGetDeviceCount");
  if (int rc = require_init("aclrtGetDeviceCount")) return rc;
  if (!count) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: NULL output");
  std::lock_guard lock(g().m);
  *count = uint32_t(g().device_count);
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
  LOOMEMU_INJECT("aclrtSynchronizeDevice");
  if (int rc = require_device("aclrtSynchronizeDevice")) return rc;
  g().c.host_waits++;
  std::vector<stream*> mine;
  {
    std::lock_guard lock(g().m);
    for (auto* st : g().streams)
      if (st->device == thread_device) mine.push_back(st);
  }
  int first = ACL_SUCCESS;
  for (auto* st : mine) {
    const int rc = st->drain(-1);
    if (rc && !first) first = rc;
  }
  return first;
}

// --- streams -----------------------------------------------------------------------------------------
aclError aclrtCreateStream(aclrtStream* out) {
  LOOMEMU_INJECT("aclrtCreateStream");
  if (int rc = require_device("aclrtCreateStream")) return rc;
  if (!out) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: NULL output");
  auto* st = new stream(thread_device);
  std::lock_guard lock(g().m);
  g().streams.insert(st);
  *out = st;
  return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream s) {
  LOOMEMU_INJECT("aclrtDestroyStream");
  int err = 0;
  stream* st = resolve_stream(s, false, &err);
  if (!st) return err;
  {
    std::lock_guard lock(g().m);
    for (auto& d : g().devices)
      if (d.default_stream == st) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: the default stream");
    g().streams.erase(st);
  }
  st->drain(-1);  // documented: synchronize before destroying; the emulation drains to stay safe
  delete st;
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeStream(aclrtStream s) {
  LOOMEMU_INJECT("aclrtSynchronizeStream");
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  g().c.host_waits++;
  return st->drain(-1);
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream s, int32_t timeout) {
  LOOMEMU_INJECT("aclrtSynchronizeStreamWithTimeout");
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  g().c.host_waits++;
  return st->drain(timeout);
}

aclError aclrtStreamQuery(aclrtStream s, aclrtStreamStatus* status) {
  LOOMEMU_INJECT("aclrtStreamQuery");
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  if (!status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: NULL output");
  *status = st->idle() ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtStreamWaitEvent(aclrtStream s, aclrtEvent e) {
  LOOMEMU_INJECT("aclrtStreamWaitEvent");
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  event_state* ev = resolve_event(e);
  if (!ev) return fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamWaitEvent: not a live event");
  if (!ev->plain && !(ev->flags & ACL_EVENT_SYNC))
    return fail(ACL_ERROR_INVALID_PARAM,
                "aclrtStreamWaitEvent: the event was created without ACL_EVENT_SYNC and cannot be waited on");
  uint64_t target;
  {
    std::lock_guard lock(ev->m);
    target = ev->recorded;
    ++ev->waiters;
    ev->waited = true;
  }
  enqueue(st, [ev, target] {
    std::unique_lock lock(ev->m);
    ev->cv.wait(lock, [&] { return ev->completed >= target; });
    --ev->waiters;
    ev->cv.notify_all();
  });
  return ACL_SUCCESS;
}

// --- memory ------------------------------------------------------------------------------------------
aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy) {
  LOOMEMU_INJECT("aclrtMalloc");
  if (int rc = require_device("aclrtMalloc")) return rc;
  if (!devPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is NULL");
  if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size is 0");
  auto& s = g();
  const int dev = thread_device;
  {
    std::lock_guard lock(s.m);
    auto& d = s.devices[dev];
    if (d.used + accounted(size) > d.limit)
      return fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                  "aclrtMalloc: out of device memory on device " + std::to_string(dev) + ": " + std::to_string(size) +
                      " bytes requested, " + std::to_string(d.limit - d.used) + " of " + std::to_string(d.limit) +
                      " free");
    d.used += accounted(size);
  }
  void* p = std::aligned_alloc(512, (accounted(size) + 511) / 512 * 512);
  if (!p) {
    std::lock_guard lock(s.m);
    s.devices[dev].used -= accounted(size);
    return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMalloc: host allocation behind the emulated device failed");
  }
  {
    std::lock_guard lock(s.m);
    s.allocs[reinterpret_cast<std::uintptr_t>(p)] = {reinterpret_cast<std::uintptr_t>(p), size, dev, mem_kind::device};
  }
  s.c.device_mallocs++;
  *devPtr = p;
  return ACL_SUCCESS;
}

aclError aclrtFree(void* devPtr) {
  LOOMEMU_INJECT("aclrtFree");
  if (int rc = require_device("aclrtFree")) return rc;
  auto& s = g();
  {
    std::lock_guard lock(s.m);
    auto it = s.allocs.find(reinterpret_cast<std::uintptr_t>(devPtr));
    if (it == s.allocs.end() || it->second.kind != mem_kind::device)
      return fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: " + hex(devPtr) +
                                               " is not the start of a live aclrtMalloc allocation (double free?)");
    if (it->second.device != thread_device)
      return fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: " + hex(devPtr) + " belongs to device " +
                                               std::to_string(it->second.device) + " but the current device is " +
                                               std::to_string(thread_device) + "; free memory on its own device");
    s.devices[it->second.device].used -= accounted(it->second.size);
    s.allocs.erase(it);
  }
  std::free(devPtr);
  s.c.device_frees++;
  return ACL_SUCCESS;
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
  LOOMEMU_INJECT("aclrtMallocHost");
  if (int rc = require_init("aclrtMallocHost")) return rc;
  if (!hostPtr || size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: NULL output or size 0");
  void* p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (!p) return fail(ACL_ERROR_BAD_ALLOC, "aclrtMallocHost: out of host memory");
  {
    std::lock_guard lock(g().m);
    g().allocs[reinterpret_cast<std::uintptr_t>(p)] = {reinterpret_cast<std::uintptr_t>(p), size, -1, mem_kind::pinned};
  }
  g().c.host_pinned++;
  *hostPtr = p;
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void* hostPtr) {
  LOOMEMU_INJECT("aclrtFreeHost");
  {
    std::lock_guard lock(g().m);
    auto it = g().allocs.find(reinterpret_cast<std::uintptr_t>(hostPtr));
    if (it == g().allocs.end() || it->second.kind != mem_kind::pinned)
      return fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: " + hex(hostPtr) + " is not a live aclrtMallocHost block");
    g().allocs.erase(it);
  }
  std::free(hostPtr);
  g().c.host_pinned--;
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind) {
  LOOMEMU_INJECT("aclrtMemcpy");
  if (int rc = require_device("aclrtMemcpy")) return rc;
  if (int rc = check_copy("aclrtMemcpy", dst, destMax, src, count, kind, false)) return rc;
  if (count) std::memmove(dst, src, count);  // synchronous; NOT ordered after pending stream work
  g().c.sync_copies++;
  return ACL_SUCCESS;
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream s) {
  LOOMEMU_INJECT("aclrtMemcpyAsync");
  if (int rc = require_device("aclrtMemcpyAsync")) return rc;
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  if (int rc = check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind, true)) return rc;
  const int dev = thread_device;
  const bool src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  const bool dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE && st->ops_pending > 0) g().c.h2d_behind_work++;  // operators still to run
  enqueue(st, [=] {
    std::string why;
    if ((src_dev && !check_device_range(src, count, dev, &why)) || (dst_dev && !check_device_range(dst, count, dev, &why)))
      throw task_error{ACL_ERROR_RT_DEVICE_MEM_ERROR, "aclrtMemcpyAsync executed after its memory was freed: " + why};
    if ((!src_dev && !is_pinned_range(src, count)) || (!dst_dev && !is_pinned_range(dst, count)))
      throw task_error{ACL_ERROR_RT_DEVICE_MEM_ERROR,
                       "aclrtMemcpyAsync executed after its pinned host buffer was freed (aclrtFreeHost before the "
                       "stream was synchronized)"};
    if (kind == ACL_MEMCPY_HOST_TO_DEVICE && other_stream_computing(st)) g().c.h2d_beside_work++;
    if (count) std::memmove(dst, src, count);
  });
  g().c.async_copies++;
  return ACL_SUCCESS;
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count) {
  LOOMEMU_INJECT("aclrtMemset");
  if (int rc = require_device("aclrtMemset")) return rc;
  if (count > maxCount) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: count exceeds maxCount");
  std::string why;
  if (!is_pinned_range(devPtr, count) && !check_device_range(devPtr, count, thread_device, &why))
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: " + why);
  if (count) std::memset(devPtr, value & 0xff, count);
  return ACL_SUCCESS;
}

aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream s) {
  LOOMEMU_INJECT("aclrtMemsetAsync");
  if (int rc = require_device("aclrtMemsetAsync")) return rc;
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  if (count > maxCount) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemsetAsync: count exceeds maxCount");
  std::string why;
  const int dev = thread_device;
  if (!check_device_range(devPtr, count, dev, &why)) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemsetAsync: " + why);
  enqueue(st, [=] {
    std::string w;
    if (!check_device_range(devPtr, count, dev, &w))
      throw task_error{ACL_ERROR_RT_DEVICE_MEM_ERROR, "aclrtMemsetAsync executed after its memory was freed: " + w};
    if (count) std::memset(devPtr, value & 0xff, count);
  });
  return ACL_SUCCESS;
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free_bytes, size_t* total) {
  LOOMEMU_INJECT("aclrtGetMemInfo");
  if (int rc = require_device("aclrtGetMemInfo")) return rc;
  if (!free_bytes || !total) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: NULL output");
  std::lock_guard lock(g().m);
  const auto& d = g().devices[thread_device];
  if (attr == ACL_HBM_MEM || attr == ACL_HBM_MEM_HUGE || attr == ACL_HBM_MEM_NORMAL) {
    *total = d.limit;
    *free_bytes = d.limit - d.used;
  } else {
    *total = 0;
    *free_bytes = 0;
  }
  return ACL_SUCCESS;
}

// --- events ----------------------------------------------------------------------------------------------
static aclError create_event(aclrtEvent* event, uint32_t flag, bool plain) {
  if (!event) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent: NULL output");
  auto* e = new event_state;
  e->flags = flag;
  e->plain = plain;
  std::lock_guard lock(event_mutex);
  events().insert(e);
  *event = e;
  return ACL_SUCCESS;
}

aclError aclrtCreateEvent(aclrtEvent* event) {
  LOOMEMU_INJECT("aclrtCreateEvent");
  if (int rc = require_device("aclrtCreateEvent")) return rc;
  return create_event(event, 0, true);
}

aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag) {
  LOOMEMU_INJECT("aclrtCreateEventWithFlag");
  if (int rc = require_device("aclrtCreateEventWithFlag")) return rc;
  return create_event(event, flag, false);
}

aclError aclrtCreateEventExWithFlag(aclrtEvent* event, uint32_t flag) {
  LOOMEMU_INJECT("aclrtCreateEventExWithFlag");
  if (int rc = require_device("aclrtCreateEventExWithFlag")) return rc;
  if (int rc = create_event(event, flag, false)) return rc;
  static_cast<event_state*>(*event)->ex = true;
  return ACL_SUCCESS;
}

// The documented contract of re-recording (hicann/runtime 07_event_management, aclrtRecordEvent;
// CANN 8.0.RC2's aclrtRecordEvent page): an event of aclrtCreateEventExWithFlag may be recorded
// again at any time, a wait using its latest record; an aclrtCreateEventWithFlag(ACL_EVENT_SYNC)
// event takes create -> record -> aclrtStreamWaitEvent -> aclrtResetEvent, and on the hardware
// one record is one fixed hardware event, so recording it again after a wait without the reset
// races the waiter. The emulation refuses that record, which the hardware would not report.
aclError aclrtRecordEvent(aclrtEvent e, aclrtStream s) {
  LOOMEMU_INJECT("aclrtRecordEvent");
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  event_state* ev = resolve_event(e);
  if (!ev) return fail(ACL_ERROR_INVALID_PARAM, "aclrtRecordEvent: not a live event");
  uint64_t gen;
  {
    std::lock_guard lock(ev->m);
    if (!ev->ex && !ev->plain && (ev->flags & ACL_EVENT_SYNC) && ev->waited)
      return fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtRecordEvent: this aclrtCreateEventWithFlag(ACL_EVENT_SYNC) event was waited on "
                  "(aclrtStreamWaitEvent) and not reset since; CANN documents re-recording only for events of "
                  "aclrtCreateEventExWithFlag, and create -> record -> wait -> aclrtResetEvent for the others: "
                  "call aclrtResetEvent(event, waiting stream) after the wait, or create the event with "
                  "aclrtCreateEventExWithFlag");
    gen = ++ev->recorded;
  }
  enqueue(st, [ev, gen] {
    {
      std::lock_guard lock(ev->m);
      ev->when = std::chrono::steady_clock::now();
      ev->completed = std::max(ev->completed, gen);
    }
    ev->cv.notify_all();
  });
  return ACL_SUCCESS;
}

// Documented (aclrtResetEvent; the 8.5 aclrtCreateEvent page): for events created with
// ACL_EVENT_SYNC by aclrtCreateEventWithFlag or aclrtCreateEventExWithFlag, not for those of
// aclrtCreateEvent; enqueued on `stream` (the tasks before it must finish first).
aclError aclrtResetEvent(aclrtEvent e, aclrtStream s) {
  LOOMEMU_INJECT("aclrtResetEvent");
  int err = 0;
  stream* st = resolve_stream(s, true, &err);
  if (!st) return err;
  event_state* ev = resolve_event(e);
  if (!ev) return fail(ACL_ERROR_INVALID_PARAM, "aclrtResetEvent: not a live event");
  if (ev->plain)
    return fail(ACL_ERROR_INVALID_PARAM,
                "aclrtResetEvent: events of aclrtCreateEvent cannot be reset (documented); create it with "
                "aclrtCreateEventWithFlag(ACL_EVENT_SYNC) or aclrtCreateEventExWithFlag");
  if (!(ev->flags & ACL_EVENT_SYNC))
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtResetEvent: the event was created without ACL_EVENT_SYNC");
  {
    std::lock_guard lock(ev->m);
    ev->waited = false;
  }
  enqueue(st, [] {});  // in stream order, after the wait it follows
  return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent e, aclrtEventRecordedStatus* status) {
  LOOMEMU_INJECT("aclrtQueryEventStatus");
  event_state* ev = resolve_event(e);
  if (!ev || !status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: bad event or NULL output");
  std::lock_guard lock(ev->m);
  *status = ev->completed >= ev->recorded ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

static aclError sync_event(const char* api, aclrtEvent e, int32_t timeout) {
  event_state* ev = resolve_event(e);
  if (!ev) return fail(ACL_ERROR_INVALID_PARAM, std::string(api) + ": not a live event");
  g().c.host_waits++;
  std::unique_lock lock(ev->m);
  const uint64_t target = ev->recorded;
  auto done = [&] { return ev->completed >= target; };
  if (timeout < 0) {
    ev->cv.wait(lock, done);
  } else if (!ev->cv.wait_for(lock, std::chrono::milliseconds(timeout), done)) {
    return fail(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, std::string(api) + ": timed out");
  }
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeEvent(aclrtEvent e) {
  LOOMEMU_INJECT("aclrtSynchronizeEvent");
  return sync_event("aclrtSynchronizeEvent", e, -1);
}

aclError aclrtSynchronizeEventWithTimeout(aclrtEvent e, int32_t timeout) {
  LOOMEMU_INJECT("aclrtSynchronizeEventWithTimeout");
  return sync_event("aclrtSynchronizeEventWithTimeout", e, timeout);
}

aclError aclrtEventElapsedTime(float* ms, aclrtEvent start, aclrtEvent end) {
  LOOMEMU_INJECT("aclrtEventElapsedTime");
  event_state* a = resolve_event(start);
  event_state* b = resolve_event(end);
  if (!ms || !a || !b) return fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: bad event or NULL output");
  for (auto* ev : {a, b}) {
    if (!ev->plain && !(ev->flags & ACL_EVENT_TIME_LINE))
      return fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: event created without ACL_EVENT_TIME_LINE");
    std::lock_guard lock(ev->m);
    if (ev->recorded == 0 || ev->completed < ev->recorded)
      return fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtEventElapsedTime: an event is not recorded or not complete; synchronize on the end event "
                  "first (documented order: create, record both, synchronize, query)");
  }
  std::scoped_lock lock(a->m, b->m);
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return ACL_SUCCESS;
}

aclError aclrtDestroyEvent(aclrtEvent e) {
  LOOMEMU_INJECT("aclrtDestroyEvent");
  event_state* ev = resolve_event(e);
  if (!ev) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent: not a live event");
  {
    std::lock_guard lock(ev->m);
    if (ev->completed < ev->recorded)
      return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent: the event is still pending on a stream");
    if (ev->waiters > 0)
      return fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtDestroyEvent: a stream still has a pending aclrtStreamWaitEvent on this event (documented: "
                  "ensure no pending wait/sync before destroying; synchronize the waiting stream first)");
  }
  {
    std::lock_guard lock(event_mutex);
    events().erase(ev);
  }
  delete ev;
  return ACL_SUCCESS;
}

// --- control interface (loom_emulation/control.h) ------------------------------------------------------------
void loomemu_inject_failure(const char* api, int code, int skip, int count) {
  std::lock_guard lock(g().m);
  g().injections[api] = {code, skip, count};
}

void loomemu_reset(void) {
  std::lock_guard lock(g().m);
  g().injections.clear();
  for (auto& d : g().devices) {
    d.limit = default_device_bytes;
    d.deterministic = 0;
  }
}

void loomemu_set_device_memory_limit(int device, size_t bytes) {
  std::lock_guard lock(g().m);
  if (device >= 0 && device < max_devices) g().devices[device].limit = bytes;
}

void loomemu_set_device_count(int count) {
  std::lock_guard lock(g().m);
  g().device_count = std::clamp(count, 0, max_devices);
}

}  // extern "C"

namespace {
/// LOOMEMU_COUNTERS_FILE=<path>: at process exit, append one line of this process's counters
/// ("pid P host_waits N sync_copies N async_copies N h2d_copies_behind_work N
/// h2d_copies_beside_work N executors_run N tasks N") — how a test
/// reads what a whole program (train_gpt) asked of the runtime.
struct counters_at_exit {
  ~counters_at_exit() {
    const char* path = std::getenv("LOOMEMU_COUNTERS_FILE");
    if (!path || !*path) return;
    if (std::FILE* f = std::fopen(path, "a")) {
      const loomemu_counters c = loomemu_get_counters();
      std::fprintf(f,
                   "pid %ld host_waits %llu sync_copies %llu async_copies %llu h2d_copies_behind_work %llu "
                   "h2d_copies_beside_work %llu executors_run %llu tasks %llu\n",
                   long(::getpid()), (unsigned long long)c.host_waits, (unsigned long long)c.sync_copies,
                   (unsigned long long)c.async_copies, (unsigned long long)c.h2d_copies_behind_work,
                   (unsigned long long)c.h2d_copies_beside_work, (unsigned long long)c.executors_run, (unsigned long long)c.tasks_executed);
      std::fclose(f);
    }
  }
} report_counters;
}  // namespace

extern "C" {

loomemu_counters loomemu_get_counters(void) {
  auto& s = g();
  loomemu_counters c{};
  c.device_mallocs = s.c.device_mallocs;
  c.device_frees = s.c.device_frees;
  c.host_pinned_allocs = s.c.host_pinned;
  c.executors_created = s.c.executors_created;
  c.executors_run = s.c.executors_run;
  c.tasks_executed = s.c.tasks;
  c.checks_failed = s.c.checks_failed;
  c.async_copies = s.c.async_copies;
  c.sync_copies = s.c.sync_copies;
  c.host_waits = s.c.host_waits;
  c.h2d_copies_behind_work = s.c.h2d_behind_work;
  c.h2d_copies_beside_work = s.c.h2d_beside_work;
  std::lock_guard lock(s.m);
  for (const auto& [base, a] : s.allocs)
    if (a.kind == mem_kind::device) {
      c.live_device_allocs++;
      c.live_device_bytes += a.size;
    }
  return c;
}

}  // extern "C"
