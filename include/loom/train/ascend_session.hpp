#pragma once
/// \file The device::ascend side of train::trainer_session (train/session_instance.hpp): each
/// rank drives one NPU (device::ascend_device on its own thread or process) and its trainer's
/// groups are split from an HCCL communicator bootstrapped over the session's world (the root
/// info travels over comm::threads or comm::mpi, as torch_npu's and MindSpore's MPI launches
/// do). Checkpoints, traces and broadcast_from_lead stay on the host world. Included by the
/// generated translation units of device "ascend" instances (cmake/LoomSessions.cmake).
///
///   train::session_args a;
///   a.ascend = device::ascend_runtime::load();  // CANN (or the emulation) from ASCEND_HOME_PATH
///   auto s = train::make_session<models::quickstart, policy<device::ascend, precision::bf16>, 16, 128,
///                                kernels::fused>(a, world);
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <loom/device/ascend.hpp>
#include <loom/device/ascend_profiler.hpp>
#include <loom/device/ascend_runtime.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/train/ascend_phase_timer.hpp>
#include <loom/train/session_instance.hpp>

namespace loom::train {

/// One rank's NPU: device::ascend_device on NPU a.ordinal (or NPU world_rank when a.ordinal < 0;
/// a rank beyond the visible NPUs is refused, as HCCL runs one rank per NPU) of runtime a.ascend; with a.device_timing, the step's phases in
/// device time (train::ascend_phase_timer on the compute stream, read one step late so that
/// timing adds no host wait); with a.deterministic, deterministic kernels; the CANN profiler on demand.
/// Throws loom::input_error without a runtime or an NPU for the rank, loom::device_error when the NPU cannot be opened
/// (ACL's code and message).
template <>
class session_device<device::ascend> {
 public:
  session_device(const session_args& a, int world_rank)
      : rt_(runtime_of(a)), dev_(rt_, ordinal_of(a, world_rank)) {
    if (a.deterministic) dev_.set_deterministic(true);
    if (a.device_timing)
      for (auto& t : timers_) t.emplace(*rt_, dev_.context().stream);
  }
  context<device::ascend>& ctx() noexcept { return dev_.context(); }
  /// An HCCL communicator over the same ranks as `world` (collective over it; comm::hccl::create:
  /// rank 0's root info broadcast over `world`), owned here, type-erased for the trainer.
  parallel::any_communicator& collectives(parallel::any_communicator& world) {
    auto hc = comm::hccl::create(world, dev_.context());
    hccl_.emplace(std::make_unique<parallel::detail::any_comm_model<comm::hccl>>(std::move(hc)));
    return *hccl_;
  }
  void add_memory(session_memory& m) const {
    const auto s = dev_.memory().stats();
    m.device_allocated = s.allocated;
    m.device_peak = s.peak_allocated;
    m.device_reserved = s.reserved;
  }
  // Two timers take turns, so the step's events are read one step late, when the next step's
  // host wait (the gradient norm's readback) has drained the stream past them: the timer never waits itself.
  void begin_step() {
    if (timers_[cur_]) timers_[cur_]->begin_step();
  }
  void end_step() {
    if (!timers_[cur_]) return;
    timers_[cur_]->finish_step();
    cur_ ^= 1;
    if (auto b = timers_[cur_]->try_read()) last_ = *b;  // the previous step's (none before it ran)
  }
  void on_phase(phase p, bool begin) {
    if (timers_[cur_]) begin ? timers_[cur_]->enter(p) : timers_[cur_]->leave();
  }
  /// The previous step's device-time breakdown (nullopt until two steps have run).
  std::optional<step_breakdown> breakdown() const { return last_; }
  /// The CANN profiler on this rank's NPU, writing under `dir` (device::ascend_profiler).
  bool start_profiler(const std::filesystem::path& dir) {
    if (prof_) throw input_error("the CANN profiler runs one window per session; it was started already");
    prof_.emplace(rt_, device::ascend_profiler_options{.output_dir = dir, .devices = {std::uint32_t(dev_.ordinal())}});
    prof_->start();
    return true;
  }
  void stop_profiler() {
    if (prof_ && prof_->running()) prof_->stop();
  }

 private:
  static std::shared_ptr<const device::ascend_runtime> runtime_of(const session_args& a) {
    if (!a.ascend)
      throw input_error("an ascend session needs the CANN runtime: set session_args::ascend = "
                        "loom::device::ascend_runtime::load()");
    return a.ascend;
  }
  static int ordinal_of(const session_args& a, int world_rank) {
    if (a.ordinal >= 0) return a.ordinal;
    const int n = device::ascend_device::count(*a.ascend);
    if (n <= 0) throw input_error("no NPU is visible (aclrtGetDeviceCount = 0); check ASCEND_RT_VISIBLE_DEVICES");
    if (world_rank >= n)  // HCCL runs one rank per NPU: two ranks of one device cannot join a communicator
      throw input_error("rank " + std::to_string(world_rank) + " has no NPU of its own: " + std::to_string(n) +
                        " NPU" + (n == 1 ? " is" : "s are") + " visible and HCCL needs one per rank; run at most " +
                        std::to_string(n) + " ranks per machine (ASCEND_RT_VISIBLE_DEVICES lists the visible ones), "
                        "or set session_args::ordinal");
    return world_rank;
  }

  std::shared_ptr<const device::ascend_runtime> rt_;
  device::ascend_device dev_;
  std::optional<parallel::any_communicator> hccl_;  ///< destroyed before the device
  std::array<std::optional<ascend_phase_timer>, 2> timers_;
  int cur_ = 0;
  std::optional<step_breakdown> last_;
  std::optional<device::ascend_profiler> prof_;
};

}  // namespace loom::train
