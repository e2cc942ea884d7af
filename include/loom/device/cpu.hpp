#pragma once
/// \file loom::device::cpu — host execution; math through Eigen and OpenMP.
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

#include <loom/core/context.hpp>
#include <loom/core/device.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace loom::device {

/// The CPU as a device: memory is host memory, every operation completes before it returns
/// (the stream is a placeholder), so synchronize() is a no-op. Allocations are 64-byte aligned
/// (one cache line, one AVX-512 register). allocate throws std::bad_alloc on failure.
struct cpu {
  using stream_type = std::nullptr_t;
  static constexpr std::string_view name = "cpu";
  static constexpr std::size_t alignment = 64;  // bytes

  static void* allocate(std::size_t bytes) {
    return ::operator new(bytes == 0 ? alignment : bytes, std::align_val_t{alignment});
  }
  static void deallocate(void* p) noexcept {
    if (p) ::operator delete(p, std::align_val_t{alignment});
  }
  static void* allocate_host(std::size_t bytes) { return allocate(bytes); }
  static void deallocate_host(void* p) noexcept { deallocate(p); }
  static void copy(void* dst, const void* src, std::size_t bytes, stream_type) {
    if (bytes) std::memmove(dst, src, bytes);
  }
  static void copy_to_device(void* dst, const void* src, std::size_t bytes, stream_type s) {
    copy(dst, src, bytes, s);
  }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes, stream_type s) {
    copy(dst, src, bytes, s);
  }
  static void memset(void* p, int byte, std::size_t bytes, stream_type) {
    if (bytes) std::memset(p, byte, bytes);
  }
  static void synchronize(stream_type) noexcept {}
};
static_assert(device_policy<cpu>);

template <>
inline constexpr bool host_accessible_v<cpu> = true;

/// Keeps large freed blocks in the process heap instead of returning them to the OS.
///
/// Eigen's GEMM allocates its packing buffers on every call. glibc serves blocks above its
/// mmap threshold with fresh mmap'ed pages and unmaps them on free, so every GEMM of a
/// training step pays page faults and kernel zeroing: measured 3x slower steps on the
/// vocab-8192 benchmark config (bench/bench_step). Raising the mmap threshold to 256 MiB and the
/// trim threshold to 1 GiB makes those buffers reused. Process-wide (glibc's mallopt), so
/// loom never calls it behind your back: programs call it once at the start of main, as
/// train_gpt and the benchmarks do. Cost: freed memory stays mapped (peak RSS +~7 %).
/// Returns false where it has no effect (not glibc).
inline bool configure_host_malloc_for_gemm() noexcept {
#if defined(__GLIBC__)
  return mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#else
  return false;
#endif
}

}  // namespace loom::device

namespace loom::kernels::cpu::detail {
class onednn_matmul_cache;  // kernels/cpu/detail/gemm_onednn.hpp
}  // namespace loom::kernels::cpu::detail

namespace loom {

/// What every CPU kernel call receives: the (placeholder) stream, the kernel observer, and the
/// oneDNN matmul primitives of this context's linear layers, created once per shape by the
/// first GEMM that needs one and reused by every later step (kernels::cpu::matmul_forward), so
/// a step allocates nothing. A copy of a context starts with its own empty primitive cache: a
/// cache is used by one thread at a time, and a context may be copied to another thread.
template <>
struct context<device::cpu> {
  using device = loom::device::cpu;
  device::stream_type stream{};
  /// Observer of the kernels called with this context; null = none (one branch per kernel).
  kernel_hook* hook = nullptr;
  /// The linear layers' oneDNN matmul primitives; null until the first GEMM that uses one.
  std::shared_ptr<kernels::cpu::detail::onednn_matmul_cache> gemm_cache;

  context() = default;
  context(const context& other) : stream(other.stream), hook(other.hook) {}
  context& operator=(const context& other) {
    stream = other.stream;
    hook = other.hook;
    gemm_cache.reset();
    return *this;
  }
  context(context&&) noexcept = default;
  context& operator=(context&&) noexcept = default;
  ~context() = default;
  /// Every CPU kernel has finished when it returns: nothing to wait for.
  void synchronize() const noexcept {}
};

}  // namespace loom
