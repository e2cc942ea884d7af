#pragma once
// Pieces of train_gpt's training loop (train_gpt/run.cpp, on every layout).
// Not a library header: examples/ only.
#include <algorithm>
#include <chrono>
#include <functional>
#include <type_traits>
#include <cmath>
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
/// every rank); otherwise only the lead rank saves. A failed save is reported (when the next
/// one starts, or at finish()) and training goes on; NaN weights stop the run
/// (loom::numeric_error, on every rank alike). No-op without --checkpoint-dir.
class checkpoint_saver {
 public:
  checkpoint_saver(loom::train::session& s, std::string dir, int keep, long start, bool collective, int ranks,
                   bool lead, loom::train::console& con, std::function<void(const std::string&)> warn)
      : s_(s), dir_(std::move(dir)), keep_(keep), last_(start), collective_(collective), ranks_(collective ? ranks : 0),
        lead_(lead), con_(con), warn_(std::move(warn)) {}

  /// Saves the state after s.step_count() steps with `state` (a no-op when that step is already
  /// saved, or on a non-lead rank of a non-collective save).
  void save(const loom::io::run_state& state) {
    if (dir_.empty() || s_.step_count() == last_ || (!collective_ && !lead_)) return;
    finish();
    loom::io::checkpoint_options opt;
    opt.keep = keep_;
    s_.save_checkpoint(dir_, state, opt, collective_);
    last_ = s_.step_count();
  }

  /// Waits for the save in flight (collective when it is), reports it on the lead rank.
  void finish() {
    if (dir_.empty() || (!collective_ && !lead_)) return;
    try {
      const auto where = s_.wait_checkpoint(collective_);
      if (where && lead_)
        con_.message("saved checkpoint " + where->string() + " (" +
                     (ranks_ > 0 ? "all " + std::to_string(ranks_) + " ranks, " : std::string()) +
                     "written in the background in " + std::to_string(s_.last_write_seconds()).substr(0, 5) + " s)");
    } catch (const loom::numeric_error&) {
      throw;
    } catch (const loom::error& e) {  // a collective save: every rank got the same error; latest did not move
      warn_(e.what());
    }
  }

 private:
  loom::train::session& s_;
  std::string dir_;
  int keep_;
  long last_;  ///< never save the step the run resumed from again
  bool collective_;
  int ranks_ = 0;  ///< ranks of a collective save, 0 for a lead-only one
  bool lead_;
  loom::train::console& con_;
  std::function<void(const std::string&)> warn_;
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
