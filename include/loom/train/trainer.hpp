#pragma once
/// \file loom::trainer<Model, Policy, B, T>: one optimizer step over a global batch.
///
/// A global batch is `grad_accum` micro-batches of B windows of T+1 tokens. Each step:
/// validate the token ids; count the non-ignored targets of the whole global batch; for each
/// micro-batch run forward (fused cross-entropy writes dlogits scaled by 1/count, so the loss
/// is the mean over all tokens of the global batch whatever the micro-batch count) and
/// backward (gradients accumulate); global gradient norm; skip the update if it is not
/// finite; clip; AdamW at the scheduled learning rate.
///
/// Data parallel (layout<1,1>): construct with the data-parallel communicator. Each rank then
/// passes its own part of the global batch to step() (its windows, e.g. from a loader with
/// dp_rank/dp_size); the token count, the loss and the gradients are summed over the group
/// (parallel/data_parallel.hpp: buckets all-reduced while backward runs, optional ZeRO-1), so
/// loss, gradient norm and update equal one rank's on the whole global batch.
///
/// Mixed precision (docs/precision.md): with a loss scaler (template argument Scaler =
/// train::dynamic_loss_scaler) the dlogits are multiplied by the scale S, the gradient norm is
/// divided by S before clipping (unscale, then clip), and AdamW multiplies the gradients by
/// clip/S. A step with a non-finite gradient is then skipped entirely: parameters, moments and
/// the learning-rate schedule (which follows the optimizer's step count) stay as they were,
/// and S is lowered. An fp16 trainer without a loss scaler does not compile.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/nn/gpt.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/lr_schedule.hpp>
#include <loom/parallel/data_parallel.hpp>
#include <loom/train/loss_scaler.hpp>
#include <loom/train/metrics.hpp>

namespace loom::train {

/// Settings that do not change shapes (runtime).
struct trainer_config {
  int micro_batch = 0;             ///< sequences per micro-batch, 1..B (0: the capacity B)
  int seq_len = 0;                 ///< tokens per sequence, 1..T (0: the capacity T)
  int grad_accum = 1;              ///< micro-batches per optimizer step
  optim::cosine_schedule schedule; ///< learning rate per step
  optim::adamw_config adamw;       ///< AdamW and clipping
  std::uint64_t seed = 1337;       ///< parameter initialisation seed
  loss_scaler_config loss_scaler;  ///< dynamic loss scaling (used when the trainer has a loss scaler)
};

/// What one optimizer step did.
struct step_result {
  double loss = 0;        ///< mean cross-entropy over the global batch's non-ignored targets (nats/token)
  double grad_norm = 0;   ///< global L2 norm before clipping
  double lr = 0;          ///< learning rate used
  bool skipped = false;   ///< true when the gradient norm was not finite: nothing was updated
  long tokens = 0;        ///< non-ignored target tokens in the global batch
  double loss_scale = 1;  ///< loss scale S this step ran with (1 without a loss scaler)
  std::string warning;    ///< the loss scaler's warning (scale reduced too often), else empty
};

/// Checks that every id in `ids` lies in [0, vocab) (or equals ignore for targets) and
/// throws loom::input_error naming the first offending id and its position otherwise.
inline void validate_tokens(std::span<const std::int32_t> ids, int vocab, std::string_view what) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw input_error(std::string(what) + ": token id " + std::to_string(ids[i]) + " at position " +
                        std::to_string(i) + " is outside the model's vocabulary [0, " + std::to_string(vocab) +
                        "); re-tokenize the data with at most " + std::to_string(vocab) +
                        " tokens or choose a model with a larger vocabulary");
}

/// Number of targets in `targets` that are not kernels::ignore_index (-1): the tokens a batch
/// learns from. Throws loom::input_error (via validate_tokens) naming the first id outside
/// [0, vocab) that is not the ignore index.
inline long count_targets(std::span<const std::int32_t> targets, int vocab) {
  long count = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == kernels::ignore_index) continue;
    if (targets[i] < 0 || targets[i] >= vocab) validate_tokens(targets.subspan(i, 1), vocab, "training targets");
    ++count;
  }
  return count;
}

/// Rows of seq_len+1 token ids (row-major) -> inputs row[0..seq_len) and targets row[1..seq_len],
/// each (rows, seq_len) int32. Writes `in` and `tg` (at least rows * seq_len ids each).
inline void split_windows(std::span<const std::int32_t> w, std::size_t seq_len, std::span<std::int32_t> in,
                          std::span<std::int32_t> tg) {
  const std::size_t wn = seq_len + 1;
  for (std::size_t r = 0; r * wn < w.size(); ++r)
    for (std::size_t i = 0; i < seq_len; ++i) {
      in[r * seq_len + i] = w[r * wn + i];
      tg[r * seq_len + i] = w[r * wn + i + 1];
    }
}

/// Template arguments: M a models::model_config; Policy a loom::policy; B, T the micro-batch
/// and sequence capacity; Attn the attention tag; Scaler train::no_loss_scaler (default) or
/// train::dynamic_loss_scaler (required for fp16).
template <models::model_config M, class Policy, int B, int T, class Attn = kernels::fused,
          loss_scaler Scaler = no_loss_scaler>
class trainer {
  static_assert(!Policy::precision::needs_loss_scaling || Scaler::enabled,
                "loom::train::trainer: fp16 needs a loss scaler (half-precision gradients underflow and overflow "
                "without one): use train::trainer<M, Policy, B, T, Attn, train::dynamic_loss_scaler>");

 public:
  using model_t = nn::gpt<M, Policy, Attn>;
  using device = typename Policy::device;
  using acts_t = typename model_t::template activations<B, T>;
  using acc_t = typename model_t::acc_t;
  using scaler_t = Scaler;
  static constexpr int micro_batch = B, seq_len = T;

  /// Data-parallel trainer over the group `dp` (every rank of it constructs one, with the same
  /// cfg; dp must outlive the trainer). cfg.micro_batch and grad_accum are per rank: a global
  /// batch is dp.size() * grad_accum * micro_batch windows. With ddp.zero1 the trainer's own
  /// AdamW moments are not allocated (optimizer().first_moment() is empty; the shards live in
  /// the data_parallel engine). Throws loom::input_error for invalid settings.
  template <class Comm>
    requires parallel::communicator_for<Comm, float>
  trainer(context<device>& ctx, trainer_config cfg, Comm& dp, parallel::ddp_options ddp = {}) : trainer(ctx, cfg) {
    sync_ = std::make_unique<parallel::data_parallel<model_t, Comm>>(ctx, dp, ddp);
    if (ddp.zero1) opt_.release_moments();
  }

  /// Allocates the model (initialised with cfg.seed), the optimizer state and the activation
  /// table. Throws loom::input_error for invalid settings.
  trainer(context<device>& ctx, trainer_config cfg)
      : cfg_(cfg), model_(ctx, cfg.seed), opt_(ctx, cfg.adamw, model_), scaler_(cfg.loss_scaler), acts_(ctx),
        inputs_(std::size_t(B) * T, ctx.stream), targets_(std::size_t(B) * T, ctx.stream),
        host_in_(std::size_t(cfg.grad_accum > 0 ? cfg.grad_accum : 1) * B * T),
        host_tg_(host_in_.size()) {
    if (cfg_.micro_batch == 0) cfg_.micro_batch = B;
    if (cfg_.seq_len == 0) cfg_.seq_len = T;
    if (cfg_.micro_batch < 1 || cfg_.micro_batch > B)
      throw input_error("micro-batch size " + std::to_string(cfg_.micro_batch) + " is outside [1, " + std::to_string(B) +
                        "], the capacity this trainer was compiled for; pass --micro-batch <= " + std::to_string(B) +
                        " or compile a larger capacity");
    if (cfg_.seq_len < 1 || cfg_.seq_len > T)
      throw input_error("sequence length " + std::to_string(cfg_.seq_len) + " is outside [1, " + std::to_string(T) +
                        "] (the model " + std::string(M::name) + " has " + std::to_string(M::max_seq) +
                        " positions; this trainer was compiled for " + std::to_string(T) + "); pass --seq-len <= " +
                        std::to_string(T));
    if (cfg_.grad_accum < 1) throw input_error("gradient accumulation steps must be >= 1; pass e.g. --grad-accum 1");
    cfg_.schedule.validate();
  }

  model_t& model() noexcept { return model_; }
  const model_t& model() const noexcept { return model_; }
  optim::adamw<model_t>& optimizer() noexcept { return opt_; }
  const optim::adamw<model_t>& optimizer() const noexcept { return opt_; }
  const trainer_config& config() const noexcept { return cfg_; }
  const acts_t& activations() const noexcept { return acts_; }
  /// The data-parallel engine, or null for a single-rank trainer.
  parallel::grad_sync<model_t>* data_parallel() const noexcept { return sync_.get(); }
  /// Completed optimizer steps (skipped steps count too: the schedule advances).
  /// The loss scaler (its state() / set_state() go into checkpoints).
  Scaler& loss_scaler() noexcept { return scaler_; }
  const Scaler& loss_scaler() const noexcept { return scaler_; }
  /// Master weights = parameters, after weights were loaded into model() from elsewhere
  /// (e.g. io::import_gpt2). No-op for precisions without master weights.
  void sync_master_weights(context<device>& ctx) { opt_.sync_master_weights(ctx, model_); }
  /// Steps taken, skipped ones included. Without a loss scaler the schedule follows this
  /// count (a skipped step advances it); with one it follows optimizer().step().
  long step_count() const noexcept { return step_; }
  void set_step_count(long s) noexcept { step_ = s; }

  /// Called at the start (begin = true) and end of every phase inside step(): h2d_copy,
  /// forward, backward and optimizer, so a step_timer or a trace recorder can attribute time.
  /// Empty by default (no cost beyond one test per phase).
  std::function<void(phase, bool begin)> on_phase;

  /// Windows per global batch.
  std::size_t windows_per_step() const noexcept { return std::size_t(cfg_.grad_accum) * cfg_.micro_batch; }
  /// Tokens per window: seq_len + 1 (inputs and the shifted targets).
  std::size_t window() const noexcept { return std::size_t(cfg_.seq_len) + 1; }
  /// Target tokens per global batch.
  std::size_t tokens_per_step() const noexcept { return windows_per_step() * cfg_.seq_len; }

  /// One optimizer step on `windows`: grad_accum*B rows of T+1 token ids each (row-major);
  /// inputs are row[0..T), targets row[1..T]. Throws loom::input_error on a wrong size or an
  /// id outside [0, vocab).
  step_result step(context<device>& ctx, std::span<const std::int32_t> windows) {
    if (windows.size() != windows_per_step() * window())
      throw input_error("a global batch needs " + std::to_string(windows_per_step()) + " windows of " +
                        std::to_string(window()) + " tokens (" + std::to_string(windows_per_step() * window()) +
                        " ids), got " + std::to_string(windows.size()));
    validate_tokens(windows, M::vocab, "training batch");
    const std::span<std::int32_t> in(host_in_.data(), tokens_per_step()), tg(host_tg_.data(), tokens_per_step());
    split_windows(windows, in, tg);
    return step(ctx, in, tg);
  }

  /// One optimizer step on explicit inputs and targets, each (grad_accum, micro_batch, seq_len) int32.
  /// Targets equal to kernels::ignore_index (-1) are padding: they add no loss and no
  /// gradient, and the loss is the mean over the other targets of the whole global batch.
  /// Throws loom::input_error on wrong sizes, ids outside [0, vocab), or a batch whose
  /// targets are all ignored.
  step_result step(context<device>& ctx, std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
    const std::size_t n = tokens_per_step();
    if (inputs.size() != n || targets.size() != n)
      throw input_error("inputs and targets of a global batch need grad_accum*micro_batch*seq_len = " + std::to_string(n) +
                        " ids each, got " + std::to_string(inputs.size()) + " and " + std::to_string(targets.size()));
    validate_tokens(inputs, M::vocab, "training inputs");
    long count = count_targets(targets, M::vocab);
    if (sync_) count = sync_->global_sum(count);  // every rank scales by the global count
    if (count == 0) throw input_error("every target of the global batch is ignored (-1); the batch holds no tokens to learn from");
    const double loss_scale = scaler_.scale();
    const acc_t scale = acc_t(loss_scale / double(count));
    model_.zero_grad(ctx);
    double loss_sum = 0;
    const int b = cfg_.micro_batch, t = cfg_.seq_len;
    const std::size_t mb = std::size_t(b) * t;
    for (int m = 0; m < cfg_.grad_accum; ++m) {
      mark(phase::h2d_copy, true);
      copy_in(ctx, inputs.subspan(m * mb, mb), targets.subspan(m * mb, mb));
      mark(phase::h2d_copy, false);
      mark(phase::forward, true);
      loss_sum += double(model_.forward(ctx, acts_, inputs_.data(), targets_.data(), b, t, scale));
      mark(phase::forward, false);
      mark(phase::backward, true);
      if (sync_ && m + 1 == cfg_.grad_accum) {  // only the final micro-batch communicates
        sync_->begin_backward(ctx);
        model_.backward(ctx, acts_, inputs_.data(), b, t, [&](int layer) { sync_->grads_ready(ctx, model_, layer); });
      } else {
        model_.backward(ctx, acts_, inputs_.data(), b, t);
      }
      mark(phase::backward, false);
    }
    step_result r;
    if (sync_) {
      mark(phase::exposed_comm, true);
      const auto s = sync_->finish(ctx, model_, loss_sum);
      mark(phase::exposed_comm, false);
      loss_sum = s.loss_sum;
      r.grad_norm = s.grad_norm();
    }
    mark(phase::optimizer, true);
    r.tokens = count;
    r.loss = loss_sum / double(count);
    r.loss_scale = loss_scale;
    if (!sync_) r.grad_norm = opt_.grad_norm(ctx, model_);
    r.grad_norm /= loss_scale;  // unscale, then clip: the norm of the scaled gradients (double) divided by S
    r.lr = cfg_.schedule(Scaler::enabled ? opt_.step() : step_);
    const bool finite = std::isfinite(r.grad_norm);
    r.warning = scaler_.update(finite, step_);
    ++step_;
    const double coef = optim::clip_coefficient(r.grad_norm, cfg_.adamw.max_grad_norm) / loss_scale;
    if (!finite) {
      r.skipped = true;  // parameters and moments untouched (and, with a scaler, the schedule)
    } else if (sync_ && sync_->options().zero1) {
      const long t = opt_.step() + 1;
      sync_->update(ctx, model_, cfg_.adamw, r.lr, coef, t);
      opt_.set_step(t);
      ctx.synchronize();
    } else {
      opt_.update(ctx, model_, r.lr, coef);
      ctx.synchronize();
    }
    mark(phase::optimizer, false);
    if (sync_) sync_->check_replicas(ctx, model_, step_);
    return r;
  }

  /// Mean loss (nats/token) over `windows`: rows >= 1 rows of seq_len+1 ids (row-major), no
  /// update. The rows run in micro-batches of micro_batch rows, the last one with the rows that
  /// are left (b < micro_batch), so every window counts exactly once and the result is the
  /// token-weighted mean over all of them, whatever the micro-batch (up to fp32 summation
  /// order): the sum of the per-token losses over rows * seq_len targets. Throws
  /// loom::input_error when `windows` is empty or not whole windows, or on an id outside [0, vocab).
  double evaluate(context<device>& ctx, std::span<const std::int32_t> windows) {
    const int t = cfg_.seq_len;
    const std::size_t w = window();
    if (windows.empty() || windows.size() % w != 0)
      throw input_error("evaluation needs one or more windows of " + std::to_string(w) + " tokens (seq_len + 1), got " +
                        std::to_string(windows.size()) + " ids");
    validate_tokens(windows, M::vocab, "evaluation batch");
    const std::size_t rows = windows.size() / w;
    double sum = 0;
    for (std::size_t first = 0; first < rows; first += std::size_t(cfg_.micro_batch)) {
      const int b = int(std::min<std::size_t>(std::size_t(cfg_.micro_batch), rows - first));
      const std::size_t bt = std::size_t(b) * t;
      const std::span<std::int32_t> in(host_in_.data(), bt), tg(host_tg_.data(), bt);
      split_windows(windows.subspan(first * w, std::size_t(b) * w), in, tg);
      copy_in(ctx, in, tg);
      sum += double(model_.forward(ctx, acts_, inputs_.data(), targets_.data(), b, t));
    }
    ctx.synchronize();
    return sum / double(rows * std::size_t(t));
  }

 private:
  void mark(phase p, bool begin) {
    if (on_phase) on_phase(p, begin);
  }
  void split_windows(std::span<const std::int32_t> w, std::span<std::int32_t> in, std::span<std::int32_t> tg) const {
    train::split_windows(w, std::size_t(cfg_.seq_len), in, tg);
  }
  void copy_in(context<device>& ctx, std::span<const std::int32_t> in, std::span<const std::int32_t> tg) {
    device::copy_to_device(inputs_.data(), in.data(), in.size_bytes(), ctx.stream);
    device::copy_to_device(targets_.data(), tg.data(), tg.size_bytes(), ctx.stream);
  }

  trainer_config cfg_;
  model_t model_;
  optim::adamw<model_t> opt_;
  Scaler scaler_;
  acts_t acts_;
  buffer<device, std::int32_t> inputs_, targets_;
  std::vector<std::int32_t> host_in_, host_tg_;
  long step_ = 0;
  std::unique_ptr<parallel::grad_sync<model_t>> sync_;  // null: single rank
};

}  // namespace loom::train
