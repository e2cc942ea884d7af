#pragma once
/// \file context<D>: what every kernel call receives — the stream it is ordered on.
///
/// Passed explicitly down the call tree, never looked up from a global (STYLE §3.9). Later
/// issues add the workspace pool and the communication groups; a context is cheap to copy.
/// `hook` (null = off) observes every kernel call made with this context (core/kernel_hook.hpp;
/// the timeline profiler sets it for the steps it records).
#include <loom/core/kernel_hook.hpp>
#include <loom/core/device.hpp>

namespace loom {

template <device::device_policy D>
struct context {
  using device = D;
  typename D::stream_type stream{};
  /// Observer of the kernels called with this context; null = none (one branch per kernel).
  kernel_hook* hook = nullptr;
  /// Blocks until everything queued on this context's stream has finished.
  void synchronize() const { D::synchronize(stream); }
};

}  // namespace loom
