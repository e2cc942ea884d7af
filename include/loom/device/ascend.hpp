#pragma once
/// \file loom::device::ascend — Huawei Ascend NPUs through the ACL runtime (CANN).
///
///   loom::device::ascend_device npu(0);            // aclInit once, aclrtSetDevice(0) on this thread,
///   auto& ctx = npu.context();                     // a compute stream; ctx is what kernels take
///   loom::buffer<loom::device::ascend, float> x(n, ctx.stream);   // from the caching allocator
///   loom::device::ascend::copy_to_device(x.data(), host, n * 4, ctx.stream);
///   ctx.synchronize();
///
/// What is what (sources: loom's API reference, shared/reference/ascend-api.md §1, §6, §7):
///   * ascend (the policy, a stateless type)  device memory from a per-device caching_allocator
///     over aclrtMalloc(ACL_MEM_MALLOC_HUGE_FIRST); pinned host memory from aclrtMallocHost;
///     copies and memsets with aclrtMemcpyAsync / aclrtMemsetAsync on the given stream.
///     aclrtMemcpyAsync needs 64-byte aligned addresses and, for host<->device, page-locked host
///     memory (CANN 8.0: otherwise undefined behaviour; 8.5: silently synchronous). loom keeps a
///     registry of its aclrtMallocHost blocks: a copy with a pinned, aligned host side is
///     asynchronous; any other copy first synchronizes the stream and then uses the synchronous
///     aclrtMemcpy, which is correct on every CANN version (and slow — pass pinned memory).
///   * device_guard     aclrtSetDevice for the current thread (the device is per thread), restoring
///                      the previous device on destruction.
///   * ascend_stream, ascend_event   RAII over aclrtStream / aclrtEvent (timing: TIME_LINE events).
///   * ascend_device    one thread's handle on one NPU: guard + compute stream + context.
///   * context<ascend>  {stream, device ordinal, kernel constants (causal mask, ones vectors)}.
/// Every ACL call is checked: failures throw loom::device_error(code, api, aclGetRecentErrMsg(),
/// call site). Destructors and deallocate never throw (failures are reported on stderr).
///
/// Global state, deliberately: ACL itself is process-global (aclInit, devices), and so is device
/// memory; the caching allocators (one per device, created on first use, never destroyed so no
/// aclrtFree runs after aclFinalize at exit) and the pinned-block registry mirror that. Streams,
/// contexts and communicators are still passed explicitly.
#include <acl/acl.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/device/caching_allocator.hpp>
#include <loom/device/detail/acl_check.hpp>
#include <loom/device/policy.hpp>

namespace loom::device {

namespace detail {

/// aclInit(NULL) once per process. ACL_ERROR_REPEAT_INITIALIZE counts as success: CANN 8.1 allows
/// one aclInit per process and another component may have called it (the reference's advice).
inline void ascend_initialize() {
  static std::once_flag once;
  std::call_once(once, [] {
    const aclError rc = aclInit(nullptr);
    if (rc != ACL_SUCCESS && rc != acl_status::repeat_initialize) acl_check(rc, "aclInit");
  });
}

/// The calling thread's current NPU. Throws device_error when the thread never selected one.
inline int ascend_current_device(std::source_location where = std::source_location::current()) {
  int32_t dev = -1;
  const aclError rc = aclrtGetDevice(&dev);
  if (rc != ACL_SUCCESS)
    throw device_error(rc, "aclrtGetDevice",
                       "this thread has no current NPU: create a loom::device::ascend_device or device_guard on every "
                       "thread that issues Ascend work (aclrtSetDevice is per thread)",
                       where);
  return dev;
}

/// Switches the thread to `device` for the lifetime of the object if it is not current already.
class scoped_device {
 public:
  explicit scoped_device(int device) {
    int32_t cur = -1;
    if (aclrtGetDevice(&cur) == ACL_SUCCESS && cur == device) return;
    acl_check(aclrtSetDevice(device), "aclrtSetDevice");
    previous_ = cur;
    switched_ = true;
  }
  ~scoped_device() {
    if (switched_ && previous_ >= 0) acl_warn(aclrtSetDevice(previous_), "aclrtSetDevice");
  }
  scoped_device(const scoped_device&) = delete;
  scoped_device& operator=(const scoped_device&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

/// Raw device memory for caching_allocator: aclrtMalloc / aclrtFree on one device.
struct acl_memory_backend {
  int device = 0;
  static constexpr int out_of_memory_code = acl_status::rt_memory_allocation;
  static constexpr std::string_view allocate_api = "aclrtMalloc";

  void* raw_allocate(std::size_t bytes) {
    scoped_device on(device);
    void* p = nullptr;
    const aclError rc = aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
    if (rc == acl_status::rt_memory_allocation || rc == acl_status::bad_alloc) return nullptr;
    acl_check(rc, "aclrtMalloc");
    return p;
  }
  void raw_free(void* p) noexcept {
    try {
      scoped_device on(device);
      acl_warn(aclrtFree(p), "aclrtFree");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: warning: could not free NPU memory: %s\n", e.what());
    }
  }
  void synchronize() {
    scoped_device on(device);
    acl_check(aclrtSynchronizeDevice(), "aclrtSynchronizeDevice");
  }
};

/// The aclrtMallocHost blocks loom handed out, so copies know when they may be asynchronous.
class pinned_registry {
 public:
  void add(const void* p, std::size_t bytes) {
    std::lock_guard lock(m_);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
  void remove(const void* p) noexcept {
    std::lock_guard lock(m_);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  /// True when [p, p+bytes) lies inside one pinned block.
  bool contains(const void* p, std::size_t bytes) const noexcept {
    std::lock_guard lock(m_);
    const auto key = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(key);
    if (it == blocks_.begin()) return false;
    --it;
    return key - it->first + bytes <= it->second;
  }
  static pinned_registry& instance() {
    static auto* r = new pinned_registry;  // leaked: used from deallocate_host during exit
    return *r;
  }

 private:
  mutable std::mutex m_;
  std::map<std::uintptr_t, std::size_t> blocks_;
};

inline bool aligned64(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

}  // namespace detail

/// The Ascend NPU as a device policy (STYLE §3.2). All functions act on the calling thread's
/// current NPU (see device_guard / ascend_device) and order their work on the given stream.
struct ascend {
  using stream_type = aclrtStream;
  using memory_pool = caching_allocator<detail::acl_memory_backend>;
  static constexpr std::string_view name = "ascend";
  /// Block starts are raw aclrtMalloc starts (no sub-allocation); the runtime documents 64-byte
  /// alignment as what asynchronous copies need, so that is what loom promises.
  static constexpr std::size_t alignment = 64;
  static constexpr int max_devices = 64;

  /// The caching allocator of NPU `device`, created on first use. Throws input_error for an
  /// ordinal outside [0, 64).
  static memory_pool& memory(int device) {
    if (device < 0 || device >= max_devices)
      throw input_error("loom::device::ascend::memory: device " + std::to_string(device) +
                        " is outside [0, 64); pass an NPU ordinal from ascend_device::count()");
    auto& slot = pools()[std::size_t(device)];
    if (memory_pool* p = slot.load(std::memory_order_acquire)) return *p;
    static std::mutex m;
    std::lock_guard lock(m);
    if (memory_pool* p = slot.load(std::memory_order_relaxed)) return *p;
    auto* p = new memory_pool(detail::acl_memory_backend{device}, "ascend:" + std::to_string(device));
    slot.store(p, std::memory_order_release);
    return *p;
  }
  /// The caching allocator of the calling thread's current NPU.
  static memory_pool& memory() { return memory(detail::ascend_current_device()); }

  /// `bytes` of device memory on the current NPU (not initialised), for use on the default
  /// stream key. Throws device_error (out of memory after flushing the cache, no current NPU).
  static void* allocate(std::size_t bytes) { return memory().allocate(bytes); }
  /// Returns p to its pool. Never throws; p must not be in use by work on another stream.
  static void deallocate(void* p) noexcept {
    if (!p) return;
    for (auto& slot : pools())
      if (memory_pool* pool = slot.load(std::memory_order_acquire))
        if (pool->try_deallocate(p)) return;
    std::fprintf(stderr, "loom: warning: ascend::deallocate(%p): not a block of any loom NPU pool\n", p);
  }

  /// Bytes from p to the end of the loom pool block containing it (0 when p is in none).
  static std::size_t bytes_after(const void* p) {
    for (auto& slot : pools())
      if (memory_pool* pool = slot.load(std::memory_order_acquire))
        if (const std::size_t n = pool->bytes_after(p)) return n;
    return 0;
  }

  /// Page-locked host memory (aclrtMallocHost): what asynchronous host<->device copies need.
  static void* allocate_host(std::size_t bytes) {
    detail::ascend_initialize();
    void* p = nullptr;
    detail::acl_check(aclrtMallocHost(&p, bytes ? bytes : 1), "aclrtMallocHost");
    detail::pinned_registry::instance().add(p, bytes ? bytes : 1);
    return p;
  }
  static void deallocate_host(void* p) noexcept {
    if (!p) return;
    detail::pinned_registry::instance().remove(p);
    detail::acl_warn(aclrtFreeHost(p), "aclrtFreeHost");
  }
  /// True when [p, p+bytes) is inside a block from allocate_host.
  static bool is_pinned(const void* p, std::size_t bytes) noexcept {
    return detail::pinned_registry::instance().contains(p, bytes);
  }

  /// Device-to-device copy ordered on s (aclrtMemcpyAsync; synchronous aclrtMemcpy after a
  /// stream synchronize when an address is not 64-byte aligned, or when s is nullptr).
  static void copy(void* dst, const void* src, std::size_t bytes, stream_type s) {
    transfer(dst, src, bytes, s, ACL_MEMCPY_DEVICE_TO_DEVICE, true);
  }
  /// Host-to-device copy ordered on s. Asynchronous only when src is pinned (allocate_host) and
  /// both addresses are 64-byte aligned; otherwise it synchronizes s and copies synchronously, so
  /// src may be reused as soon as the call returns.
  static void copy_to_device(void* dst, const void* src, std::size_t bytes, stream_type s) {
    transfer(dst, src, bytes, s, ACL_MEMCPY_HOST_TO_DEVICE, is_pinned(src, bytes));
  }
  /// Device-to-host copy ordered on s; same rule. With a pinned dst, read it only after
  /// synchronize(s).
  static void copy_to_host(void* dst, const void* src, std::size_t bytes, stream_type s) {
    transfer(dst, src, bytes, s, ACL_MEMCPY_DEVICE_TO_HOST, is_pinned(dst, bytes));
  }
  /// Fills bytes with the low byte of `byte`, ordered on s (aclrtMemsetAsync). With s == nullptr
  /// (e.g. buffer's default argument) the fill is synchronous (aclrtMemset): the ACL default stream
  /// is not ordered with loom's streams, so an asynchronous fill there could race with them.
  static void memset(void* p, int byte, std::size_t bytes, stream_type s) {
    if (!bytes) return;
    if (!s) {
      detail::acl_check(aclrtMemset(p, bytes, byte, bytes), "aclrtMemset");
      return;
    }
    detail::acl_check(aclrtMemsetAsync(p, bytes, byte, bytes, s), "aclrtMemsetAsync");
  }
  /// Blocks until all work on s has finished; errors of earlier asynchronous work surface here.
  static void synchronize(stream_type s) { detail::acl_check(aclrtSynchronizeStream(s), "aclrtSynchronizeStream"); }

 private:
  static std::array<std::atomic<memory_pool*>, max_devices>& pools() {
    static std::array<std::atomic<memory_pool*>, max_devices> p{};
    return p;
  }
  static void transfer(void* dst, const void* src, std::size_t bytes, stream_type s, aclrtMemcpyKind kind,
                       bool host_side_pinned) {
    if (!bytes) return;
    if (s && host_side_pinned && detail::aligned64(dst) && detail::aligned64(src)) {
      detail::acl_check(aclrtMemcpyAsync(dst, bytes, src, bytes, kind, s), "aclrtMemcpyAsync");
      return;
    }
    if (s) synchronize(s);  // the synchronous copy is not ordered with the stream: drain it first
    detail::acl_check(aclrtMemcpy(dst, bytes, src, bytes, kind), "aclrtMemcpy");
  }
};
static_assert(device_policy<ascend>);

/// Makes `device` the calling thread's current NPU (aclrtSetDevice, after aclInit if needed) and
/// restores the previous one on destruction. Throws device_error for a missing NPU.
class device_guard {
 public:
  explicit device_guard(int device) {
    detail::ascend_initialize();
    int32_t cur = -1;
    had_previous_ = aclrtGetDevice(&cur) == ACL_SUCCESS;
    previous_ = cur;
    detail::acl_check(aclrtSetDevice(device), "aclrtSetDevice");
  }
  ~device_guard() {
    if (had_previous_) detail::acl_warn(aclrtSetDevice(previous_), "aclrtSetDevice");
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int32_t previous_ = -1;
  bool had_previous_ = false;
};

/// An owned aclrtStream on the current NPU. Destruction synchronizes, then destroys (the header
/// restriction: synchronize before aclrtDestroyStream); it never throws.
class ascend_stream {
 public:
  ascend_stream() { detail::acl_check(aclrtCreateStream(&s_), "aclrtCreateStream"); }
  ~ascend_stream() { reset(); }
  ascend_stream(ascend_stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  ascend_stream& operator=(ascend_stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  aclrtStream get() const noexcept { return s_; }
  void synchronize() const { ascend::synchronize(s_); }

 private:
  void reset() noexcept {
    if (!s_) return;
    detail::acl_warn(aclrtSynchronizeStream(s_), "aclrtSynchronizeStream");
    detail::acl_warn(aclrtDestroyStream(s_), "aclrtDestroyStream");
    s_ = nullptr;
  }
  aclrtStream s_ = nullptr;
};

/// An owned aclrtEvent that can time and order streams (ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC,
/// torch_npu's choice for timing events). Timing: record(start) ... record(end), end.synchronize(),
/// then elapsed_ms(start, end) — the documented order.
class ascend_event {
 public:
  ascend_event() {
    detail::acl_check(aclrtCreateEventWithFlag(&e_, ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC), "aclrtCreateEventWithFlag");
  }
  ~ascend_event() {
    if (!e_) return;
    detail::acl_warn(aclrtSynchronizeEvent(e_), "aclrtSynchronizeEvent");
    detail::acl_warn(aclrtDestroyEvent(e_), "aclrtDestroyEvent");
  }
  ascend_event(const ascend_event&) = delete;
  ascend_event& operator=(const ascend_event&) = delete;

  /// Marks the point in s's work; completes when s reaches it.
  void record(aclrtStream s) { detail::acl_check(aclrtRecordEvent(e_, s), "aclrtRecordEvent"); }
  /// Makes s wait (on the device) until this event completes.
  void wait(aclrtStream s) const { detail::acl_check(aclrtStreamWaitEvent(s, e_), "aclrtStreamWaitEvent"); }
  void synchronize() const { detail::acl_check(aclrtSynchronizeEvent(e_), "aclrtSynchronizeEvent"); }
  /// True when the last record has completed (non-blocking).
  bool query() const {
    aclrtEventRecordedStatus st{};
    detail::acl_check(aclrtQueryEventStatus(e_, &st), "aclrtQueryEventStatus");
    return st == ACL_EVENT_RECORDED_STATUS_COMPLETE;
  }
  /// Milliseconds between two completed events.
  static float elapsed_ms(const ascend_event& start, const ascend_event& end) {
    float ms = 0;
    detail::acl_check(aclrtEventElapsedTime(&ms, start.e_, end.e_), "aclrtEventElapsedTime");
    return ms;
  }
  aclrtEvent get() const noexcept { return e_; }

 private:
  aclrtEvent e_ = nullptr;
};

namespace detail {
/// Small device buffers the kernels create once per context and reuse (the compressed causal
/// mask, vectors of ones). Freed back to the pool with the context.
class ascend_constants {
 public:
  ascend_constants() = default;
  ascend_constants(const ascend_constants&) = delete;
  ascend_constants& operator=(const ascend_constants&) = delete;
  ~ascend_constants() {
    for (auto& [key, b] : blocks_) ascend::deallocate(b.first);
  }
  /// The buffer named `key` of at least `bytes`; (re)created by `fill(ptr, bytes)` (which must
  /// enqueue its initialisation on the context's stream) when missing or too small.
  template <class Fill>
  void* get(const std::string& key, std::size_t bytes, int device, aclrtStream s, Fill&& fill) {
    std::lock_guard lock(m_);
    auto it = blocks_.find(key);
    if (it != blocks_.end() && it->second.second >= bytes) return it->second.first;
    if (it != blocks_.end()) {
      ascend::deallocate(it->second.first);  // stream-ordered reuse: safe on the same stream
      blocks_.erase(it);
    }
    void* p = ascend::memory(device).allocate(bytes, s);
    try {
      fill(p, bytes);
    } catch (...) {
      ascend::deallocate(p);
      throw;
    }
    blocks_[key] = {p, bytes};
    return p;
  }

 private:
  std::mutex m_;
  std::map<std::string, std::pair<void*, std::size_t>> blocks_;
};
}  // namespace detail

}  // namespace loom::device

namespace loom {

/// The Ascend context: the stream kernels are ordered on, the NPU it belongs to, and the kernels'
/// per-context constants. Cheap to copy (copies share the constants). Usually obtained from
/// device::ascend_device::context().
template <>
struct context<device::ascend> {
  using device = loom::device::ascend;
  aclrtStream stream = nullptr;
  int ordinal = 0;
  std::shared_ptr<loom::device::detail::ascend_constants> constants =
      std::make_shared<loom::device::detail::ascend_constants>();
  /// Blocks until everything queued on this context's stream has finished.
  void synchronize() const { loom::device::ascend::synchronize(stream); }
  /// The caching allocator of this context's NPU.
  loom::device::ascend::memory_pool& memory() const { return loom::device::ascend::memory(ordinal); }
};

}  // namespace loom

namespace loom::device {

/// One thread's handle on one NPU: initialises ACL (once per process), makes `ordinal` the
/// thread's current device, creates a compute stream and the context kernels take. Destruction
/// synchronizes the stream, releases the context's constants, destroys the stream and restores the
/// previously current device; it never throws. Not copyable or movable (contexts refer to it).
class ascend_device {
 public:
  explicit ascend_device(int ordinal = 0) : guard_(check_ordinal(ordinal)), ordinal_(ordinal) {
    ctx_.stream = stream_.get();
    ctx_.ordinal = ordinal;
  }
  ~ascend_device() {
    detail::acl_warn(aclrtSynchronizeStream(stream_.get()), "aclrtSynchronizeStream");
    ctx_.constants.reset();
  }
  ascend_device(const ascend_device&) = delete;
  ascend_device& operator=(const ascend_device&) = delete;

  loom::context<ascend>& context() noexcept { return ctx_; }
  int ordinal() const noexcept { return ordinal_; }
  ascend::memory_pool& memory() const { return ascend::memory(ordinal_); }

  /// Number of visible NPUs (aclrtGetDeviceCount; honours ASCEND_RT_VISIBLE_DEVICES).
  static int count() {
    detail::ascend_initialize();
    uint32_t n = 0;
    detail::acl_check(aclrtGetDeviceCount(&n), "aclrtGetDeviceCount");
    return int(n);
  }

 private:
  static int check_ordinal(int ordinal) {
    detail::ascend_initialize();
    if (ordinal < 0) throw input_error("ascend_device: NPU ordinal " + std::to_string(ordinal) + " is negative");
    return ordinal;
  }
  device_guard guard_;
  int ordinal_;
  ascend_stream stream_;
  loom::context<ascend> ctx_;
};

}  // namespace loom::device
