// Heap allocations inside the training step: none by loom after the first step.
//
// This program replaces malloc, calloc, realloc and the aligned allocators with counting wrappers
// around glibc's (__libc_malloc, ...); every operator new, Eigen temporary, std::vector, OpenMP
// runtime or oneDNN allocation of any thread goes through them. The counter is armed only around
// steps 2..5 of a trainer (step 1 grows the per-thread workspaces, creates the OpenMP threads and
// the oneDNN matmul primitives). Allocations made inside libdnnl (its primitive execute keeps a
// few small blocks per call, ~40 bytes each, outside loom's control) are counted apart, by the
// backtrace, and bounded per matmul call. Set LOOM_ALLOC_TRACE=1 to print a backtrace of each
// counted allocation. Own executable: the replacement is global.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/precision/loss_scaler.hpp>
#include <loom/train/trainer.hpp>

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
}

namespace {

std::atomic<bool> armed{false};
std::atomic<long> allocations{0};        // outside oneDNN
std::atomic<long> allocated_bytes{0};
std::atomic<long> onednn_allocations{0};  // inside libdnnl
thread_local bool tracing = false;        // backtrace() may allocate: do not count or trace that

/// Whether one of the first frames of this allocation's stack lies in libdnnl.
bool inside_onednn(void* const* frames, int depth) noexcept {
  for (int i = 2; i < depth && i < 8; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) && info.dli_fname && std::strstr(info.dli_fname, "libdnnl")) return true;
  }
  return false;
}

void count(std::size_t n) noexcept {
  if (!armed.load(std::memory_order_relaxed) || tracing) return;
  tracing = true;
  void* frames[24];
  const int depth = backtrace(frames, 24);
  if (inside_onednn(frames, depth)) {
    onednn_allocations.fetch_add(1, std::memory_order_relaxed);
  } else {
    allocations.fetch_add(1, std::memory_order_relaxed);
    allocated_bytes.fetch_add(long(n), std::memory_order_relaxed);
    static const bool trace = std::getenv("LOOM_ALLOC_TRACE") != nullptr;
    if (trace) {
      const char line[] = "---- counted allocation\n";
      (void)!write(2, line, sizeof line - 1);
      backtrace_symbols_fd(frames, depth, 2);
    }
  }
  tracing = false;
}

}  // namespace

extern "C" {
void* malloc(std::size_t n) {
  count(n);
  return __libc_malloc(n);
}
void* calloc(std::size_t k, std::size_t n) {
  count(k * n);
  return __libc_calloc(k, n);
}
void* realloc(void* p, std::size_t n) {
  count(n);
  return __libc_realloc(p, n);
}
void* memalign(std::size_t a, std::size_t n) {
  count(n);
  return __libc_memalign(a, n);
}
void* aligned_alloc(std::size_t a, std::size_t n) {
  count(n);
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, std::size_t a, std::size_t n) {
  count(n);
  void* p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}

namespace {

using namespace loom;

/// Allocations made by f() on any thread outside oneDNN (onednn_allocations: inside it).
template <class F>
long allocations_during(F&& f) {
  void* warm[2];
  backtrace(warm, 2);  // loads libgcc's unwinder now, not while counting
  allocations = 0;
  allocated_bytes = 0;
  onednn_allocations = 0;
  armed = true;
  f();
  armed = false;
  return allocations.load();
}

std::vector<std::int32_t> random_windows(std::size_t rows, std::size_t window, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> w(rows * window);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(std::uint64_t(vocab), seed, 3, i));
  return w;
}

/// Steps 2..5 of a trainer of model M (GPT-2 tiny by default) in precision P (micro-batch 3 of 13 tokens, 2 micro-batches
/// per step: odd sizes, gradient accumulation) and the allocations they made.
template <class P, class Scaler = precision::no_loss_scaler, class M = models::tiny>
long allocations_in_steps_2_to_5() {
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {3e-3, 3e-4, 2, 20};
  cfg.micro_batch = 3;
  cfg.grad_accum = 2;
  train::trainer<M, P, 3, 13, parallel::local_group, kernels::fused, Scaler> tr(ctx, cfg);
  const auto windows = random_windows(6, 14, M::vocab, 7);
  const double first = tr.step(ctx, windows).loss;
  double last = 0;
  const std::size_t calls0 = ctx.gemm_cache ? ctx.gemm_cache->executions() : 0;
  const long n = allocations_during([&] {
    for (int s = 2; s <= 5; ++s) last = tr.step(ctx, windows).loss;
  });
  const long gemm_calls = long((ctx.gemm_cache ? ctx.gemm_cache->executions() : 0) - calls0);
  CHECK(last < first);  // the steps ran and learned
  MESSAGE("steps 2..5: ", n, " allocations by loom (", allocated_bytes.load(), " bytes); ", onednn_allocations.load(),
          " inside oneDNN over ", gemm_calls, " matmul primitive calls");
  // oneDNN's execute: a few small blocks per call (measured 6-7 with oneDNN 2.6), none elsewhere
  CHECK(onednn_allocations.load() <= 8 * gemm_calls);
  return n;
}

}  // namespace

TEST_CASE("alloc: the counter sees allocations (else the tests below could not fail)") {
  const long n = allocations_during([] {
    std::vector<int> v(1000, 1);
    void* p = std::malloc(64);
    CHECK(v[999] == 1);
    std::free(p);
  });
  CHECK(n == 2);
  CHECK(onednn_allocations.load() == 0);
}

TEST_CASE("alloc: no heap allocation in steps 2..5, fp32") {
  CHECK(allocations_in_steps_2_to_5<policy<device::cpu, precision::fp32>>() == 0);
}

TEST_CASE("alloc: no heap allocation in steps 2..5, bf16") {
  CHECK(allocations_in_steps_2_to_5<policy<device::cpu, precision::bf16>>() == 0);
}

TEST_CASE("alloc: no heap allocation in steps 2..5, Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention), bf16") {
  CHECK(allocations_in_steps_2_to_5<policy<device::cpu, precision::bf16>, precision::no_loss_scaler, models::llama_tiny>() == 0);
}

TEST_CASE("alloc: no heap allocation in steps 2..5, fp16 with the dynamic loss scaler") {
  CHECK(allocations_in_steps_2_to_5<policy<device::cpu, precision::fp16>, precision::dynamic_loss_scaler>() == 0);
}
