#pragma once
/// \file ascend_phase_timer: the step breakdown in *device* time on an Ascend stream.
///
/// train::step_timer measures host time; on Ascend a launch returns before the kernel runs, so a
/// host phase measures enqueue time and the device time lands in whichever phase synchronises
/// next (docs/observability.md). This timer records an event on the compute stream at every
/// phase transition instead and, at the end of the step, charges the device time between
/// consecutive events to the phase that was open when the first of them was recorded — the
/// CUDA-event method, with the documented ACL sequence (reference §1.7, §6 "Timing"):
/// device::ascend_event (aclrtCreateEventExWithFlag(ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC) where the
/// runtime has it) -> aclrtRecordEvent on the stream -> aclrtSynchronizeEvent on the last -> aclrtEventElapsedTime between neighbours.
///
///   train::ascend_phase_timer dt(dev.runtime(), ctx.stream);
///   trainer.on_phase = [&](train::phase p, bool begin) { begin ? dt.enter(p) : dt.leave(); };
///   dt.begin_step();  trainer.step(ctx, windows);  train::step_breakdown b = dt.end_step();
///
/// Meaning: b[p] is the time the device spent between the transitions into and out of p —
/// its kernels, plus any idle gap while the device waited for the host to enqueue them; b.total
/// is the device time from begin_step's event to end_step's (sum of the phases exactly). Work on
/// other streams (HCCL on a communication stream) is not seen, only this stream's waits on it.
/// Cost: one aclrtRecordEvent per transition and one aclrtSynchronizeEvent per step (end_step
/// blocks until the stream reaches its event; finish_step + try_read never block); events are created once and reused (one per
/// transition of the longest step so far). Timestamp resolution and the cost of TIME_LINE
/// events on hardware are not known (unconfirmed); tested only against the host emulation.
/// Thread: the thread that issues the step's work (bound to the NPU).
/// Errors: loom::device_error from a failing ACL call (code, aclGetRecentErrMsg, call site).
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <loom/device/ascend.hpp>
#include <loom/train/metrics.hpp>

namespace loom::train {

class ascend_phase_timer {
 public:
  /// Events of `runtime`, recorded on `stream` (normally context<ascend>::stream).
  ascend_phase_timer(const device::ascend_runtime& runtime, device::acl::aclrtStream stream)
      : rt_(&runtime), stream_(stream) {}

  /// Starts a step: records the first event; everything until the first enter() is `other`.
  void begin_step() {
    marks_.clear();
    depth_ = 0;
    stack_[0] = phase::other;
    mark();
  }
  /// Enters phase p (records an event; the interval before it goes to the enclosing phase).
  void enter(phase p) {
    mark();
    if (depth_ + 1 < max_depth) stack_[++depth_] = p;
    else ++overflow_;
    marks_.back() = stack_[depth_];
  }
  /// Leaves the innermost phase (records an event; the interval before it goes to that phase).
  void leave() {
    mark();
    if (overflow_) --overflow_;
    else if (depth_ > 0) --depth_;
    marks_.back() = stack_[depth_];
  }
  /// Ends the step: records the last event, waits for it (aclrtSynchronizeEvent) and returns the
  /// device-time breakdown in seconds; sum(seconds) == total.
  step_breakdown end_step() {
    mark();
    events_[marks_.size() - 1]->synchronize();
    return breakdown();
  }
  /// Ends the step without waiting: records the last event. try_read() gives the breakdown once
  /// the stream has passed it — e.g. after the next step's first host wait, so a caller that
  /// alternates two timers reads each step one step late and never waits for the timer.
  void finish_step() { mark(); }
  /// The finished step's breakdown when its last event has completed (aclrtQueryEventStatus: no
  /// wait), else nullopt.
  std::optional<step_breakdown> try_read() const {
    if (marks_.empty() || !events_[marks_.size() - 1]->query()) return std::nullopt;
    return breakdown();
  }

 private:
  static constexpr int max_depth = 16;
  step_breakdown breakdown() const {
    step_breakdown b{};
    for (std::size_t i = 1; i < marks_.size(); ++i) {
      const double s = 1e-3 * double(device::ascend_event::elapsed_ms(*events_[i - 1], *events_[i]));
      b.seconds[static_cast<std::size_t>(marks_[i - 1])] += s;
      b.total += s;
    }
    return b;
  }
  /// Records event #marks_.size() on the stream (creating it the first time) and appends the
  /// open phase; enter()/leave() then replace it by the phase open after their change.
  void mark() {
    if (events_.size() <= marks_.size()) events_.push_back(std::make_unique<device::ascend_event>(*rt_));
    events_[marks_.size()]->record(stream_);
    marks_.push_back(stack_[depth_]);
  }
  const device::ascend_runtime* rt_;
  device::acl::aclrtStream stream_;
  std::vector<std::unique_ptr<device::ascend_event>> events_;
  std::vector<phase> marks_;  // marks_[i]: the phase open right after event i was recorded
  std::array<phase, max_depth> stack_{phase::other};
  int depth_ = 0, overflow_ = 0;
};

}  // namespace loom::train
