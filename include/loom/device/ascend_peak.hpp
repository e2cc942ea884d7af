#pragma once
/// \file Peak matrix throughput of Ascend NPUs by SoC name, for MFU (train::metrics' peak_flops).
///
///   const auto peak = loom::device::ascend_peak_of(runtime);          // aclrtGetSocName
///   if (peak) cfg.peak_flops = peak->flops("bf16") * n_devices;       // NaN MFU when unknown
///
/// The SoC name comes from aclrtGetSocName (reference §1.3: optional symbol, acl_base.h; its exact
/// strings are unconfirmed — llama.cpp derives "Ascend<name>" from npu-smi, e.g. Ascend910B3).
/// Names are matched by the longest table prefix, so "Ascend910B3" finds the Ascend910B row.
///
/// Honesty: no value below was read from a primary Huawei datasheet by this project. Each row says
/// where its number comes from and is marked unconfirmed (confirmed = false), as the reference
/// marks what it could not check; MFU computed from an unconfirmed peak is labelled so. A user who
/// knows the exact part's figure should pass it instead (peak_override below). Per-variant figures
/// for 910B1..B4 were not found in any source we could cite, so they share one row.
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <loom/device/ascend_runtime.hpp>

namespace loom::device {

/// Dense (no sparsity) peak of the cube unit for one SoC family, per NPU.
struct ascend_peak {
  std::string_view soc_prefix;   ///< table key, matched as a prefix of aclrtGetSocName()
  std::string_view product;      ///< e.g. "Ascend 910B (Atlas 800T A2 training server)"
  double fp16_tflops = 0;        ///< 0 = not known / not supported
  double bf16_tflops = 0;
  double fp32_tflops = 0;
  bool confirmed = false;        ///< read from a primary Huawei source and checked on hardware
  std::string_view source;       ///< where the numbers come from

  /// FLOP/s (1e12 * TFLOPS) for a precision name ("fp16", "bf16", "fp32", or a policy name
  /// starting with one of them, e.g. "fp32_ascend_matmul"); NaN when the table has no figure,
  /// so an MFU computed from it is NaN rather than wrong.
  double flops(std::string_view precision) const noexcept {
    double t = 0;
    if (precision.starts_with("bf16")) t = bf16_tflops;
    else if (precision.starts_with("fp16")) t = fp16_tflops;
    else if (precision.starts_with("fp32")) t = fp32_tflops;
    return t > 0 ? t * 1e12 : std::numeric_limits<double>::quiet_NaN();
  }
};

/// The table (longest prefix wins).
inline constexpr ascend_peak ascend_peak_table[] = {
    {"Ascend910B", "Ascend 910B family (910B1..B4; Atlas 800T A2 / 900 A2 training parts)", 280, 280, 0, false,
     "unconfirmed: 280 TFLOPS FP16 is the figure a cloud provider's Ascend 910B page gives (ai.gitee.com/docs/compute/"
     "clusters_gpu/ascend_gpu); press articles quote 280-320 for '910B' without naming the variant; bf16 assumed equal "
     "to fp16 (same cube rate claimed by the same pages); no primary Huawei datasheet read, per-variant values unknown"},
    {"Ascend910", "Ascend 910 (first generation, 2019)", 256, 0, 0, false,
     "unconfirmed: 256 TFLOPS FP16 is Huawei's 2019 launch figure as reported by secondary sources (primary not "
     "retrieved); first-generation parts have no bf16 (reference §3.3: no bf16 collectives on first-gen training)"},
};

/// The row for a SoC name (longest matching prefix), or nullopt when the table does not know it.
inline std::optional<ascend_peak> ascend_peak_for(std::string_view soc_name) noexcept {
  const ascend_peak* best = nullptr;
  for (const auto& row : ascend_peak_table)
    if (soc_name.starts_with(row.soc_prefix) && (!best || row.soc_prefix.size() > best->soc_prefix.size()))
      best = &row;
  if (!best) return std::nullopt;
  return *best;
}

/// The row for the SoC of the calling thread's current NPU (aclrtGetSocName). nullopt when the
/// runtime lacks aclrtGetSocName (older CANN), returns NULL, or the SoC is not in the table.
inline std::optional<ascend_peak> ascend_peak_of(const ascend_runtime& rt) {
  const auto& api = rt.api();
  if (!api.aclrtGetSocName) return std::nullopt;
  const char* name = api.aclrtGetSocName();
  if (!name) return std::nullopt;
  return ascend_peak_for(name);
}

/// A user-given peak (e.g. from the part's datasheet) for all precisions: marked confirmed.
inline ascend_peak peak_override(double tflops, std::string_view source) noexcept {
  return {"", "user-given", tflops, tflops, tflops, true, source};
}

}  // namespace loom::device
