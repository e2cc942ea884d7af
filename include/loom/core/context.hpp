#pragma once
/// \file context<D>: what every kernel call receives — the stream it is ordered on.
///
/// Passed explicitly down the call tree, never looked up from a global (STYLE §3.9). Later
/// issues add the workspace pool and the communication groups; a context is cheap to copy.
#include <loom/device/policy.hpp>

namespace loom {

template <device::device_policy D>
struct context {
  using device = D;
  typename D::stream_type stream{};
  /// Blocks until everything queued on this context's stream has finished.
  void synchronize() const { D::synchronize(stream); }
};

}  // namespace loom
