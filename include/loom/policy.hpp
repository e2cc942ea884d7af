#pragma once
/// \file loom::policy<Device, Precision, Layout>: the three compile-time choices, bundled.
#include <loom/core/device.hpp>
#include <loom/core/layout.hpp>
#include <loom/precision/policy.hpp>

namespace loom {

/// Where it runs, in what precision, how it is split. Example:
///   using P = loom::policy<loom::device::cpu, loom::precision::fp32, loom::layout<1, 1>>;
template <device::device_policy Device, precision::precision_policy Precision,
          parallel::layout_policy Layout = parallel::ddp>
struct policy {
  using device = Device;
  using precision = Precision;
  using layout = Layout;
};

}  // namespace loom
