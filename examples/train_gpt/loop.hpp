#pragma once
// Pieces of train_gpt's training loop (train_gpt/run.cpp, on every layout).
// Not a library header: examples/ only.
#include <algorithm>
#include <chrono>
#include <functional>
#include <type_traits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/io/jsonl.hpp>
#include <loom/io/scalar.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/train/console.hpp>
#include <loom/train/session.hpp>

namespace train_gpt_cli {

/// After step `step` of a run with a dynamic loss scaler (fp16): writes the scale the step used
/// (`r.loss_scale`) as `train/loss_scale` to the TensorBoard and JSON-lines logs (those that are
/// open), prints a console line on the lead rank when the step was skipped or the scale changed
/// (`r.loss_scale -> next_scale`, the scale of the next step), and passes the scaler's warning
/// (`r.warning`, if any) to `warn`.
template <class Warn>
void report_loss_scale(long step, const loom::train::step_result& r, double next_scale, bool lead,
                       loom::train::console& con, Warn&& warn, std::optional<loom::io::tensorboard_writer>& tb,
                       std::optional<loom::io::jsonl_writer>& jsonl) {
  if (lead && (r.skipped || r.loss_scale != next_scale))
    con.message("step " + std::to_string(step) + (r.skipped ? ": non-finite gradients, step skipped" : "") +
                " | loss scale " + std::to_string(r.loss_scale) + " -> " + std::to_string(next_scale));
  if (!r.warning.empty()) warn(r.warning);
  const loom::io::scalar sc[] = {{"train/loss_scale", r.loss_scale}};
  if (tb) tb->add_scalars(step, sc);
  if (jsonl) jsonl->write_scalars(step, sc);
}

/// train_gpt's checkpoints: the state after each saved step, written in the background (the
/// loop waits only while the state is copied; train::session::save_checkpoint). A `collective`
/// save has every rank write its files (the commit runs at the next save or at finish(), on
/// every rank); otherwise only the lead rank saves. A failed save is reported when the next one
/// starts or at finish(), and counted: failure_summary() names them at the end of the run (whose
/// exit status is then 1). With `exit_on_failure` (--exit-on-save-failure) the first failure
/// throws loom::error on every rank instead. NaN weights stop the run (loom::numeric_error, on
/// every rank alike). No-op without --checkpoint-dir. Every rank calls save() and finish() at
/// the same steps.
class checkpoint_saver {
 public:
  checkpoint_saver(loom::train::session& s, std::string dir, int keep, long start, bool collective, int ranks,
                   bool lead, bool exit_on_failure, loom::train::console& con,
                   std::function<void(const std::string&)> warn)
      : s_(s), dir_(std::move(dir)), keep_(keep), last_(start), collective_(collective), ranks_(ranks), lead_(lead),
        exit_on_failure_(exit_on_failure), con_(con), warn_(std::move(warn)) {}

  /// Saves the state after s.step_count() steps with `state` (a no-op when that step is already
  /// saved, or on a non-lead rank of a non-collective save).
  void save(const loom::io::run_state& state) {
    if (dir_.empty() || s_.step_count() == last_) return;
    finish();
    last_ = s_.step_count();
    if (!collective_ && !lead_) return;
    loom::io::checkpoint_options opt;
    opt.keep = keep_;
    ++saves_;
    s_.save_checkpoint(dir_, state, opt, collective_);
  }

  /// Waits for the save in flight (collective when it is), reports it on the lead rank.
  void finish() {
    if (dir_.empty()) return;
    int failed = 0;
    if (collective_ || lead_) {
      try {
        const auto where = s_.wait_checkpoint(collective_);
        if (where && lead_)
          con_.message("saved checkpoint " + where->string() + " (" +
                       (collective_ ? "all " + std::to_string(ranks_) + " ranks, " : std::string()) +
                       "written in the background in " + std::to_string(s_.last_write_seconds()).substr(0, 5) + " s)");
      } catch (const loom::numeric_error&) {
        throw;
      } catch (const loom::error& e) {  // a collective save: every rank got the same error; latest did not move
        failed = 1;
        if (failures_++ == 0) first_failure_ = e.what();
        warn_(e.what());
      }
    }
    if (!exit_on_failure_) return;
    if (!collective_ && ranks_ > 1) failed = s_.broadcast_from_lead(failed);  // only the lead rank saved
    if (failed)
      throw loom::error("a checkpoint save failed and --exit-on-save-failure stops the run" +
                        (first_failure_.empty() ? std::string(" (on the lead rank)") : ": " + first_failure_));
  }

  /// After the last finish(): empty when every save succeeded (or none was made), else one line
  /// naming how many failed, the first failure and the newest checkpoint on disk.
  std::string failure_summary() const {
    if (failures_ == 0) return {};
    const auto all = loom::io::list_checkpoints(dir_);
    return std::to_string(failures_) + " of " + std::to_string(saves_) + " checkpoint saves failed (the first: " +
           first_failure_ + "); " +
           (all.empty() ? "'" + dir_ + "' holds no checkpoint of this run"
                        : "the newest checkpoint in '" + dir_ + "' is " + all.back().dir.filename().string()) +
           "; pass --exit-on-save-failure to stop at the first failure";
  }

 private:
  loom::train::session& s_;
  std::string dir_;
  int keep_;
  long last_;  ///< never save the step the run resumed from again
  bool collective_;
  int ranks_;  ///< ranks of the world
  bool lead_, exit_on_failure_;
  loom::train::console& con_;
  std::function<void(const std::string&)> warn_;
  int saves_ = 0, failures_ = 0;  ///< saves started, and failed, on this rank
  std::string first_failure_;
};

/// --exit-signal-handler: while an object of this type lives, the first SIGTERM or SIGINT is
/// recorded instead of ending the process (the loop reads requested() after each step, stops,
/// saves a checkpoint and exits 0: Megatron-LM's --exit-signal-handler), and both signals get
/// their default action back, so a second one ends the process at once (what is on disk stays
/// whole: checkpoints and weights are written to temporary names and renamed into place). The
/// flag is the one piece of process-wide state a POSIX signal handler can set (a
/// volatile std::sig_atomic_t). Constructed disabled, it installs nothing.
class exit_signal {
 public:
  explicit exit_signal(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    received() = 0;
    struct sigaction sa {};
    sa.sa_handler = &on_signal;
    sa.sa_flags = SA_RESTART;  // a system call the signal interrupts (a checkpoint's write) goes on
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGINT, &sa, &old_int_);
  }
  ~exit_signal() {
    if (!enabled_) return;
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
  }
  exit_signal(const exit_signal&) = delete;
  exit_signal& operator=(const exit_signal&) = delete;

  /// The signal received (SIGTERM or SIGINT), or 0.
  static int requested() noexcept { return int(received()); }
  /// "SIGTERM" or "SIGINT" for a signal number.
  static const char* name(int sig) noexcept { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

 private:
  static volatile std::sig_atomic_t& received() noexcept {
    static volatile std::sig_atomic_t flag = 0;
    return flag;
  }
  static void on_signal(int sig) noexcept {
    received() = sig;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGTERM, &dfl, nullptr);  // async-signal-safe: a second signal ends the process
    ::sigaction(SIGINT, &dfl, nullptr);
  }
  bool enabled_;
  struct sigaction old_term_ {}, old_int_ {};
};

/// --early-stop PATIENCE: follows the periodic validation losses of a run, keeps a copy of this
/// rank's parameters (as bytes: on a --layout run, its shard) at the best one, and says when
/// PATIENCE evaluations in a row have not improved on it (strictly lower loss; a NaN loss never
/// improves). Patience 0: off (observe() never asks to stop and copies nothing). The best is
/// tracked from the start of this process (a resumed run starts afresh).
class early_stopper {
 public:
  explicit early_stopper(long patience) : patience_(patience) {}
  bool enabled() const noexcept { return patience_ > 0; }
  /// The validation loss `nats` (nats/token) after `step` steps; `params()` returns the
  /// parameters then (called only for a new best). Returns true when training should end: the
  /// last `patience` evaluations did not improve on the best.
  template <class Params>
  bool observe(long step, double nats, Params&& params) {
    if (!enabled()) return false;
    if (!std::isnan(nats) && (best_step_ < 0 || nats < best_loss_)) {
      best_step_ = step;
      best_loss_ = nats;
      best_ = params();
      since_best_ = 0;
      return false;
    }
    return ++since_best_ >= patience_;
  }
  /// Step of the best evaluation, or -1 before the first.
  long best_step() const noexcept { return best_step_; }
  double best_loss() const noexcept { return best_loss_; }
  /// Evaluations since the best one.
  long since_best() const noexcept { return since_best_; }
  /// The parameters of the best evaluation (empty before the first).
  std::span<const std::byte> best() const noexcept { return best_; }
  /// The console line for the end of an early-stopped run after `step` steps.
  std::string stop_message(long step) const {
    return "early stop after step " + std::to_string(step) + ": the validation loss has not improved for " +
           std::to_string(patience_) + " evaluation" + (patience_ == 1 ? "" : "s") + " (--early-stop " +
           std::to_string(patience_) + "); " + keep_message();
  }
  /// "keeping the best weights, of step B (val loss L nats/token)", or that the last weights
  /// stay when no evaluation had a loss (all NaN).
  std::string keep_message() const {
    if (best_step_ < 0) return "no evaluation had a finite loss: keeping the last weights";
    char loss[32];
    std::snprintf(loss, sizeof loss, "%.4f", best_loss_);
    return "keeping the best weights, of step " + std::to_string(best_step_) + " (val loss " + loss + " nats/token)";
  }

 private:
  long patience_ = 0, best_step_ = -1, since_best_ = 0;
  double best_loss_ = 0;
  std::vector<std::byte> best_;
};

}  // namespace train_gpt_cli
