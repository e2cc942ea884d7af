#pragma once
/// \file The device_policy concept: what a place to run must provide.
///
/// A device policy is a stateless type with static members (Kokkos memory/execution spaces,
/// Eigen's DefaultDevice). It is designed for an *asynchronous* device with its own memory:
/// every copy and memset is ordered on a stream and completes only at synchronize(). The CPU
/// policy implements the same interface synchronously, so code written against the concept is
/// correct on both.
#include <concepts>
#include <cstddef>
#include <string_view>

namespace loom::device {

/// Requirements on a device policy D:
///   D::name                          short lower-case name ("cpu", "ascend")
///   D::stream_type                   an ordered queue of work (nullptr_t on the CPU)
///   D::allocate(bytes) -> void*      device memory, aligned to D::alignment; throws on failure
///   D::deallocate(p) noexcept        frees what allocate returned; never throws
///   D::copy(dst, src, bytes, s)      device<->device copy ordered on s
///   D::copy_to_device / copy_to_host host<->device copies ordered on s
///   D::memset(p, byte, bytes, s)     fill ordered on s
///   D::synchronize(s)                waits until all work on s has finished
///   D::allocate_host / deallocate_host  pinned (page-locked) host memory for fast transfers
template <class D>
concept device_policy = requires(std::size_t bytes, void* p, const void* q, int byte,
                                 typename D::stream_type s) {
  { D::name } -> std::convertible_to<std::string_view>;
  { D::alignment } -> std::convertible_to<std::size_t>;
  { D::allocate(bytes) } -> std::same_as<void*>;
  { D::deallocate(p) } noexcept;
  { D::allocate_host(bytes) } -> std::same_as<void*>;
  { D::deallocate_host(p) } noexcept;
  { D::copy(p, q, bytes, s) };
  { D::copy_to_device(p, q, bytes, s) };
  { D::copy_to_host(p, q, bytes, s) };
  { D::memset(p, byte, bytes, s) };
  { D::synchronize(s) };
};

/// A device's host allocator chosen at run time (a program compiled once for every device, such
/// as train_gpt, hands it to data::loader so the batches land in memory the device copies from
/// asynchronously). Empty: the code's own default.
struct host_allocator {
  void* (*allocate)(std::size_t bytes) = nullptr;   ///< D::allocate_host
  void (*deallocate)(void* p) noexcept = nullptr;   ///< D::deallocate_host
  explicit operator bool() const noexcept { return allocate && deallocate; }
  /// D's pinned host memory.
  template <class D>
  static host_allocator of() noexcept {
    return {&D::allocate_host, &D::deallocate_host};
  }
};

/// True for devices whose memory the host can dereference directly (the CPU).
template <class D>
inline constexpr bool host_accessible_v = false;

}  // namespace loom::device
