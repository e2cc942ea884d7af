#pragma once
/// \file Dynamic loss scaling for fp16 training (usable with any precision).
///
/// The loss (in loom: the dlogits the fused cross-entropy writes) is multiplied by a scale S
/// before backward, so small gradients stay representable in half precision; the gradients
/// are divided by S again before the global-norm clip. A step whose gradients hold a NaN or an
/// infinity is skipped (parameters, AdamW moments and the learning-rate schedule untouched)
/// and S is halved; after `growth_interval` consecutive good steps S is doubled.
/// Source: Micikevicius et al., "Mixed Precision Training", arXiv:1710.03740, §3.2; semantics
/// of torch.cuda.amp.GradScaler (growth_interval 2000, backoff 0.5, growth 2); initial scale
/// 512 as the Ascend mixed-precision guide recommends. See docs/precision.md.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <deque>
#include <string>

#include <loom/core/error.hpp>

namespace loom::precision {

/// Settings of dynamic_loss_scaler (PyTorch GradScaler names where they exist).
struct loss_scaler_config {
  double initial_scale = 512;     ///< S at step 0 (Ascend guide: 512)
  double growth_factor = 2;       ///< S *= this after growth_interval good steps in a row
  double backoff_factor = 0.5;    ///< S *= this on a step with non-finite gradients
  long growth_interval = 2000;    ///< good steps in a row before S grows
  double min_scale = 1.0 / 1024;  ///< floor: S never goes below it (overflowing steps are still skipped)
  double max_scale = 16777216;    ///< cap (2^24): fp32 gradients of a scaled loss stay far from overflow
  int warn_reductions = 8;        ///< warn when S was reduced more than this many times ...
  long warn_window = 1000;        ///< ... within this many steps (the guide's "watch the scale trend")

  /// Throws loom::input_error naming the setting when the values cannot describe a scaler.
  void validate() const {
    auto bad = [](const std::string& what) { throw input_error("loss scaler: " + what); };
    if (!(min_scale > 0) || !std::isfinite(min_scale)) bad("min_scale must be a positive finite number, e.g. 1/1024");
    if (!(max_scale >= min_scale) || !std::isfinite(max_scale)) bad("max_scale must be finite and >= min_scale, e.g. 2^24");
    if (!(initial_scale >= min_scale && initial_scale <= max_scale))
      bad("initial_scale must lie in [min_scale, max_scale]; pass e.g. --loss-scale 512");
    if (!(growth_factor > 1) || !std::isfinite(growth_factor)) bad("growth_factor must be > 1, e.g. 2");
    if (!(backoff_factor > 0 && backoff_factor < 1)) bad("backoff_factor must be in (0, 1), e.g. 0.5");
    if (growth_interval < 1) bad("growth_interval must be >= 1 step, e.g. 2000");
    if (warn_reductions < 0 || warn_window < 1) bad("warn_reductions must be >= 0 and warn_window >= 1");
  }
};

/// What a checkpoint saves of a loss scaler (io/checkpoint's manifest "loss_scaler" section).
struct loss_scaler_state {
  double scale = 1;     ///< current S
  long good_steps = 0;  ///< consecutive overflow-free steps since the last change of S (PyTorch: growth tracker)
};

/// Dynamic loss scaler. Used by train::trainer (template argument Scaler): the trainer asks
/// scale() before the step, checks the gradients, then calls update(finite, step).
class dynamic_loss_scaler {
 public:
  static constexpr bool enabled = true;

  /// Throws loom::input_error for invalid settings (loss_scaler_config::validate).
  explicit dynamic_loss_scaler(loss_scaler_config cfg = {}) : cfg_(cfg) {
    cfg_.validate();
    state_.scale = cfg_.initial_scale;
  }

  const loss_scaler_config& config() const noexcept { return cfg_; }
  /// The scale S to multiply the loss by in the next step.
  double scale() const noexcept { return state_.scale; }
  loss_scaler_state state() const noexcept { return state_; }
  /// Restores a saved state (a checkpoint). Throws loom::input_error for a scale that is not
  /// positive and finite or a negative counter. The reduction history restarts empty.
  void set_state(loss_scaler_state s) {
    if (!(s.scale > 0) || !std::isfinite(s.scale) || s.good_steps < 0)
      throw input_error("loss scaler state: scale " + std::to_string(s.scale) + ", good steps " +
                        std::to_string(s.good_steps) + " is invalid; the scale must be positive and finite");
    state_ = s;
    reductions_.clear();
  }
  /// Times S was reduced since construction.
  long reductions() const noexcept { return total_reductions_; }

  /// Records the outcome of step `step` (0-based): `finite` false means the step's gradients
  /// held a NaN or an infinity and the step was skipped. Adjusts S. Returns a warning naming
  /// the step when S has now been reduced more than warn_reductions times within the last
  /// warn_window steps, otherwise an empty string.
  std::string update(bool finite, long step) {
    if (finite) {
      if (++state_.good_steps >= cfg_.growth_interval) {
        state_.scale = std::min(state_.scale * cfg_.growth_factor, cfg_.max_scale);
        state_.good_steps = 0;
      }
      return {};
    }
    state_.scale = std::max(state_.scale * cfg_.backoff_factor, cfg_.min_scale);
    state_.good_steps = 0;
    ++total_reductions_;
    reductions_.push_back(step);
    while (!reductions_.empty() && reductions_.front() <= step - cfg_.warn_window) reductions_.pop_front();
    if (long(reductions_.size()) <= cfg_.warn_reductions) return {};
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "step %ld: the loss scale was reduced %zu times in the last %ld steps (now %g): gradients keep "
                  "overflowing; lower the learning rate, check the data for outliers, or train in bf16",
                  step, reductions_.size(), cfg_.warn_window, state_.scale);
    return msg;
  }

 private:
  loss_scaler_config cfg_;
  loss_scaler_state state_;
  std::deque<long> reductions_;  // steps of the reductions within the warning window
  long total_reductions_ = 0;
};

/// No loss scaling: S = 1 always (the trainer's default for fp32 and bf16). A trainer with an
/// fp16 policy refuses it at compile time.
struct no_loss_scaler {
  static constexpr bool enabled = false;
  explicit no_loss_scaler(loss_scaler_config = {}) noexcept {}
  double scale() const noexcept { return 1.0; }
  loss_scaler_state state() const noexcept { return {1.0, 0}; }
  void set_state(loss_scaler_state) noexcept {}
  std::string update(bool, long) noexcept { return {}; }
};

/// A type the trainer accepts as its Scaler argument.
template <class S>
concept loss_scaler = requires(S s, const S cs, bool finite, long step, loss_scaler_state st) {
  { S::enabled } -> std::convertible_to<bool>;
  { cs.scale() } -> std::convertible_to<double>;
  { cs.state() } -> std::same_as<loss_scaler_state>;
  s.set_state(st);
  { s.update(finite, step) } -> std::convertible_to<std::string>;
};
static_assert(loss_scaler<dynamic_loss_scaler> && loss_scaler<no_loss_scaler>);

}  // namespace loom::precision
