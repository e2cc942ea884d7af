#pragma once
// train_gpt --profile-steps A:B: one rank's timeline profiler, used by the run loop
// (train_gpt/run.cpp) on every layout. Not a library header.
//
// Every rank records its own track (pid = world rank, process_name e.g. "rank 3 (tp 1, dp 1,
// pp 0)"): the step and its phases (recorded by the caller through recorder()), every kernel
// (context::hook) and every collective and send/recv of the world and the groups split from it
// (set_observer on the world before the trainer splits it). When the window closes, all ranks
// hand their events to rank 0 over the world communicator (io::gather_trace), which writes ONE
// trace.json into --log-dir ("out" when --log-dir is ''): no per-rank files, also across hosts
// under mpirun. Without --profile-steps nothing is attached (context::hook and the observers stay
// null: one branch per kernel and per collective). On an NPU the same window also runs the CANN
// profiler (aclprof*: msprof data under <log-dir>/cann_profile) on the ranks that own a process
// (every MPI rank; rank 0 of --ranks threads: the profiler is per process).
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>

#include <loom/core/context.hpp>
#include <loom/io/trace.hpp>
#include <loom/train/session.hpp>

#include "options.hpp"

namespace train_gpt_cli {

/// One rank's --profile-steps recorder (see the file comment): attach() before the trainer is
/// built, record phases through recorder(), begin_step() every step, finish() after the loop.
/// Writes ONE trace.json (rank 0, after io::gather_trace over the world); every member is a no-op
/// without --profile-steps. Throws loom::input_error for a malformed window (step_window::parse).
class rank_profile {
 public:
  /// rank: the world rank (the trace's pid); process_name: the track's label.
  rank_profile(const options& o, int rank, std::string process_name)
      : trace_({.window = loom::io::step_window::parse(o.profile_steps), .pid = rank,
                .process_name = std::move(process_name), .on_start = [this] { start_device(); },
                .on_stop = [this] { stop_device(); }}),
        observer_(trace_),
        file_(std::filesystem::path(o.log_dir.empty() ? "out" : o.log_dir) / "trace.json"),
        device_dir_(file_.parent_path() / "cann_profile"),
        rank_(rank) {}
  rank_profile(const rank_profile&) = delete;  // the recorder's callbacks point here
  rank_profile& operator=(const rank_profile&) = delete;

  bool enabled() const noexcept { return !trace_.options().window.empty(); }

  /// The kernel hook and communication observer to build the session with
  /// (train::session_args::hook, observer): null without --profile-steps.
  loom::kernel_hook* hook() noexcept { return enabled() ? &observer_ : nullptr; }
  loom::parallel::comm_observer* observer() noexcept { return enabled() ? &observer_ : nullptr; }

  /// Once the session knows this rank: its world rank (the trace's pid), track label, and
  /// whether it runs the device's own profiler in the window (one rank per process).
  void set_rank(int rank, std::string process_name, bool device_profiler) {
    rank_ = rank;
    device_profiler_ = device_profiler;
    trace_.set_process(rank, std::move(process_name));
    if (enabled()) trace_.name_this_thread("trainer");
  }

  /// The recorder, for the step's phase zones and the data-loader wait.
  loom::io::trace_recorder& recorder() noexcept { return trace_; }

  /// At the start of every step, on every rank. When the window has just closed, collects the
  /// ranks' traces into trace.json (collective) and returns a line for the console, else "".
  std::string begin_step(long step, loom::train::session& s) {
    if (!enabled()) return {};
    session_ = &s;  // for the device profiler, started by the recorder
    trace_.begin_step(step);
    return trace_.stats().finished && !written_ ? collect(s) : std::string();
  }

  /// After the training loop, on every rank: closes a window the run ended inside and collects.
  std::string finish(loom::train::session& s) {
    if (!enabled()) return {};
    session_ = &s;
    trace_.stop();
    return trace_.stats().finished && !written_ ? collect(s) : std::string();
  }

 private:
  std::string collect(loom::train::session& session) {
    written_ = true;
    session.gather_trace(trace_, file_);
    const int ranks = session.rank().world_size;
    if (rank_ != 0) return {};
    const auto s = trace_.stats();
    const auto& w = trace_.options().window;
    return "trace of steps " + std::to_string(w.first) + ":" + std::to_string(w.last) + " (" + std::to_string(ranks) +
           (ranks > 1 ? " ranks" : " rank") + ") written to " + file_.string() + " | " + std::to_string(s.events) +
           " events on rank 0, recorder overhead " + std::to_string(s.recorder_seconds * 1e3).substr(0, 6) +
           " ms" + (s.dropped ? ", " + std::to_string(s.dropped) + " events dropped (max_events)" : "") +
           (device_started_ ? " | CANN profiler data under " + device_dir_.string() : "");
  }

  void start_device() {
    if (device_profiler_ && session_) device_started_ = session_->start_device_profiler(device_dir_);
  }
  void stop_device() {
    if (device_started_ && session_) session_->stop_device_profiler();
  }

  loom::io::trace_recorder trace_;
  loom::io::trace_observer observer_;
  std::filesystem::path file_, device_dir_;
  int rank_ = 0;
  bool written_ = false, device_profiler_ = false, device_started_ = false;
  loom::train::session* session_ = nullptr;
};

}  // namespace train_gpt_cli
