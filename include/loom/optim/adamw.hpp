#pragma once
/// \file AdamW over a model's flat parameter buffer, with global-norm gradient clipping.
/// Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", arXiv:1711.05101;
/// semantics match torch.optim.AdamW and torch.nn.utils.clip_grad_norm_.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/models/params.hpp>
#include <loom/precision/policy.hpp>

namespace loom::optim {

/// Hyper-parameters (PyTorch names and GPT-2/3 defaults).
struct adamw_config {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   ///< applied only to tensors whose param_spec::decay is true
  double max_grad_norm = 1.0;  ///< clip the global L2 norm to this; <= 0 disables clipping
};

/// Clip coefficient for a global gradient norm (clip_grad_norm_: max_norm / (norm + 1e-6),
/// capped at 1). Returns 1 when clipping is off.
inline double clip_coefficient(double norm, double max_norm) noexcept {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

/// AdamW state for model G (a loom::nn::transformer): first and second moments in the master type, the
/// step count, and — when the storage is narrower than the master type (bf16, fp16;
/// precision::has_master_copy_v) — fp32 master weights. With masters, the update runs on them
/// and the model's parameters become their rounding to the storage type (Micikevicius et al.,
/// "Mixed Precision Training", arXiv:1710.03740, §3.1).
/// Memory: (2 + has_master_copy) * G::num_parameters * sizeof(master) bytes.
template <class G>
class adamw {
 public:
  using device = typename G::device;
  using master_t = typename G::precision::master;
  static constexpr bool has_master = precision::has_master_copy_v<typename G::precision>;

  /// Moments zero; master weights (if any) copied from `model`'s parameters.
  adamw(context<device>& ctx, adamw_config cfg, const G& model)
      : cfg_(cfg), m_(G::num_parameters, ctx.stream), v_(G::num_parameters, ctx.stream),
        master_(has_master ? G::num_parameters : 0, ctx.stream) {
    sync_master_weights(ctx, model);
  }
  /// Without master weights the model is not needed at construction.
  adamw(context<device>& ctx, adamw_config cfg)
    requires(!has_master)
      : cfg_(cfg), m_(G::num_parameters, ctx.stream), v_(G::num_parameters, ctx.stream), master_(0, ctx.stream) {}

  /// No state at all (as after release()), nothing allocated: counts steps only, for a trainer
  /// whose state lives elsewhere (optim::offload_adamw in host memory).
  explicit adamw(adamw_config cfg) noexcept : cfg_(cfg) {}

  const adamw_config& config() const noexcept { return cfg_; }
  /// Completed optimizer steps (the t of bias correction is step() + 1 during an update).
  long step() const noexcept { return t_; }
  void set_step(long t) noexcept { t_ = t; }
  /// Frees the moments and master weights: a sharded optimizer (optim::zero1) holds the state
  /// instead. first_moment(), second_moment() and master_weights() are empty afterwards,
  /// sync_master_weights() does nothing and update() must not be called; step() still counts.
  void release() noexcept {
    m_ = {};
    v_ = {};
    master_ = {};
  }
  /// Bytes of optimizer state held: moments plus master weights.
  std::size_t bytes() const noexcept { return m_.bytes() + v_.bytes() + master_.bytes(); }
  view<device, master_t> first_moment() const noexcept { return m_.all(); }
  view<device, master_t> second_moment() const noexcept { return v_.all(); }
  /// fp32 master weights (same layout as the parameters); only with has_master.
  view<device, master_t> master_weights() const noexcept
    requires(has_master)
  {
    return master_.all();
  }
  /// Master weights = the model's parameters, widened (after loading weights into the model
  /// from elsewhere, e.g. io::import_gpt2). No-op without master weights.
  void sync_master_weights(context<device>& ctx, const G& model) {
    if constexpr (has_master) {
      if (master_.size() == 0) return;  // released
      const auto p = model.parameters();
      G::ops::cast(ctx, master_.data(), p.data(), p.size());
    }
  }

  /// Global L2 norm of all gradients of `model` (each tensor counted once), in double.
  static double grad_norm(context<device>& ctx, const G& model) {
    const auto g = model.gradients();
    return std::sqrt(G::ops::sum_of_squares(ctx, g.data(), g.size()));
  }

  /// One update at learning rate lr with the gradients of `model` multiplied by grad_scale
  /// (clip coefficient and any unscaling). Updates the parameters (through the masters, when
  /// kept) and moments in place, tensor by tensor so that weight decay follows the table.
  /// Increments step().
  void update(context<device>& ctx, G& model, double lr, double grad_scale) {
    ++t_;
    for (std::size_t k = 0; k < G::num_tensors; ++k) {
      const auto p = model.parameter(k);
      const auto g = model.gradient(k);
      const std::size_t off = G::offsets[k];
      const double wd = G::table[k].decay ? cfg_.weight_decay : 0.0;
      if constexpr (has_master)
        G::ops::adamw_master(ctx, p.data(), master_.data() + off, m_.data() + off, v_.data() + off, g.data(), p.size(),
                             master_t(lr), master_t(cfg_.beta1), master_t(cfg_.beta2), master_t(cfg_.eps),
                             master_t(wd), master_t(grad_scale), t_);
      else
        G::ops::adamw(ctx, p.data(), m_.data() + off, v_.data() + off, g.data(), p.size(), master_t(lr),
                      master_t(cfg_.beta1), master_t(cfg_.beta2), master_t(cfg_.eps), master_t(wd),
                      master_t(grad_scale), t_);
    }
  }

 private:
  adamw_config cfg_;
  buffer<device, master_t> m_, v_, master_;
  long t_ = 0;
};

}  // namespace loom::optim
