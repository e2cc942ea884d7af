#pragma once
/// \file ascend_profiler: starts and stops the CANN profiler (the aclprof C API of
/// libmsprofiler.so) for a window of steps, so msprof / MindStudio Insight see exactly the steps
/// loom's own timeline (io::trace_recorder, --profile-steps) records.
///
///   loom::device::ascend_profiler prof(runtime, {.output_dir = "out/msprof", .devices = {0}});
///   loom::io::trace_recorder trace({.window = loom::io::step_window::parse("50:60"),
///                                   .on_start = [&] { prof.start(); },
///                                   .on_stop = [&] { prof.stop(); }});
///
/// Source: loom's API reference §5.1 (acl/acl_prof.h, CANN 8.1.RC1 [H]) for the signatures and
/// the documented order aclprofInit -> aclprofCreateConfig -> aclprofStart -> workload ->
/// aclprofStop -> aclprofDestroyConfig -> aclprofFinalize; §4.2 for the library. The whole
/// sequence runs inside the window: start() opens the session (Init + CreateConfig + Start) and
/// stop() closes it (Stop + DestroyConfig + Finalize), so nothing of the profiler stays alive
/// outside the window (the practice guide's warning: a profiler left on cost several GB of NPU
/// memory). Whether aclprofInit may be called again after aclprofFinalize in one process is not
/// in the reference, so a second start() after stop() is refused (one window per profiler).
///
/// Not run on hardware: checked only against loom's host emulation, which validates the call
/// order and arguments and logs each call (tests/ascend/test_gpt.cpp).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/device/ascend_runtime.hpp>
#include <loom/device/detail/acl_check.hpp>

namespace loom::device {

/// What the CANN profiler collects (aclprofCreateConfig's arguments, reference §5.1).
struct ascend_profiler_options {
  /// aclprofInit's profilerResultPath: msprof data lands in <dir>/PROF_*/ (created if missing).
  std::filesystem::path output_dir = "out/msprof";
  /// NPU ordinals to profile; empty = the device the calling thread is bound to (aclrtGetDevice).
  std::vector<std::uint32_t> devices{};
  /// dataTypeConfig: OR of acl::prof_* switches. Default: ACL API and task timeline, HCCL and
  /// training trace — what msprof's default timeline view shows (--ascendcl, --task-time).
  std::uint64_t data_types = acl::prof_acl_api | acl::prof_task_time | acl::prof_hccl_trace | acl::prof_training_trace;
  /// AI-core metric set; acl::aicore_none = none (cheapest).
  acl::aclprofAicoreMetrics aicore_metrics = acl::aicore_none;
};

/// One profiling window of the CANN profiler. Not copyable; the runtime must outlive it.
/// Thread: call start()/stop() from a thread bound to an NPU (ascend_device / device_guard).
/// Errors: start()/stop() throw loom::device_error (code, aclGetRecentErrMsg, call site) when an
/// aclprof call fails, and when the loaded toolkit has no libmsprofiler.so (naming it and the
/// fix); loom::input_error when the output directory cannot be created or start() is called a
/// second time. The destructor stops an open window and never throws.
class ascend_profiler {
 public:
  ascend_profiler(std::shared_ptr<const ascend_runtime> runtime, ascend_profiler_options options = {})
      : rt_(std::move(runtime)), opt_(std::move(options)) {
    if (!rt_) throw input_error("ascend_profiler: no runtime; pass the ascend_runtime the devices were created with");
  }
  ascend_profiler(const ascend_profiler&) = delete;
  ascend_profiler& operator=(const ascend_profiler&) = delete;
  ~ascend_profiler() {
    if (!running_) return;
    const auto& api = rt_->api();
    detail::acl_warn(api, api.aclprofStop(config_), "aclprofStop");
    detail::acl_warn(api, api.aclprofDestroyConfig(config_), "aclprofDestroyConfig");
    detail::acl_warn(api, api.aclprofFinalize(), "aclprofFinalize");
  }

  /// Opens the window: aclprofInit(dir), aclprofCreateConfig(devices, metrics, NULL, data_types),
  /// aclprofStart. No-op while running.
  void start() {
    if (running_) return;
    if (used_)
      throw input_error("ascend_profiler: the CANN profiler window was already closed; one profiler records one "
                        "window (create another for a second window)");
    const auto& api = rt_->api();
    if (!rt_->has_profiler())
      throw device_error(detail::acl_status::aclnn_find_kernel_error, "aclprofInit",
                         "the CANN profiler library libmsprofiler.so was not found next to libascendcl.so (or lacks "
                         "aclprofInit...aclprofFinalize): install the CANN toolkit's profiler component, or profile "
                         "without it (loom's own trace needs nothing)");
    std::error_code ec;
    std::filesystem::create_directories(opt_.output_dir, ec);
    if (ec)
      throw input_error("ascend_profiler: cannot create the profiler output directory '" + opt_.output_dir.string() +
                        "': " + ec.message() + "; choose a writable directory");
    std::vector<std::uint32_t> devices = opt_.devices;
    if (devices.empty()) {
      std::int32_t d = 0;
      detail::acl_check(api, api.aclrtGetDevice(&d), "aclrtGetDevice");
      devices.push_back(std::uint32_t(d));
    }
    const std::string dir = opt_.output_dir.string();
    used_ = true;
    detail::acl_check(api, api.aclprofInit(dir.c_str(), dir.size()), "aclprofInit");
    config_ = api.aclprofCreateConfig(devices.data(), std::uint32_t(devices.size()), opt_.aicore_metrics, nullptr,
                                      opt_.data_types);
    if (!config_) {
      const auto e = detail::acl_error(api, 500005 /* ACL_ERROR_PROFILING_FAILURE */, "aclprofCreateConfig",
                                       loom::source_location::current());
      detail::acl_warn(api, api.aclprofFinalize(), "aclprofFinalize");
      throw e;
    }
    if (const int rc = api.aclprofStart(config_); rc != acl::success) {
      const auto e = detail::acl_error(api, rc, "aclprofStart", loom::source_location::current());
      detail::acl_warn(api, api.aclprofDestroyConfig(config_), "aclprofDestroyConfig");
      detail::acl_warn(api, api.aclprofFinalize(), "aclprofFinalize");
      throw e;
    }
    running_ = true;
  }

  /// Closes the window: aclprofStop, aclprofDestroyConfig, aclprofFinalize (flushes the data).
  /// No-op when not running.
  void stop() {
    if (!running_) return;
    running_ = false;
    const auto& api = rt_->api();
    const int stop_rc = api.aclprofStop(config_);
    const int destroy_rc = api.aclprofDestroyConfig(config_);
    const int finalize_rc = api.aclprofFinalize();
    detail::acl_check(api, stop_rc, "aclprofStop");
    detail::acl_check(api, destroy_rc, "aclprofDestroyConfig");
    detail::acl_check(api, finalize_rc, "aclprofFinalize");
  }

  /// True between start() and stop().
  bool running() const noexcept { return running_; }
  const ascend_profiler_options& options() const noexcept { return opt_; }

 private:
  std::shared_ptr<const ascend_runtime> rt_;
  ascend_profiler_options opt_;
  acl::aclprofConfig* config_ = nullptr;
  bool running_ = false, used_ = false;
};

}  // namespace loom::device
