// loom's HOST EMULATION of CANN — NOT the vendor library.
// libmsprofiler.so: the profiling session API of acl/acl_prof.h (reference §5.1). Nothing is
// measured; the emulation checks the documented call order and arguments and logs each session
// call with the number of aclnn launches enqueued so far (loomemu_profiler_log), so tests can
// prove which steps a profiling window covered.
//
// Checks (each failure sets aclGetRecentErrMsg and returns ACL_ERROR_INVALID_PARAM for a bad
// argument or ACL_ERROR_PROFILING_FAILURE for a call out of order — the exact codes of the real
// library for these cases are not in the reference):
//   aclprofInit          after aclInit; path non-null and non-empty, `length` == strlen(path);
//                        not twice without aclprofFinalize
//   aclprofCreateConfig  after aclprofInit; 1..N devices, each an existing device id, list
//                        non-null; aicoreEvents must be NULL (reference: "must be NULL")
//   aclprofStart/Stop    a config of this process; start once, stop only a started config
//   aclprofDestroyConfig a config of this process that is not collecting
//   aclprofFinalize      after aclprofInit, with no config collecting
#include <acl/acl.h>
#include <acl/acl_prof.h>
#include <loom_emulation/control.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "internal.hpp"

struct aclprofConfig {
  std::vector<uint32_t> devices;
  aclprofAicoreMetrics metrics = ACL_AICORE_NONE;
  uint64_t data_types = 0;
  bool started = false;
};

namespace {

struct profiler_state {
  std::mutex m;
  bool session = false;
  std::string path;
  std::vector<std::unique_ptr<aclprofConfig>> configs;
  std::vector<loomemu_prof_event> log;
};
profiler_state& p() {
  static profiler_state s;
  return s;
}

uint64_t launches() { return loomemu_get_counters().executors_run; }

aclprofConfig* find(profiler_state& s, const aclprofConfig* c) {
  for (auto& x : s.configs)
    if (x.get() == c) return x.get();
  return nullptr;
}

void log_event(profiler_state& s, loomemu_prof_kind k, const aclprofConfig* c) {
  s.log.push_back({int(k), launches(), c ? c->data_types : 0, c ? uint32_t(c->devices.size()) : 0});
}

// aclprofStart (collect = true) and aclprofStop (false): a config of this process, started once,
// stopped only when started.
aclError set_collecting(const aclprofConfig* config, bool collect) {
  const std::string api = collect ? "aclprofStart" : "aclprofStop";
  if (int rc = loomemu::injected(api.c_str())) return rc;
  auto& s = p();
  std::lock_guard lock(s.m);
  aclprofConfig* c = find(s, config);
  if (!c) return loomemu::fail(ACL_ERROR_INVALID_PARAM, api + ": not a config of this profiling session");
  if (c->started == collect)
    return loomemu::fail(ACL_ERROR_PROFILING_FAILURE, api + (collect ? ": already started" : ": the config was not started"));
  c->started = collect;
  log_event(s, collect ? LOOMEMU_PROF_START : LOOMEMU_PROF_STOP, c);
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclprofInit(const char* profilerResultPath, size_t length) {
  if (int rc = loomemu::injected("aclprofInit")) return rc;
  if (!loomemu::initialized()) return loomemu::fail(ACL_ERROR_UNINITIALIZE, "aclprofInit called before aclInit");
  if (!profilerResultPath || !*profilerResultPath)
    return loomemu::fail(ACL_ERROR_INVALID_PARAM, "aclprofInit: profilerResultPath is null or empty");
  if (length != std::strlen(profilerResultPath))
    return loomemu::fail(ACL_ERROR_INVALID_PARAM, "aclprofInit: length " + std::to_string(length) +
                                                      " is not the path's length " +
                                                      std::to_string(std::strlen(profilerResultPath)));
  auto& s = p();
  std::lock_guard lock(s.m);
  if (s.session) return loomemu::fail(ACL_ERROR_PROFILING_FAILURE, "aclprofInit: a profiling session is already open");
  s.session = true;
  s.path = profilerResultPath;
  log_event(s, LOOMEMU_PROF_INIT, nullptr);
  return ACL_SUCCESS;
}

aclprofConfig* aclprofCreateConfig(uint32_t* deviceIdList, uint32_t deviceNums, aclprofAicoreMetrics aicoreMetrics,
                                   const aclprofAicoreEvents* aicoreEvents, uint64_t dataTypeConfig) {
  if (loomemu::injected("aclprofCreateConfig")) return nullptr;
  auto& s = p();
  std::lock_guard lock(s.m);
  if (!s.session) {
    loomemu::fail(ACL_ERROR_PROFILING_FAILURE, "aclprofCreateConfig called before aclprofInit");
    return nullptr;
  }
  if (!deviceIdList || deviceNums == 0) {
    loomemu::fail(ACL_ERROR_INVALID_PARAM, "aclprofCreateConfig: empty device list");
    return nullptr;
  }
  if (aicoreEvents) {
    loomemu::fail(ACL_ERROR_INVALID_PARAM, "aclprofCreateConfig: aicoreEvents must be NULL");
    return nullptr;
  }
  uint32_t count = 0;
  (void)aclrtGetDeviceCount(&count);
  for (uint32_t i = 0; i < deviceNums; ++i)
    if (deviceIdList[i] >= count) {
      loomemu::fail(ACL_ERROR_INVALID_PARAM, "aclprofCreateConfig: device " + std::to_string(deviceIdList[i]) +
                                                 " does not exist (" + std::to_string(count) + " devices)");
      return nullptr;
    }
  auto c = std::make_unique<aclprofConfig>();
  c->devices.assign(deviceIdList, deviceIdList + deviceNums);
  c->metrics = aicoreMetrics;
  c->data_types = dataTypeConfig;
  s.configs.push_back(std::move(c));
  return s.configs.back().get();
}

aclError aclprofStart(const aclprofConfig* profilerConfig) { return set_collecting(profilerConfig, true); }

aclError aclprofStop(const aclprofConfig* profilerConfig) { return set_collecting(profilerConfig, false); }

aclError aclprofDestroyConfig(const aclprofConfig* profilerConfig) {
  if (int rc = loomemu::injected("aclprofDestroyConfig")) return rc;
  auto& s = p();
  std::lock_guard lock(s.m);
  aclprofConfig* c = find(s, profilerConfig);
  if (!c) return loomemu::fail(ACL_ERROR_INVALID_PARAM, "aclprofDestroyConfig: not a config of this profiling session");
  if (c->started) return loomemu::fail(ACL_ERROR_PROFILING_FAILURE, "aclprofDestroyConfig: stop the config first");
  std::erase_if(s.configs, [&](const auto& x) { return x.get() == c; });
  return ACL_SUCCESS;
}

aclError aclprofFinalize() {
  if (int rc = loomemu::injected("aclprofFinalize")) return rc;
  auto& s = p();
  std::lock_guard lock(s.m);
  if (!s.session) return loomemu::fail(ACL_ERROR_PROFILING_FAILURE, "aclprofFinalize without aclprofInit");
  for (const auto& c : s.configs)
    if (c->started) return loomemu::fail(ACL_ERROR_PROFILING_FAILURE, "aclprofFinalize: a config is still collecting");
  s.session = false;
  log_event(s, LOOMEMU_PROF_FINALIZE, nullptr);
  return ACL_SUCCESS;
}

size_t loomemu_profiler_log(loomemu_prof_event* out, size_t capacity) {
  auto& s = p();
  std::lock_guard lock(s.m);
  for (size_t i = 0; i < capacity && i < s.log.size(); ++i) out[i] = s.log[i];
  return s.log.size();
}

void loomemu_profiler_clear(void) {
  auto& s = p();
  std::lock_guard lock(s.m);
  s.log.clear();
}

}  // extern "C"
