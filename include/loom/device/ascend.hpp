#pragma once
/// \file loom::device::ascend — Huawei Ascend NPUs through the ACL runtime (CANN).
///
///   auto rt = loom::device::ascend_runtime::load();  // dlopen CANN (device/ascend_runtime.hpp)
///   loom::device::ascend_device npu(rt, 0);        // aclInit once, aclrtSetDevice(0) on this thread,
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
///   * ascend_copy_engine   a copy stream beside a context's compute stream (the trainer's batches).
///   * ascend_transfer_stream   copies both ways on a stream of their own (device/ascend_transfer.hpp:
///                      the offloaded optimizer's chunks).
///   * context<ascend>  {stream, device ordinal, kernel constants (causal mask, ones vectors)}.
/// Every ACL call goes through the runtime's function table (ascend_runtime, loaded at run time,
/// nothing linked) and is checked: failures throw loom::device_error(code, api,
/// aclGetRecentErrMsg(), call site). Destructors and deallocate never throw (failures are
/// reported on stderr).
///
/// Which runtime a call uses: kernels and communicators take it from the context
/// (context<ascend>::runtime, passed explicitly). The stateless policy functions (allocate,
/// copy, memset, synchronize — the device_policy concept gives them no context) use the calling
/// thread's binding, made by device_guard / ascend_device together with aclrtSetDevice and
/// undone with it: ACL's current device is per thread, and so is the table it was set through.
/// Memory frees need no binding: each pool and pinned block remembers its runtime.
///
/// Global state, deliberately: ACL itself is process-global (aclInit, devices), and so is device
/// memory; the caching allocators (one per device, created on first use, never destroyed so no
/// aclrtFree runs after aclFinalize at exit) and the pinned-block registry mirror that. The
/// function table is not global (see ascend_runtime); streams, contexts and communicators are
/// passed explicitly.

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
#include <loom/device/ascend_runtime.hpp>
#include <loom/core/device.hpp>

namespace loom::device {

namespace detail {

/// The runtime the calling thread's current NPU was selected through (device_guard), or null.
inline const ascend_runtime*& thread_runtime() noexcept {
  thread_local const ascend_runtime* rt = nullptr;
  return rt;
}

/// The calling thread's runtime; throws device_error naming the fix when the thread has none.
inline const ascend_runtime& bound_runtime(loom::source_location where = loom::source_location::current()) {
  if (const ascend_runtime* rt = thread_runtime()) return *rt;
  throw device_error(acl_status::invalid_device, "loom::device::ascend",
                     "this thread has no current NPU: create a loom::device::ascend_device(runtime, ordinal) or "
                     "device_guard(runtime, ordinal) on every thread that issues Ascend work (aclrtSetDevice is per "
                     "thread)",
                     where);
}

/// The calling thread's current NPU. Throws device_error when the thread never selected one.
inline int ascend_current_device(const acl::api_table& api,
                                 loom::source_location where = loom::source_location::current()) {
  int32_t dev = -1;
  const acl::aclError rc = api.aclrtGetDevice(&dev);
  if (rc != acl::success)
    throw device_error(rc, "aclrtGetDevice",
                       "this thread has no current NPU: create a loom::device::ascend_device or device_guard on every "
                       "thread that issues Ascend work (aclrtSetDevice is per thread)",
                       where);
  return dev;
}

/// Switches the thread to `device` for the lifetime of the object if it is not current already.
class scoped_device {
 public:
  scoped_device(const acl::api_table& api, int device) : api_(api) {
    int32_t cur = -1;
    if (api.aclrtGetDevice(&cur) == acl::success && cur == device) return;
    acl_check(api, api.aclrtSetDevice(device), "aclrtSetDevice");
    previous_ = cur;
    switched_ = true;
  }
  ~scoped_device() {
    if (switched_ && previous_ >= 0) acl_warn(api_, api_.aclrtSetDevice(previous_), "aclrtSetDevice");
  }
  scoped_device(const scoped_device&) = delete;
  scoped_device& operator=(const scoped_device&) = delete;

 private:
  const acl::api_table& api_;
  int previous_ = -1;
  bool switched_ = false;
};

/// Raw device memory for caching_allocator: aclrtMalloc / aclrtFree on one device.
struct acl_memory_backend {
  std::shared_ptr<const ascend_runtime> runtime;
  int device = 0;
  static constexpr int out_of_memory_code = acl_status::rt_memory_allocation;
  static constexpr std::string_view allocate_api = "aclrtMalloc";

  void* raw_allocate(std::size_t bytes) {
    const auto& api = runtime->api();
    scoped_device on(api, device);
    void* p = nullptr;
    const acl::aclError rc = api.aclrtMalloc(&p, bytes, acl::malloc_huge_first);
    if (rc == acl_status::rt_memory_allocation || rc == acl_status::bad_alloc) return nullptr;
    acl_check(api, rc, "aclrtMalloc");
    return p;
  }
  void raw_free(void* p) noexcept {
    try {
      const auto& api = runtime->api();
      scoped_device on(api, device);
      acl_warn(api, api.aclrtFree(p), "aclrtFree");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: warning: could not free NPU memory: %s\n", e.what());
    }
  }
  void synchronize() {
    const auto& api = runtime->api();
    scoped_device on(api, device);
    acl_check(api, api.aclrtSynchronizeDevice(), "aclrtSynchronizeDevice");
  }
};

/// The aclrtMallocHost blocks loom handed out, so copies know when they may be asynchronous.
class pinned_registry {
 public:
  void add(const void* p, std::size_t bytes, const ascend_runtime* rt) {
    std::lock_guard lock(m_);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, rt};
  }
  /// Forgets p; returns the runtime it was allocated through (null when p is not a block).
  const ascend_runtime* remove(const void* p) noexcept {
    std::lock_guard lock(m_);
    auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == blocks_.end()) return nullptr;
    const ascend_runtime* rt = it->second.second;
    blocks_.erase(it);
    return rt;
  }
  /// True when [p, p+bytes) lies inside one pinned block.
  bool contains(const void* p, std::size_t bytes) const noexcept {
    std::lock_guard lock(m_);
    const auto key = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(key);
    if (it == blocks_.begin()) return false;
    --it;
    return key - it->first + bytes <= it->second.first;
  }
  static pinned_registry& instance() {
    static auto* r = new pinned_registry;  // leaked: used from deallocate_host during exit
    return *r;
  }

 private:
  mutable std::mutex m_;
  std::map<std::uintptr_t, std::pair<std::size_t, const ascend_runtime*>> blocks_;
};

inline bool aligned64(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

}  // namespace detail

class ascend_copy_engine;
class ascend_transfer_stream;

/// The Ascend NPU as a device policy (STYLE §3.2). All functions act on the calling thread's
/// current NPU (see device_guard / ascend_device) and order their work on the given stream.
struct ascend {
  using stream_type = acl::aclrtStream;
  using memory_pool = caching_allocator<detail::acl_memory_backend>;
  static constexpr std::string_view name = "ascend";
  /// Block starts are raw aclrtMalloc starts (no sub-allocation); the runtime documents 64-byte
  /// alignment as what asynchronous copies need, so that is what loom promises.
  static constexpr std::size_t alignment = 64;
  static constexpr int max_devices = 64;
  /// Host-to-device copies on a stream of their own (train::trainer's batches).
  using copy_engine = ascend_copy_engine;
  /// Copies both ways beside the compute stream (optim::offload_adamw; device/ascend_transfer.hpp).
  using transfer_stream = ascend_transfer_stream;

  /// The caching allocator of NPU `device`, created on first use with `runtime` (which it keeps
  /// alive). Throws input_error for an ordinal outside [0, 64).
  static memory_pool& memory(const std::shared_ptr<const ascend_runtime>& runtime, int device) {
    if (device < 0 || device >= max_devices)
      throw input_error("loom::device::ascend::memory: device " + std::to_string(device) +
                        " is outside [0, 64); pass an NPU ordinal from ascend_device::count()");
    auto& slot = pools()[std::size_t(device)];
    if (memory_pool* p = slot.load(std::memory_order_acquire)) return *p;
    static std::mutex m;
    std::lock_guard lock(m);
    if (memory_pool* p = slot.load(std::memory_order_relaxed)) return *p;
    auto* p = new memory_pool(detail::acl_memory_backend{runtime, device}, "ascend:" + std::to_string(device));
    slot.store(p, std::memory_order_release);
    return *p;
  }
  /// The caching allocator of NPU `device`; it must exist already (an ascend_device for it was
  /// created). Throws device_error otherwise.
  static memory_pool& memory(int device) {
    if (device >= 0 && device < max_devices)
      if (memory_pool* p = pools()[std::size_t(device)].load(std::memory_order_acquire)) return *p;
    throw device_error(detail::acl_status::invalid_device, "loom::device::ascend::memory",
                       "no memory pool for NPU " + std::to_string(device) +
                           ": create a loom::device::ascend_device(runtime, " + std::to_string(device) + ") first");
  }
  /// The caching allocator of the calling thread's current NPU.
  static memory_pool& memory() { return memory(detail::ascend_current_device(detail::bound_runtime().api())); }

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
  /// Uses the calling thread's runtime (device_guard / ascend_device).
  static void* allocate_host(std::size_t bytes) {
    const ascend_runtime& rt = detail::bound_runtime();
    void* p = nullptr;
    detail::acl_check(rt.api(), rt.api().aclrtMallocHost(&p, bytes ? bytes : 1), "aclrtMallocHost");
    detail::pinned_registry::instance().add(p, bytes ? bytes : 1, &rt);
    return p;
  }
  static void deallocate_host(void* p) noexcept {
    if (!p) return;
    const ascend_runtime* rt = detail::pinned_registry::instance().remove(p);
    if (!rt) {
      std::fprintf(stderr, "loom: warning: ascend::deallocate_host(%p): not a block of allocate_host\n", p);
      return;
    }
    detail::acl_warn(rt->api(), rt->api().aclrtFreeHost(p), "aclrtFreeHost");
  }
  /// True when [p, p+bytes) is inside a block from allocate_host.
  static bool is_pinned(const void* p, std::size_t bytes) noexcept {
    return detail::pinned_registry::instance().contains(p, bytes);
  }

  /// Device-to-device copy ordered on s (aclrtMemcpyAsync; synchronous aclrtMemcpy after a
  /// stream synchronize when an address is not 64-byte aligned, or when s is nullptr).
  static void copy(void* dst, const void* src, std::size_t bytes, stream_type s) {
    transfer(dst, src, bytes, s, acl::memcpy_device_to_device, true);
  }
  /// Host-to-device copy ordered on s. Asynchronous only when src is pinned (allocate_host) and
  /// both addresses are 64-byte aligned; otherwise it synchronizes s and copies synchronously, so
  /// src may be reused as soon as the call returns.
  static void copy_to_device(void* dst, const void* src, std::size_t bytes, stream_type s) {
    transfer(dst, src, bytes, s, acl::memcpy_host_to_device, is_pinned(src, bytes));
  }
  /// Device-to-host copy ordered on s; same rule. With a pinned dst, read it only after
  /// synchronize(s).
  static void copy_to_host(void* dst, const void* src, std::size_t bytes, stream_type s) {
    transfer(dst, src, bytes, s, acl::memcpy_device_to_host, is_pinned(dst, bytes));
  }
  /// Fills bytes with the low byte of `byte`, ordered on s (aclrtMemsetAsync). With s == nullptr
  /// (e.g. buffer's default argument) the fill is synchronous (aclrtMemset): the ACL default stream
  /// is not ordered with loom's streams, so an asynchronous fill there could race with them.
  static void memset(void* p, int byte, std::size_t bytes, stream_type s) {
    if (!bytes) return;
    const auto& api = detail::bound_runtime().api();
    if (!s) {
      detail::acl_check(api, api.aclrtMemset(p, bytes, byte, bytes), "aclrtMemset");
      return;
    }
    detail::acl_check(api, api.aclrtMemsetAsync(p, bytes, byte, bytes, s), "aclrtMemsetAsync");
  }
  /// Blocks until all work on s has finished; errors of earlier asynchronous work surface here.
  static void synchronize(stream_type s) {
    const auto& api = detail::bound_runtime().api();
    detail::acl_check(api, api.aclrtSynchronizeStream(s), "aclrtSynchronizeStream");
  }

 private:
  static std::array<std::atomic<memory_pool*>, max_devices>& pools() {
    static std::array<std::atomic<memory_pool*>, max_devices> p{};
    return p;
  }
  static void transfer(void* dst, const void* src, std::size_t bytes, stream_type s, acl::aclrtMemcpyKind kind,
                       bool host_side_pinned) {
    if (!bytes) return;
    const auto& api = detail::bound_runtime().api();
    if (s && host_side_pinned && detail::aligned64(dst) && detail::aligned64(src)) {
      detail::acl_check(api, api.aclrtMemcpyAsync(dst, bytes, src, bytes, kind, s), "aclrtMemcpyAsync");
      return;
    }
    if (s) synchronize(s);  // the synchronous copy is not ordered with the stream: drain it first
    detail::acl_check(api, api.aclrtMemcpy(dst, bytes, src, bytes, kind), "aclrtMemcpy");
  }
};
static_assert(device_policy<ascend>);

/// Makes `device` the calling thread's current NPU (aclrtSetDevice through `runtime`, after its
/// aclInit) and binds the thread to `runtime` (see the file comment); restores the previous
/// device and binding on destruction. Throws device_error for a missing NPU. `runtime` must
/// outlive the guard.
class device_guard {
 public:
  device_guard(const ascend_runtime& runtime, int device) : api_(runtime.api()) {
    runtime.initialize();
    int32_t cur = -1;
    had_previous_ = api_.aclrtGetDevice(&cur) == acl::success;
    previous_ = cur;
    detail::acl_check(api_, api_.aclrtSetDevice(device), "aclrtSetDevice");
    previous_runtime_ = std::exchange(detail::thread_runtime(), &runtime);
  }
  ~device_guard() {
    if (had_previous_) detail::acl_warn(api_, api_.aclrtSetDevice(previous_), "aclrtSetDevice");
    detail::thread_runtime() = previous_runtime_;
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  const acl::api_table& api_;
  int32_t previous_ = -1;
  bool had_previous_ = false;
  const ascend_runtime* previous_runtime_ = nullptr;
};

/// An owned aclrtStream on the current NPU. Destruction synchronizes, then destroys (the header
/// restriction: synchronize before aclrtDestroyStream); it never throws. `runtime` must outlive it.
class ascend_stream {
 public:
  explicit ascend_stream(const ascend_runtime& runtime) : api_(&runtime.api()) {
    detail::acl_check(*api_, api_->aclrtCreateStream(&s_), "aclrtCreateStream");
  }
  ~ascend_stream() { reset(); }
  ascend_stream(ascend_stream&& o) noexcept : api_(o.api_), s_(std::exchange(o.s_, nullptr)) {}
  ascend_stream& operator=(ascend_stream&& o) noexcept {
    if (this != &o) {
      reset();
      api_ = o.api_;
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  acl::aclrtStream get() const noexcept { return s_; }
  void synchronize() const { detail::acl_check(*api_, api_->aclrtSynchronizeStream(s_), "aclrtSynchronizeStream"); }

 private:
  void reset() noexcept {
    if (!s_) return;
    detail::acl_warn(*api_, api_->aclrtSynchronizeStream(s_), "aclrtSynchronizeStream");
    detail::acl_warn(*api_, api_->aclrtDestroyStream(s_), "aclrtDestroyStream");
    s_ = nullptr;
  }
  const acl::api_table* api_;
  acl::aclrtStream s_ = nullptr;
};

/// An owned aclrtEvent that can time and order streams (ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC,
/// torch_npu's choice for timing events). Timing: record(start) ... record(end), end.synchronize(),
/// then elapsed_ms(start, end) — the documented order. `runtime` must outlive it.
///
/// Reuse: loom records the same event every step. CANN documents re-recording only for events of
/// aclrtCreateEventExWithFlag ("event can be reused naturally"; aclrtRecordEvent, runtime docs
/// 07_event_management), which it uses where the runtime has it (runtime.reusable_events()); for
/// aclrtCreateEventWithFlag events it prescribes create -> record -> aclrtStreamWaitEvent ->
/// aclrtResetEvent (CANN 8.0.RC2 aclrtRecordEvent page), so there wait() resets the event on the
/// waiting stream right after the wait. Either way a wait refers to the record before it, one
/// wait per record (reference ascend-runtime-audit.md §2.1).
class ascend_event {
 public:
  explicit ascend_event(const ascend_runtime& runtime) : api_(runtime.api()), reset_after_wait_(!runtime.reusable_events()) {
    if (reset_after_wait_)
      detail::acl_check(api_, api_.aclrtCreateEventWithFlag(&e_, acl::event_time_line | acl::event_sync),
                        "aclrtCreateEventWithFlag");
    else
      detail::acl_check(api_, api_.aclrtCreateEventExWithFlag(&e_, acl::event_time_line | acl::event_sync),
                        "aclrtCreateEventExWithFlag");
  }
  ~ascend_event() {
    if (!e_) return;
    detail::acl_warn(api_, api_.aclrtSynchronizeEvent(e_), "aclrtSynchronizeEvent");
    detail::acl_warn(api_, api_.aclrtDestroyEvent(e_), "aclrtDestroyEvent");
  }
  ascend_event(const ascend_event&) = delete;
  ascend_event& operator=(const ascend_event&) = delete;

  /// Marks the point in s's work; completes when s reaches it.
  void record(acl::aclrtStream s) { detail::acl_check(api_, api_.aclrtRecordEvent(e_, s), "aclrtRecordEvent"); }
  /// Makes s wait (on the device) until this event's last record completes; without re-recordable
  /// events, then resets it on s (aclrtResetEvent), so that it may be recorded again.
  void wait(acl::aclrtStream s) const {
    detail::acl_check(api_, api_.aclrtStreamWaitEvent(s, e_), "aclrtStreamWaitEvent");
    if (reset_after_wait_) detail::acl_check(api_, api_.aclrtResetEvent(e_, s), "aclrtResetEvent");
  }
  void synchronize() const { detail::acl_check(api_, api_.aclrtSynchronizeEvent(e_), "aclrtSynchronizeEvent"); }
  /// True when the last record has completed (non-blocking).
  bool query() const {
    acl::aclrtEventRecordedStatus st{};
    detail::acl_check(api_, api_.aclrtQueryEventStatus(e_, &st), "aclrtQueryEventStatus");
    return st == acl::event_recorded_complete;
  }
  /// Milliseconds between two completed events.
  static float elapsed_ms(const ascend_event& start, const ascend_event& end) {
    float ms = 0;
    detail::acl_check(end.api_, end.api_.aclrtEventElapsedTime(&ms, start.e_, end.e_), "aclrtEventElapsedTime");
    return ms;
  }
  acl::aclrtEvent get() const noexcept { return e_; }

 private:
  const acl::api_table& api_;
  bool reset_after_wait_;  ///< an aclrtCreateEventWithFlag event: reset after every wait
  acl::aclrtEvent e_ = nullptr;
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
  void* get(const std::string& key, std::size_t bytes, int device, acl::aclrtStream s, Fill&& fill) {
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

/// The Ascend context: the runtime (function table) every call goes through, the stream kernels
/// are ordered on, the NPU it belongs to, and the kernels' per-context constants. Cheap to copy
/// (copies share the runtime and the constants). Usually obtained from ascend_device::context().
template <>
struct context<device::ascend> {
  using device = loom::device::ascend;
  std::shared_ptr<const loom::device::ascend_runtime> runtime;
  loom::device::acl::aclrtStream stream = nullptr;
  int ordinal = 0;
  std::shared_ptr<loom::device::detail::ascend_constants> constants =
      std::make_shared<loom::device::detail::ascend_constants>();
  /// Observer of the kernels enqueued with this context (core/kernel_hook.hpp); null = none. The
  /// zones it sees are host-side enqueues: the kernels run later on `stream`.
  kernel_hook* hook = nullptr;
  /// The resolved CANN functions (runtime must be set: contexts come from ascend_device).
  const loom::device::acl::api_table& api() const noexcept { return runtime->api(); }
  /// Blocks until everything queued on this context's stream has finished.
  void synchronize() const {
    loom::device::detail::acl_check(api(), api().aclrtSynchronizeStream(stream), "aclrtSynchronizeStream");
  }
  /// The caching allocator of this context's NPU.
  loom::device::ascend::memory_pool& memory() const { return loom::device::ascend::memory(runtime, ordinal); }
};

}  // namespace loom

namespace loom::device {

/// One thread's handle on one NPU: initialises ACL through `runtime` (once per runtime object),
/// makes `ordinal` the thread's current device, creates a compute stream and the context kernels
/// take. Destruction synchronizes the stream, releases the context's constants, destroys the
/// stream and restores the previously current device; it never throws. Not copyable or movable
/// (contexts refer to it). Throws input_error for a negative ordinal, device_error for a missing
/// NPU.
class ascend_device {
 public:
  ascend_device(std::shared_ptr<const ascend_runtime> runtime, int ordinal = 0)
      : runtime_(check(std::move(runtime), ordinal)), guard_(*runtime_, ordinal), ordinal_(ordinal),
        stream_(*runtime_) {
    ctx_.runtime = runtime_;
    ctx_.stream = stream_.get();
    ctx_.ordinal = ordinal;
    (void)ascend::memory(runtime_, ordinal);  // the pool of this NPU, bound to this runtime
  }
  ~ascend_device() {
    detail::acl_warn(runtime_->api(), runtime_->api().aclrtSynchronizeStream(stream_.get()), "aclrtSynchronizeStream");
    ctx_.constants.reset();
  }
  ascend_device(const ascend_device&) = delete;
  ascend_device& operator=(const ascend_device&) = delete;

  loom::context<ascend>& context() noexcept { return ctx_; }
  int ordinal() const noexcept { return ordinal_; }
  ascend::memory_pool& memory() const { return ascend::memory(runtime_, ordinal_); }
  const ascend_runtime& runtime() const noexcept { return *runtime_; }

  /// Deterministic kernels on this NPU's context: aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC,
  /// on) (acl_rt.h: "set system param option value in current context"; torch_npu's deterministic
  /// switch takes this option, reference ascend-api.md §1 — its exact call unconfirmed). Operators
  /// with a non-deterministic default (aclnnRmsNormGrad, aclnnEmbeddingDenseBackward: atomic adds)
  /// then give the same bits run to run, at a cost in speed. HCCL's reductions are separate:
  /// HCCL_DETERMINISTIC=true in the environment of every rank before its communicators are made.
  /// Call on the thread that made this device. Throws input_error when the runtime lacks the
  /// function, device_error when it fails.
  void set_deterministic(bool on) {
    const auto& api = runtime_->api();
    if (!api.aclrtCtxSetSysParamOpt)
      throw input_error("deterministic kernels: this NPU runtime has no aclrtCtxSetSysParamOpt; use a CANN 8.x toolkit "
                        "(examples/doctor checks it), or train without --deterministic-mode");
    detail::acl_check(api, api.aclrtCtxSetSysParamOpt(acl::opt_deterministic, on ? 1 : 0), "aclrtCtxSetSysParamOpt");
  }
  /// Whether this NPU's context runs deterministic kernels (aclrtCtxGetSysParamOpt); false when
  /// the runtime cannot say.
  bool deterministic() const {
    const auto& api = runtime_->api();
    std::int64_t v = 0;
    if (!api.aclrtCtxGetSysParamOpt) return false;
    detail::acl_check(api, api.aclrtCtxGetSysParamOpt(acl::opt_deterministic, &v), "aclrtCtxGetSysParamOpt");
    return v != 0;
  }

  /// Number of visible NPUs (aclrtGetDeviceCount; honours ASCEND_RT_VISIBLE_DEVICES).
  static int count(const ascend_runtime& runtime) {
    runtime.initialize();
    uint32_t n = 0;
    detail::acl_check(runtime.api(), runtime.api().aclrtGetDeviceCount(&n), "aclrtGetDeviceCount");
    return int(n);
  }

 private:
  static std::shared_ptr<const ascend_runtime> check(std::shared_ptr<const ascend_runtime> rt, int ordinal) {
    if (!rt) throw input_error("ascend_device: no runtime; pass loom::device::ascend_runtime::load()");
    if (ordinal < 0) throw input_error("ascend_device: NPU ordinal " + std::to_string(ordinal) + " is negative");
    return rt;
  }
  std::shared_ptr<const ascend_runtime> runtime_;
  device_guard guard_;
  int ordinal_;
  ascend_stream stream_;
  loom::context<ascend> ctx_;
};

/// Host-to-device copies on a stream of their own, beside a context's compute stream, so that a
/// batch's copy runs while the compute stream still works on the previous step (CUDA's
/// copy-stream idiom; MindSpore's data sink sends batches ahead the same way). Two events order the
/// streams without the host: the copy stream waits for `released` (recorded on the compute stream
/// after its last read of the destination), the compute stream waits for `copied` (recorded on
/// the copy stream after the copy). Sources: aclrtRecordEvent, aclrtStreamWaitEvent,
/// aclrtQueryEventStatus (shared/reference/ascend-api.md §1). The first copy waits for the compute
/// stream's work enqueued before construction (a destination's stream-ordered allocation and
/// zero fill: create the engine after its destinations). Create it on the thread that holds ctx's
/// NPU; ctx's runtime must outlive it. Destruction synchronizes both streams; never throws.
class ascend_copy_engine {
 public:
  explicit ascend_copy_engine(const loom::context<ascend>& ctx)
      : runtime_(ctx.runtime), compute_(ctx.stream), stream_(*runtime_), copied_(*runtime_), released_(*runtime_) {
    released_.record(compute_);
  }
  ~ascend_copy_engine() {
    const auto& api = runtime_->api();  // no wait may be pending when the events are destroyed
    detail::acl_warn(api, api.aclrtSynchronizeStream(compute_), "aclrtSynchronizeStream");
    detail::acl_warn(api, api.aclrtSynchronizeStream(stream_.get()), "aclrtSynchronizeStream");
  }
  ascend_copy_engine(const ascend_copy_engine&) = delete;
  ascend_copy_engine& operator=(const ascend_copy_engine&) = delete;

  /// Copies `bytes` from host `src` to device `dst` (ctx's NPU) on the copy stream, after the
  /// compute stream passed the last release(); ctx.stream then waits (on the device) for the
  /// copy. `src` must stay unchanged until wait_source_read(). A host side that is not pinned or
  /// not 64-byte aligned cannot be copied asynchronously: then the copy is ascend::copy_to_device
  /// on ctx.stream (synchronous, correct, slow). Throws device_error.
  void copy_to_device(loom::context<ascend>& ctx, void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    if (!ascend::is_pinned(src, bytes) || !detail::aligned64(src) || !detail::aligned64(dst)) {
      ascend::copy_to_device(dst, src, bytes, ctx.stream);
      return;
    }
    const auto& api = runtime_->api();
    released_.wait(stream_.get());
    detail::acl_check(api, api.aclrtMemcpyAsync(dst, bytes, src, bytes, acl::memcpy_host_to_device, stream_.get()),
                      "aclrtMemcpyAsync");
    copied_.record(stream_.get());
    copied_.wait(ctx.stream);
    pending_ = true;
  }
  /// Marks the point on ctx.stream after which the copies' destinations may be overwritten.
  void release(loom::context<ascend>& ctx) { released_.record(ctx.stream); }
  /// Returns once the last copy has read its source: without waiting when it has finished
  /// (aclrtQueryEventStatus), else aclrtSynchronizeEvent.
  void wait_source_read() {
    if (!pending_) return;
    if (!copied_.query()) copied_.synchronize();
    pending_ = false;
  }
  /// The copy stream (for tests).
  acl::aclrtStream stream() const noexcept { return stream_.get(); }

 private:
  std::shared_ptr<const ascend_runtime> runtime_;
  acl::aclrtStream compute_;
  ascend_stream stream_;
  ascend_event copied_, released_;
  bool pending_ = false;
};

}  // namespace loom::device

#include <loom/device/ascend_transfer.hpp>  // defines ascend::transfer_stream
