// device::ascend (policy, guard, streams, events, pinned memory), the caching allocator (on a host
// fake and on the emulated ACL), error reporting (injected ACL failures become device_error with
// code, message and call site), and one test per misuse check of the emulation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>

#include <unistd.h>

#include <loom/device/ascend.hpp>
#include <loom/device/ascend_profiler.hpp>
#include <loom/device/caching_allocator.hpp>
#include <loom/kernels/ascend.hpp>

#include "support.hpp"

using namespace loom_test;

namespace {

/// A host "device" for the allocator's logic: counts raw calls, fails beyond a byte limit.
struct fake_backend {
  std::map<void*, std::size_t>* live;  // raw blocks and their sizes
  std::size_t limit;
  int* syncs;
  static constexpr int out_of_memory_code = 4242;
  static constexpr std::string_view allocate_api = "fake_malloc";
  std::size_t used() const {
    std::size_t n = 0;
    for (const auto& [p, b] : *live) n += b;
    return n;
  }
  void* raw_allocate(std::size_t bytes) {
    if (used() + bytes > limit) return nullptr;
    void* p = std::malloc(bytes);
    (*live)[p] = bytes;
    return p;
  }
  void raw_free(void* p) noexcept {
    live->erase(p);
    std::free(p);
  }
  void synchronize() { ++*syncs; }
};

}  // namespace

TEST_CASE("caching allocator: size classes round to 512 B below 1 MiB and to quarter powers of two above") {
  using A = loom::device::caching_allocator<fake_backend>;
  CHECK(A::round_size(0) == 512);
  CHECK(A::round_size(1) == 512);
  CHECK(A::round_size(513) == 1024);
  CHECK(A::round_size(1 << 20) == (1 << 20));
  CHECK(A::round_size((1 << 20) + 1) == (1 << 20) + (1 << 18));  // 1.25 MiB
  CHECK(A::round_size(3 << 20) == (3 << 20));                     // 1.5 * 2 MiB
  CHECK(A::round_size((3 << 20) + 5) == (7 << 19));               // 1.75 * 2 MiB
}

TEST_CASE("caching allocator: freed blocks are reused by size class and stream, with statistics") {
  std::map<void*, std::size_t> live;
  int syncs = 0;
  loom::device::caching_allocator<fake_backend> pool(fake_backend{&live, std::size_t(1) << 30, &syncs}, "fake");
  int s1 = 0, s2 = 0;  // two stream keys
  void* a = pool.allocate(1000, &s1);
  void* b = pool.allocate(3000, &s1);
  auto st = pool.stats();
  CHECK(st.allocated == 1024 + 3072);
  CHECK(st.requested == 4000);
  CHECK(st.reserved == 1024 + 3072);
  CHECK(st.device_allocations == 2);
  CHECK(st.active_blocks == 2);
  CHECK(pool.bytes_after(static_cast<char*>(b) + 1000) == 2000);
  pool.deallocate(a);
  st = pool.stats();
  CHECK(st.allocated == 3072);
  CHECK(st.reserved == 1024 + 3072);  // kept
  CHECK(st.cached_blocks == 1);
  CHECK(st.peak_allocated == 1024 + 3072);

  CHECK(pool.allocate(900, &s1) == a);  // same class, same stream: reused
  CHECK(pool.stats().cache_hits == 1);
  pool.deallocate(a);
  void* c = pool.allocate(900, &s2);  // same class, another stream: a new block
  CHECK(c != a);
  void* d = pool.allocate(2000, &s1);  // another class: a new block
  CHECK(d != a);
  st = pool.stats();
  CHECK(st.device_allocations == 4);
  CHECK(st.cache_hits == 1);
  CHECK(st.allocations == 5);

  pool.deallocate(b);
  pool.deallocate(c);
  pool.deallocate(d);
  pool.empty_cache();
  st = pool.stats();
  CHECK(syncs == 1);  // empty_cache synchronizes before giving memory back
  CHECK(st.reserved == 0);
  CHECK(st.cached_blocks == 0);
  CHECK(st.device_frees == 4);
  CHECK(live.empty());
  CHECK(st.peak_reserved == 1024 + 3072 + 1024 + 2048);
  pool.reset_peak_stats();
  CHECK(pool.stats().peak_reserved == 0);

  const std::string summary = pool.memory_summary();
  CHECK(summary.find("loom caching allocator: fake") != std::string::npos);
  CHECK(summary.find("Reserved memory") != std::string::npos);
  CHECK(summary.find("Served from cache") != std::string::npos);
}

TEST_CASE("caching allocator: out of memory flushes the cache once, then throws device_error with the summary") {
  std::map<void*, std::size_t> live;
  int syncs = 0;
  loom::device::caching_allocator<fake_backend> pool(fake_backend{&live, 8192, &syncs}, "small");
  void* a = pool.allocate(4096);
  pool.deallocate(a);                // cached: 4096 of the 8192 bytes stay held
  void* b = pool.allocate(6000);     // 6144 does not fit beside it: flush the cache, retry, succeed
  CHECK(b != nullptr);
  CHECK(pool.stats().oom_retries == 1);
  CHECK(syncs == 1);                 // the flush waited for the device first
  CHECK(pool.stats().reserved == 6144);
  try {
    (void)pool.allocate(4096);       // nothing left to flush: throws
    FAIL("expected device_error");
  } catch (const loom::device_error& e) {
    CHECK(e.code() == fake_backend::out_of_memory_code);
    const std::string what = e.what();
    CHECK(what.find("fake_malloc failed with code 4242") != std::string::npos);
    CHECK(what.find("out of device memory on small") != std::string::npos);
    CHECK(what.find("Allocated memory") != std::string::npos);
  }
  CHECK(pool.stats().oom_retries == 2);
  pool.deallocate(b);
}

TEST_CASE("ascend device: buffers come from the per-device caching allocator and are reused") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  auto& pool = dev.memory();
  const auto before = loomemu_get_counters();
  const auto st0 = pool.stats();
  void* first = nullptr;
  {
    dbuf<float> b(1000, ctx.stream);
    first = b.data();
    CHECK(reinterpret_cast<std::uintptr_t>(first) % npu::alignment == 0);
  }
  {
    dbuf<float> b(990, ctx.stream);  // same 4 KiB class: the block comes back without aclrtMalloc
    CHECK(b.data() == first);
  }
  const auto st1 = pool.stats();
  CHECK(st1.cache_hits >= st0.cache_hits + 1);
  CHECK(loomemu_get_counters().device_mallocs <= before.device_mallocs + 1);
  ctx.synchronize();
  pool.empty_cache();
  CHECK(pool.stats().cached_blocks == 0);
  CHECK(loomemu_get_counters().device_frees > before.device_frees);
  CHECK(dev.memory().memory_summary().find("ascend:0") != std::string::npos);
}

TEST_CASE("ascend device: out of device memory flushes the cache, then reports the code and the summary") {
  emulation_reset reset;
  loom::device::ascend_device dev(runtime(), 2);
  auto& pool = dev.memory();
  pool.empty_cache();
  loomemu_set_device_memory_limit(2, std::size_t(6) << 20);
  void* a = npu::allocate(std::size_t(3) << 20);
  npu::deallocate(a);                               // cached on the default stream key
  const auto retries = pool.stats().oom_retries;
  void* b = npu::allocate(std::size_t(4) << 20);    // needs the cached block's memory: flush + retry
  CHECK(b != nullptr);
  CHECK(pool.stats().oom_retries == retries + 1);
  try {
    (void)npu::allocate(std::size_t(4) << 20);
    FAIL("expected device_error");
  } catch (const loom::device_error& e) {
    CHECK(e.code() == 207001);  // ACL_ERROR_RT_MEMORY_ALLOCATION
    const std::string what = e.what();
    CHECK(what.find("aclrtMalloc failed with code 207001") != std::string::npos);
    CHECK(what.find("Reserved memory") != std::string::npos);
  }
  npu::deallocate(b);
  pool.empty_cache();
}

TEST_CASE("ascend device: an injected ACL failure becomes device_error with code, message and call site") {
  emulation_reset reset;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  dbuf<float> x(64, ctx.stream);
  loomemu_inject_failure("aclrtMemsetAsync", 507899, 0, 1);
  try {
    npu::memset(x.data(), 0, x.bytes(), ctx.stream);
    FAIL("expected device_error");
  } catch (const loom::device_error& e) {
    CHECK(e.code() == 507899);
    const std::string what = e.what();
    CHECK(what.find("aclrtMemsetAsync failed with code 507899") != std::string::npos);
    CHECK(what.find("injected failure of aclrtMemsetAsync") != std::string::npos);  // api().aclGetRecentErrMsg()
    CHECK(what.find("ascend.hpp:") != std::string::npos);                           // file:line of the call
  }
  // the next call works again (count = 1)
  npu::memset(x.data(), 0, x.bytes(), ctx.stream);
  ctx.synchronize();
}

TEST_CASE("ascend kernels: failures of either aclnn phase name the phase, the code and the kernel's call site") {
  emulation_reset reset;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  dbuf<float> a(6, ctx.stream), w(6, ctx.stream), y(4, ctx.stream);
  using ops = loom::kernels::ops<npu, float>;
  loomemu_inject_failure("aclnnMatmulGetWorkspaceSize", 561003, 0, 1);
  try {
    ops::matmul_forward(ctx, y.data(), a.data(), w.data(), nullptr, 2, 3, 2);
    FAIL("expected device_error");
  } catch (const loom::device_error& e) {
    CHECK(e.code() == 561003);
    const std::string what = e.what();
    CHECK(what.find("aclnnMatmulGetWorkspaceSize failed with code 561003") != std::string::npos);
    CHECK(what.find("no kernel binary") != std::string::npos);  // the hint for 561003
    CHECK(what.find("matmul.hpp:") != std::string::npos);
  }
  loomemu_inject_failure("aclnnMatmul", 361001, 0, 1);
  CHECK_THROWS_WITH_AS(ops::matmul_forward(ctx, y.data(), a.data(), w.data(), nullptr, 2, 3, 2),
                       doctest::Contains("aclnnMatmul failed with code 361001"), loom::device_error);
  ops::matmul_forward(ctx, y.data(), a.data(), w.data(), nullptr, 2, 3, 2);  // works again
  ctx.synchronize();
}

TEST_CASE("ascend kernels: a fault inside asynchronous work surfaces at the next synchronize") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int B = 1, Tn = 3, C = 4, V = 5;
  auto tok = upload<std::int32_t>(ctx, std::vector<std::int32_t>{1, 7, 2});  // 7 is outside [0, 5)
  dbuf<float> wte(std::size_t(V) * C, ctx.stream), wpe(std::size_t(Tn) * C, ctx.stream), out(std::size_t(Tn) * C, ctx.stream);
  // the call itself succeeds: the kernel has only been enqueued
  loom::kernels::ops<npu, float>::encoder_forward(ctx, out.data(), tok.data(), wte.data(), wpe.data(), B, Tn, C);
  try {
    ctx.synchronize();
    FAIL("expected device_error");
  } catch (const loom::device_error& e) {
    CHECK(e.code() == 507015);  // ACL_ERROR_RT_AICORE_EXCEPTION
    CHECK(std::string(e.what()).find("aclrtSynchronizeStream failed") != std::string::npos);
    CHECK(std::string(e.what()).find("outside [0, 5)") != std::string::npos);
  }
  ctx.synchronize();  // the error was reported once
}

TEST_CASE("ascend device: host copies are asynchronous only from pinned, aligned memory") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const std::size_t n = 4096;
  dbuf<float> d(n, ctx.stream);
  auto* pinned = static_cast<float*>(npu::allocate_host(n * sizeof(float)));
  CHECK(npu::is_pinned(pinned, n * sizeof(float)));
  CHECK_FALSE(npu::is_pinned(pinned, n * sizeof(float) + 1));
  for (std::size_t i = 0; i < n; ++i) pinned[i] = float(i) * 0.5f;
  auto c0 = loomemu_get_counters();
  npu::copy_to_device(d.data(), pinned, n * sizeof(float), ctx.stream);
  auto c1 = loomemu_get_counters();
  CHECK(c1.async_copies == c0.async_copies + 1);
  std::vector<float> pageable(n, -1.0f);
  npu::copy_to_host(pageable.data(), d.data(), n * sizeof(float), ctx.stream);  // syncs the stream first
  auto c2 = loomemu_get_counters();
  CHECK(c2.sync_copies == c1.sync_copies + 1);
  CHECK(pageable[n - 1] == float(n - 1) * 0.5f);
  // device-to-device at an unaligned offset falls back to a synchronous copy, still correct
  npu::copy(d.data() + 1, d.data() + 2000, 100 * sizeof(float), ctx.stream);
  npu::copy_to_host(pageable.data(), d.data(), n * sizeof(float), ctx.stream);
  CHECK(pageable[1] == 1000.0f);
  npu::deallocate_host(pinned);
}

TEST_CASE("ascend device: events time stream work; guards restore the previous device") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  loom::device::ascend_event start(*runtime()), stop(*runtime());
  start.record(ctx.stream);
  dbuf<float> x(1 << 16, ctx.stream);
  stop.record(ctx.stream);
  stop.synchronize();
  CHECK(stop.query());
  CHECK(loom::device::ascend_event::elapsed_ms(start, stop) >= 0.0f);
  {
    loom::device::device_guard g(*runtime(), 3);
    CHECK(loom::device::detail::ascend_current_device(api()) == 3);
  }
  CHECK(loom::device::detail::ascend_current_device(api()) == 0);
  // another thread has no current device until it makes one
  std::thread([] {
    CHECK_THROWS_WITH_AS(npu::allocate(64), doctest::Contains("has no current NPU"), loom::device_error);
    loom::device::ascend_device other(runtime(), 1);
    void* p = npu::allocate(64);
    npu::deallocate(p);
  }).join();
  CHECK(loom::device::ascend_device::count(*runtime()) >= 4);
}

namespace {
/// Ping-pong between two streams with two reused ascend_events, `rounds` times: stream a fills
/// `src` with byte i and records `ready`; stream b waits for it, copies src into slot i of
/// `dst` and records `free`, which a waits for before the next fill. Returns the slots' bytes.
std::vector<std::uint8_t> ping_pong(const loom::device::ascend_runtime& rt, int rounds) {
  loom::device::ascend_device dev(runtime(), 0);
  loom::device::ascend_stream a(rt), b(rt);
  loom::device::ascend_event ready(rt), free(rt);
  constexpr std::size_t n = 4096;
  dbuf<std::uint8_t> src(n, dev.context().stream), dst(n * std::size_t(rounds), dev.context().stream);
  dev.context().synchronize();
  for (int i = 0; i < rounds; ++i) {
    if (i > 0) free.wait(a.get());
    REQUIRE(rt.api().aclrtMemsetAsync(src.data(), n, i + 1, n, a.get()) == acl::success);
    ready.record(a.get());
    ready.wait(b.get());
    REQUIRE(rt.api().aclrtMemcpyAsync(dst.data() + std::size_t(i) * n, n, src.data(), n, acl::memcpy_device_to_device,
                                      b.get()) == acl::success);
    free.record(b.get());
  }
  b.synchronize();
  a.synchronize();
  std::vector<std::uint8_t> host(dst.size());
  npu::copy_to_host(host.data(), dst.data(), host.size(), dev.context().stream);
  dev.context().synchronize();
  std::vector<std::uint8_t> first(static_cast<std::size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    const auto* slot = host.data() + std::size_t(i) * n;
    CHECK(std::all_of(slot, slot + n, [&](std::uint8_t v) { return v == slot[0]; }));
    first[std::size_t(i)] = slot[0];
  }
  return first;
}
}  // namespace

TEST_CASE("ascend events: re-recorded every round, with Ex events and with reset-after-wait, order two streams") {
  std::vector<std::uint8_t> want(12);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = std::uint8_t(i + 1);
  REQUIRE(runtime()->reusable_events());  // the emulation exports aclrtCreateEventExWithFlag
  CHECK(ping_pong(*runtime(), 12) == want);
  loom::device::ascend_runtime_options o;  // as support.hpp's runtime(), without Ex events
  const char* home = std::getenv("ASCEND_HOME_PATH");
  if (!home || !*home) o.roots = {LOOM_ASCEND_EMULATION_HOME};
  o.use_default_roots = false;
  o.use_loader_path = false;
  o.reusable_events = false;
  const auto legacy = loom::device::ascend_runtime::load(o);
  REQUIRE_FALSE(legacy->reusable_events());
  CHECK(ping_pong(*legacy, 12) == want);
}

TEST_CASE("emulation check: a flag event re-recorded after a wait without aclrtResetEvent is refused; Ex events are not") {
  loom::device::ascend_device dev(runtime(), 0);
  loom::device::ascend_stream a(*runtime()), b(*runtime());
  const auto& f = api();
  for (const bool ex : {false, true}) {
    CAPTURE(ex);
    acl::aclrtEvent e = nullptr;
    REQUIRE((ex ? f.aclrtCreateEventExWithFlag : f.aclrtCreateEventWithFlag)(&e, acl::event_sync) == acl::success);
    CHECK(f.aclrtRecordEvent(e, a.get()) == acl::success);
    CHECK(f.aclrtRecordEvent(e, a.get()) == acl::success);  // no wait yet: recording again is fine
    CHECK(f.aclrtStreamWaitEvent(b.get(), e) == acl::success);
    if (ex) {
      CHECK(f.aclrtRecordEvent(e, a.get()) == acl::success);
    } else {
      CHECK(f.aclrtRecordEvent(e, a.get()) != acl::success);
      CHECK(std::string(f.aclGetRecentErrMsg()).find("aclrtResetEvent") != std::string::npos);
      CHECK(f.aclrtResetEvent(e, b.get()) == acl::success);
      CHECK(f.aclrtRecordEvent(e, a.get()) == acl::success);
    }
    b.synchronize();
    a.synchronize();
    CHECK(f.aclrtDestroyEvent(e) == acl::success);
  }
  acl::aclrtEvent plain = nullptr;
  using create_plain = acl::aclError(acl::aclrtEvent*);
  REQUIRE(emu<create_plain>("aclrtCreateEvent")(&plain) == acl::success);
  CHECK(f.aclrtResetEvent(plain, a.get()) != acl::success);  // documented: not for aclrtCreateEvent's events
  CHECK(f.aclrtDestroyEvent(plain) == acl::success);
}

TEST_CASE("ascend device: deterministic kernels are a context option that reads back; bad values are refused") {
  loom::device::ascend_device dev(runtime(), 2);
  CHECK_FALSE(dev.deterministic());
  dev.set_deterministic(true);
  CHECK(dev.deterministic());
  {
    loom::device::ascend_device other(runtime(), 3);  // another NPU's context is not affected
    CHECK_FALSE(other.deterministic());
  }
  CHECK(api().aclrtCtxSetSysParamOpt(acl::opt_deterministic, 2) != acl::success);
  dev.set_deterministic(false);
  CHECK_FALSE(dev.deterministic());
}

// --- the emulation's own checks, one per kind of misuse ---------------------------------------------------
namespace {
/// Runs aclnnInplaceCopy's phase 1 on raw descriptors and returns the status.
int copy_phase1(acl::aclTensor* dst, acl::aclTensor* src, uint64_t* ws, acl::aclOpExecutor** ex) {
  return api().aclnnInplaceCopyGetWorkspaceSize(dst, src, ws, ex);
}
acl::aclTensor* raw_tensor(void* p, std::vector<int64_t> dims, std::vector<int64_t> strides, int64_t storage) {
  return api().aclCreateTensor(dims.data(), dims.size(), acl::dt_float, strides.data(), 0, acl::format_nd, &storage, 1, p);
}
}  // namespace

TEST_CASE("emulation check: a view that does not fit its storage (wrong stride) is rejected in phase 1") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  dbuf<float> a(64, ctx.stream), b(64, ctx.stream);
  acl::aclTensor* dst = raw_tensor(a.data(), {8, 8}, {8, 1}, 64);
  acl::aclTensor* bad = raw_tensor(b.data(), {8, 8}, {9, 1}, 64);  // row stride 9 reaches element 70
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(copy_phase1(dst, bad, &ws, &ex) == 161002);
  CHECK(std::string(api().aclGetRecentErrMsg()).find("does not fit in the storage") != std::string::npos);
  api().aclDestroyTensor(dst);
  api().aclDestroyTensor(bad);
}

TEST_CASE("emulation check: a workspace smaller than phase 1 asked for is rejected in phase 2") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  dbuf<float> a(16, ctx.stream), w(16, ctx.stream), y(16, ctx.stream), work(4096, ctx.stream);
  loom::kernels::ascend::tensor A(ctx, a.data(), acl::dt_float, {4, 4}), W(ctx, w.data(), acl::dt_float, {4, 4}), Y(ctx, y.data(), acl::dt_float, {4, 4});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  REQUIRE(api().aclnnMatmulGetWorkspaceSize(A, W, Y, 0, &ws, &ex) == 0);
  REQUIRE(ws > 0);
  CHECK(api().aclnnMatmul(work.data(), ws - 1, ex, ctx.stream) == 161002);
  CHECK(std::string(api().aclGetRecentErrMsg()).find("smaller than") != std::string::npos);
  CHECK(api().aclnnMatmul(work.data(), ws, ex, ctx.stream) == 0);     // the executor is still usable
  CHECK(api().aclnnMatmul(work.data(), ws, ex, ctx.stream) == 161002);  // but only once
  CHECK(std::string(api().aclGetRecentErrMsg()).find("single use") != std::string::npos);
  ctx.synchronize();
}

TEST_CASE("emulation check: a freed pointer passed to an operator is rejected") {
  loom::device::ascend_device dev(runtime(), 0);
  void* p = nullptr;
  REQUIRE(api().aclrtMalloc(&p, 256, acl::malloc_huge_first) == 0);
  dbuf<float> other(64, dev.context().stream);
  REQUIRE(api().aclrtFree(p) == 0);
  acl::aclTensor* dst = raw_tensor(other.data(), {64}, {1}, 64);
  acl::aclTensor* freed = raw_tensor(p, {64}, {1}, 64);
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(copy_phase1(dst, freed, &ws, &ex) == 161002);
  CHECK(std::string(api().aclGetRecentErrMsg()).find("not in any live device allocation") != std::string::npos);
  CHECK(api().aclrtFree(p) == 100000);  // double free
  api().aclDestroyTensor(dst);
  api().aclDestroyTensor(freed);
}

TEST_CASE("emulation check: memory freed before the stream ran the operator is reported at synchronize") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int n = 320;  // a slow emulated matmul keeps the stream busy while the host frees
  dbuf<float> a(std::size_t(n) * n, ctx.stream), y(std::size_t(n) * n, ctx.stream);
  loom::kernels::ops<npu, float>::matmul_forward(ctx, y.data(), a.data(), a.data(), nullptr, n, n, n);
  void* p = nullptr;
  REQUIRE(api().aclrtMalloc(&p, 4096, acl::malloc_huge_first) == 0);
  REQUIRE(api().aclrtMemsetAsync(p, 4096, 0, 4096, ctx.stream) == 0);
  REQUIRE(api().aclrtFree(p) == 0);  // too early: the memset has not run yet
  CHECK_THROWS_WITH_AS(ctx.synchronize(), doctest::Contains("after its memory was freed"), loom::device_error);
}

TEST_CASE("emulation check: host memory where device memory is required, and pageable memory in async copies") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  std::vector<float> host(64, 1.0f);
  dbuf<float> d(64, ctx.stream);
  // a host pointer as an operator's tensor
  acl::aclTensor* dst = raw_tensor(d.data(), {64}, {1}, 64);
  acl::aclTensor* src = raw_tensor(host.data(), {64}, {1}, 64);
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(copy_phase1(dst, src, &ws, &ex) == 161002);
  api().aclDestroyTensor(dst);
  api().aclDestroyTensor(src);
  // pageable host memory in an asynchronous host-to-device copy
  CHECK(api().aclrtMemcpyAsync(d.data(), 256, host.data(), 256, acl::memcpy_host_to_device, ctx.stream) ==
        100000);
  CHECK(std::string(api().aclGetRecentErrMsg()).find("pageable host memory") != std::string::npos);
  // a host pointer as the destination of a "host to device" copy
  CHECK(api().aclrtMemcpy(host.data(), 256, host.data() + 8, 128, acl::memcpy_host_to_device) == 100000);
  // loom's policy never trips these: it falls back to a synchronous copy for pageable memory
  npu::copy_to_device(d.data(), host.data(), 256, ctx.stream);
  ctx.synchronize();
}

TEST_CASE("emulation check: NULL streams for aclnn, frees on the wrong device") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  dbuf<float> a(16, ctx.stream), y(16, ctx.stream);
  loom::kernels::ascend::tensor A(ctx, a.data(), acl::dt_float, {16}), Y(ctx, y.data(), acl::dt_float, {16});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  REQUIRE(api().aclnnInplaceCopyGetWorkspaceSize(Y, A, &ws, &ex) == 0);
  CHECK(api().aclnnInplaceCopy(nullptr, ws, ex, nullptr) == 161002);
  CHECK(std::string(api().aclGetRecentErrMsg()).find("NULL stream") != std::string::npos);
  CHECK(api().aclnnInplaceCopy(nullptr, ws, ex, ctx.stream) == 0);
  void* p = nullptr;
  {
    loom::device::device_guard g(*runtime(), 1);
    REQUIRE(api().aclrtMalloc(&p, 64, acl::malloc_huge_first) == 0);
  }
  CHECK(api().aclrtFree(p) == 100000);
  CHECK(std::string(api().aclGetRecentErrMsg()).find("belongs to device 1") != std::string::npos);
  {
    loom::device::device_guard g(*runtime(), 1);
    CHECK(api().aclrtFree(p) == 0);
  }
  ctx.synchronize();
}

TEST_CASE("ascend device: a buffer made without a stream is zero-filled before its constructor returns") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  void* reused = nullptr;
  {
    dbuf<float> dirty(3000, ctx.stream);
    npu::memset(dirty.data(), 0xFF, dirty.bytes(), ctx.stream);
    ctx.synchronize();
    reused = dirty.data();
  }
  dbuf<float> b(3000);  // the default (null) stream: the fill must not race with later streams
  CHECK(b.data() == reused);
  std::vector<float> host(3000, 1.0f);
  REQUIRE(api().aclrtMemcpy(host.data(), host.size() * 4, b.data(), b.bytes(), acl::memcpy_device_to_host) == 0);
  CHECK(host == std::vector<float>(3000, 0.0f));
}

TEST_CASE("ascend profiler: a failing aclprof call becomes device_error, the session is closed, and misuse is refused") {
  emulation_reset reset;
  loom::device::ascend_device dev(runtime(), 0);
  using log_fn = std::size_t(loomemu_prof_event*, std::size_t);
  emu<void()>("loomemu_profiler_clear")();
  const auto dir = std::filesystem::temp_directory_path() / ("loom_msprof_fail_" + std::to_string(::getpid()));
  {
    loom::device::ascend_profiler prof(runtime(), {.output_dir = dir});  // devices: the thread's NPU
    loomemu_inject_failure("aclprofStart", 500005, 0, 1);
    try {
      prof.start();
      FAIL("expected device_error");
    } catch (const loom::device_error& e) {
      CHECK(e.code() == 500005);
      CHECK(std::string(e.what()).find("aclprofStart failed with code 500005") != std::string::npos);
      CHECK(std::string(e.what()).find("injected failure of aclprofStart") != std::string::npos);
    }
    CHECK_FALSE(prof.running());
  }
  loomemu_prof_event log[8]{};
  REQUIRE(emu<log_fn>("loomemu_profiler_log")(log, 8) == 2);  // init, then finalize on the failure path
  CHECK(log[0].kind == LOOMEMU_PROF_INIT);
  CHECK(log[1].kind == LOOMEMU_PROF_FINALIZE);
  {
    // the session was closed: a new profiler opens one; its destructor closes a window left open
    loom::device::ascend_profiler prof(runtime(), {.output_dir = dir, .devices = {0}});
    prof.start();
    CHECK(prof.running());
  }
  REQUIRE(emu<log_fn>("loomemu_profiler_log")(log, 8) == 6);
  CHECK(log[4].kind == LOOMEMU_PROF_STOP);
  CHECK(log[5].kind == LOOMEMU_PROF_FINALIZE);
  // the emulation's documented-order checks
  const auto& a = api();
  const std::string path = dir.string();
  CHECK(a.aclprofInit(path.c_str(), path.size() + 1) != 0);  // length is not the path's
  REQUIRE(a.aclprofInit(path.c_str(), path.size()) == 0);
  CHECK(a.aclprofInit(path.c_str(), path.size()) != 0);  // a session is open already
  std::uint32_t dev0 = 0, dev_bad = 99;
  CHECK(a.aclprofCreateConfig(&dev_bad, 1, loom::device::acl::aicore_none, nullptr, 0) == nullptr);
  CHECK(a.aclprofCreateConfig(&dev0, 1, loom::device::acl::aicore_none,
                              reinterpret_cast<const loom::device::acl::aclprofAicoreEvents*>(&dev0), 0) == nullptr);
  auto* cfg = a.aclprofCreateConfig(&dev0, 1, loom::device::acl::aicore_none, nullptr, loom::device::acl::prof_task_time);
  REQUIRE(cfg != nullptr);
  CHECK(a.aclprofStop(cfg) != 0);  // not started
  REQUIRE(a.aclprofStart(cfg) == 0);
  CHECK(a.aclprofDestroyConfig(cfg) != 0);  // still collecting
  CHECK(a.aclprofFinalize() != 0);          // still collecting
  CHECK(a.aclprofStop(cfg) == 0);
  CHECK(a.aclprofDestroyConfig(cfg) == 0);
  CHECK(a.aclprofFinalize() == 0);
  std::filesystem::remove_all(dir);
}
