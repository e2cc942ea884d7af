#pragma once
/// \file Learning-rate schedule: linear warm-up, then cosine decay to a floor.
/// Source: Loshchilov & Hutter, "SGDR", arXiv:1608.03983 (cosine); warm-up as in GPT-2/3
/// training (Brown et al. 2020, "Language Models are Few-Shot Learners", §B).
#include <cmath>

#include <loom/core/error.hpp>

namespace loom::optim {

/// lr(s), s = 0-based optimizer step:
///   s <  warmup:               max_lr * (s + 1) / warmup      (never 0 at step 0)
///   warmup <= s < decay_steps: min_lr + 0.5 (1 + cos(pi (s - warmup)/(decay_steps - warmup))) (max_lr - min_lr)
///   s >= decay_steps:          min_lr                          (stays at the floor)
struct cosine_schedule {
  double max_lr = 6e-4;
  double min_lr = 6e-5;
  long warmup = 0;
  long decay_steps = 1;

  /// Throws loom::input_error when the settings cannot describe a schedule.
  void validate() const {
    if (!(max_lr > 0) || !std::isfinite(max_lr))
      throw input_error("learning rate must be a positive finite number; pass e.g. --lr 1e-3");
    if (!(min_lr >= 0) || min_lr > max_lr)
      throw input_error("minimum learning rate must be in [0, lr]; pass e.g. --min-lr " + std::to_string(max_lr / 10));
    if (warmup < 0) throw input_error("warm-up steps must be >= 0; pass e.g. --warmup 100");
  }

  double operator()(long s) const noexcept {
    if (s < warmup) return max_lr * double(s + 1) / double(warmup);
    if (s >= decay_steps) return min_lr;
    const double ratio = double(s - warmup) / double(decay_steps - warmup);
    return min_lr + 0.5 * (1.0 + std::cos(3.141592653589793 * ratio)) * (max_lr - min_lr);
  }
};

}  // namespace loom::optim
