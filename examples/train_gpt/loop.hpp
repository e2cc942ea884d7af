#pragma once
// Pieces of train_gpt's training loop shared by train_gpt.cpp (one layout, DDP over --ranks /
// mpirun) and run_layout.hpp (--layout tpXppY). Not a library header: examples/ only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <loom/io/jsonl.hpp>
#include <loom/io/scalar.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/train/console.hpp>

namespace train_gpt_cli {

/// After step `step` of a run with a dynamic loss scaler (fp16): writes the scale the step used
/// (`r.loss_scale`) as `train/loss_scale` to the TensorBoard and JSON-lines logs (those that are
/// open), prints a console line on the lead rank when the step was skipped or the scale changed
/// (`r.loss_scale -> scaler.scale()`), and passes the scaler's warning (`r.warning`, if any) to
/// `warn`. Result: train::step_result; Scaler: train::dynamic_loss_scaler.
template <class Result, class Scaler, class Warn>
void report_loss_scale(long step, const Result& r, const Scaler& scaler, bool lead, loom::train::console& con,
                       Warn&& warn, std::optional<loom::io::tensorboard_writer>& tb,
                       std::optional<loom::io::jsonl_writer>& jsonl) {
  if (lead && (r.skipped || r.loss_scale != scaler.scale()))
    con.message("step " + std::to_string(step) + (r.skipped ? ": non-finite gradients, step skipped" : "") +
                " | loss scale " + std::to_string(r.loss_scale) + " -> " + std::to_string(scaler.scale()));
  if (!r.warning.empty()) warn(r.warning);
  const loom::io::scalar sc[] = {{"train/loss_scale", r.loss_scale}};
  if (tb) tb->add_scalars(step, sc);
  if (jsonl) jsonl->write_scalars(step, sc);
}

/// --early-stop PATIENCE: follows the periodic validation losses of a run, keeps a copy of the
/// parameters (element type T: the model's storage type; on a --layout run, this rank's
/// shard) at the best one, and says when PATIENCE evaluations in a row have not improved on it
/// (strictly lower loss; a NaN loss never improves). Patience 0: off (observe() never asks to
/// stop and copies nothing). The best is tracked from the start of this process (a resumed
/// run starts afresh).
template <class T>
class early_stopper {
 public:
  explicit early_stopper(long patience) : patience_(patience) {}
  bool enabled() const noexcept { return patience_ > 0; }
  /// The validation loss `nats` (nats/token) after `step` steps, the parameters then. Returns
  /// true when training should end: the last `patience` evaluations did not improve on the best.
  bool observe(long step, double nats, std::span<const T> params) {
    if (!enabled()) return false;
    if (!std::isnan(nats) && (best_step_ < 0 || nats < best_loss_)) {
      best_step_ = step;
      best_loss_ = nats;
      best_.assign(params.begin(), params.end());
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
  /// Copies the best parameters into `params` (same size). Returns false, copying nothing, when
  /// there was no evaluation.
  bool restore(std::span<T> params) const {
    if (best_step_ < 0 || best_.size() != params.size()) return false;
    std::copy(best_.begin(), best_.end(), params.begin());
    return true;
  }
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
  std::vector<T> best_;
};

}  // namespace train_gpt_cli
