#pragma once
// Helpers for the Ascend tests. They run against loom's host emulation of CANN (emulation/), never
// against an NPU: what they prove is that loom drives the documented APIs correctly as far as the
// emulation checks them (docs/ascend.md says what that does and does not cover).
//
// The emulation is a fake toolkit (<build>/ascend_emulation/lib64/libascendcl.so, ...) that the
// tests load exactly as loom loads CANN — through ascend_runtime, from ASCEND_HOME_PATH (set by
// CTest) or LOOM_ASCEND_EMULATION_HOME. Nothing is linked: the emulation's control functions
// (loomemu_*) are resolved with dlsym too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/core/buffer.hpp>
#include <loom/device/ascend.hpp>
#include <loom/device/ascend_runtime.hpp>

#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace loom_test {

using npu = loom::device::ascend;
namespace acl = loom::device::acl;

/// The emulation, loaded once for the test process (test-local; loom itself has no such global).
inline const std::shared_ptr<const loom::device::ascend_runtime>& runtime() {
  static const std::shared_ptr<const loom::device::ascend_runtime> rt = [] {
    loom::device::ascend_runtime_options o;
    const char* home = std::getenv("ASCEND_HOME_PATH");
    if (!home || !*home) o.roots = {LOOM_ASCEND_EMULATION_HOME};
    o.use_default_roots = false;  // never pick up a real toolkit by accident
    o.use_loader_path = false;
    auto r = loom::device::ascend_runtime::load(o);
    if (!r->symbol("loomemu_reset"))
      throw std::runtime_error("the loaded libascendcl.so is not loom's emulation (no loomemu_reset)");
    return r;
  }();
  return rt;
}
/// The emulation's function table.
inline const acl::api_table& api() { return runtime()->api(); }

/// An emulation control function (emulation/include/loom_emulation/control.h), by dlsym.
template <class F>
F* emu(const char* name) {
  auto* f = reinterpret_cast<F*>(runtime()->symbol(name));
  if (!f) throw std::runtime_error(std::string("the emulation does not export ") + name);
  return f;
}
/// Mirrors loomemu_counters of emulation/include/loom_emulation/control.h (keep in sync).
struct loomemu_counters {
  std::uint64_t device_mallocs, device_frees, live_device_allocs;
  std::size_t live_device_bytes;
  std::uint64_t host_pinned_allocs, executors_created, executors_run, tasks_executed, checks_failed, async_copies,
      sync_copies, host_waits, h2d_copies_behind_work, h2d_copies_beside_work;
};
/// Mirrors loomemu_prof_event / loomemu_prof_kind of control.h (keep in sync).
enum { LOOMEMU_PROF_INIT, LOOMEMU_PROF_START, LOOMEMU_PROF_STOP, LOOMEMU_PROF_FINALIZE };
struct loomemu_prof_event {
  int kind;
  std::uint64_t executors_run, data_type_config;
  std::uint32_t device_count;
};
inline void loomemu_inject_failure(const char* api, int code, int skip, int count) {
  emu<void(const char*, int, int, int)>("loomemu_inject_failure")(api, code, skip, count);
}
inline void loomemu_reset() { emu<void()>("loomemu_reset")(); }
inline void loomemu_set_device_memory_limit(int device, std::size_t bytes) {
  emu<void(int, std::size_t)>("loomemu_set_device_memory_limit")(device, bytes);
}
inline void loomemu_set_device_count(int count) { emu<void(int)>("loomemu_set_device_count")(count); }
inline loomemu_counters loomemu_get_counters() { return emu<loomemu_counters()>("loomemu_get_counters")(); }
/// The buffer size (MB) and determinism a live HCCL communicator was created with (control.h).
struct hccl_settings {
  std::uint32_t buffsize_mb = 0, deterministic = 0;
};
inline hccl_settings loomemu_hccl_comm_config(void* comm) {
  hccl_settings s;
  if (emu<int(void*, std::uint32_t*, std::uint32_t*)>("loomemu_hccl_comm_config")(comm, &s.buffsize_mb,
                                                                                    &s.deterministic) != 0)
    throw std::runtime_error("loomemu_hccl_comm_config: not a live communicator");
  return s;
}
template <class T>
using dbuf = loom::buffer<npu, T>;

/// n values from N(0, stdev^2) (never all zero), deterministic per seed.
inline std::vector<float> randn(std::size_t n, std::uint64_t seed, float stdev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stdev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Rounds every value to T and back (so CPU references see exactly the device's inputs).
template <class T>
std::vector<float> quantize(std::vector<float> v) {
  for (auto& x : v) x = float(T(x));
  return v;
}

template <class T>
std::vector<T> to(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(v[i]);
  return out;
}

template <class T>
std::vector<float> to_float(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
  return out;
}

/// A device buffer holding v converted to T.
template <class T, class S>
dbuf<T> upload(loom::context<npu>& ctx, const std::vector<S>& v) {
  dbuf<T> b(v.size(), ctx.stream);
  std::vector<T> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = T(v[i]);
  npu::copy_to_device(b.data(), h.data(), h.size() * sizeof(T), ctx.stream);
  return b;
}

/// The device values as floats (synchronizes).
template <class T>
std::vector<float> download(loom::context<npu>& ctx, const T* p, std::size_t n) {
  std::vector<T> h(n);
  npu::copy_to_host(h.data(), p, n * sizeof(T), ctx.stream);
  ctx.synchronize();
  return to_float(h);
}

/// Normalised mean squared error sum((a-b)^2) / sum(b^2) (ggml test-backend-ops' metric).
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

/// NMSE thresholds per storage type: one output rounding of T plus fp32-vs-double accumulation.
template <class T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, float>) return 1e-10;
  else if constexpr (std::is_same_v<T, Eigen::half>) return 1e-6;
  else return 5e-5;  // bfloat16: 8 significant bits
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, Eigen::half>) return "fp16";
  else return "bf16";
}

/// Clears injected failures after a test that sets them (also on failure).
struct emulation_reset {
  ~emulation_reset() { loomemu_reset(); }
};

}  // namespace loom_test
