#pragma once
/// \file loom::train::parallel_trainer<Model, Policy, B, T, Comm>: one optimizer step of a GPT
/// split under layout<TP, PP> (tensor and pipeline parallel, nn::gpt_parallel), with data
/// parallelism over the remaining world ranks on top — Megatron-LM's 3D parallelism
/// (Shoeybi et al. 2019; Narayanan et al. 2021 "Efficient Large-Scale Language Model Training
/// on GPU Clusters Using Megatron-LM" §2).
///
/// A separate class rather than a layout branch inside train::trainer: the single-layout
/// trainer's data-parallel engine (parallel/data_parallel.hpp: buckets all-reduced during
/// backward, ZeRO-1) is driven by nn::gpt's per-layer backward hook, while here backward runs
/// inside the 1F1B executor (nn::pipeline_forward_backward) and the gradient norm is a TP/PP
/// collective (the engine runs ZeRO-1 here after the pipeline; below). The user-facing surface
/// is the same where it makes sense: trainer_config, ddp_options, step(ctx, windows),
/// step_result, evaluate(), step_count(), set_step_count(), config(), model(), optimizer(),
/// data_parallel(), on_phase — and the members of io::checkpointable_trainer.
///
/// One step, on every rank (ranks ordered tp fastest, then dp, then pp; parallel::make_groups):
///   1. validate the token ids; count the non-ignored targets of THIS dp rank's share and sum the
///      count over the dp group (every rank scales by the global count);
///   2. zero gradients; 1F1B forward/backward of grad_accum micro-batches (the pipeline's m)
///      through the pp group, TP collectives inside each layer;
///   3. sum the tied embedding's two copies' gradients (first and last stage);
///   4. all-reduce (sum) the gradient buffer and the loss over the dp group;
///   5. global gradient norm over tp and pp (every element of the unsharded model once);
///      skip the update on every rank if it is not finite; clip; AdamW.
/// The loss, gradient norm and update equal the single-rank trainer's on the whole global batch
/// (dp * grad_accum * micro_batch windows) up to fp32 summation order.
///
/// ZeRO-1 (ddp_options::zero1; Rajbhandari et al., arXiv:1910.02054, stage 1) runs on the dp
/// group with the layout<1,1> trainer's engine, parallel::data_parallel<model_t, Comm> (Note
/// [DDP buckets]; its buckets cut this rank's tp x pp cell's buffer, layer by layer). Steps 4-5
/// become: 4'. every bucket is padded to dp equal chunks and reduce-scattered over the dp group
/// (the loss is all-reduced as above); 5'. the squared norm of the owned chunks, counting only
/// the elements of tensors that nn::counts_in_norm on this (tp rank, stage), summed over dp, then
/// tp, then pp: every element of the unsharded model once, the same number on every rank; skip
/// if not finite; clip; AdamW on the owned chunks with moments for them only (2/dp of this
/// cell's moments); all-gather the updated parameters over dp. The gradient sums are those of
/// the all-reduce (comm::threads sums in rank order either way), so only the norm's double
/// summation order differs from the path without ZeRO-1. fp32 only: with bf16/fp16 the fp32
/// master weights would have to be sharded too (refused with input_error).
///
/// Mixed precision as train::trainer (docs/precision.md): bf16/fp16 parameters and activations,
/// fp32 parameter gradients (nn::gpt_parallel::grad_t), fp32 master weights and moments in AdamW;
/// the TP/PP activation (gradient) messages travel in the storage type, reductions of them sum in
/// fp32. With a loss scaler (Scaler = train::dynamic_loss_scaler, required for fp16) the dlogits
/// are multiplied by S, the global norm is divided by S (unscale, then clip), AdamW multiplies the
/// gradients by clip/S, and a step whose norm is not finite is skipped on every rank (the norm is
/// a tp/pp all-reduce of dp-all-reduced gradients: a NaN or inf on any rank reaches every rank's
/// norm; the decision is also max-reduced over dp, so it holds whatever rounding the dp all-reduce
/// gives each replica) and S backs off — so every rank's scaler takes the same decision at the
/// same step. The learning-rate schedule then follows the optimizer's step count, as in trainer.
///
/// Not here: overlapping the dp reduction with backward (the pipeline executor has no per-layer
/// hook: the dp all-reduce, or ZeRO-1's reduce-scatters, start after the last backward; with
/// ddp_options::overlap the ZeRO-1 buckets' collectives overlap one another and the all-gathers
/// the AdamW of later buckets).
#include <algorithm>
#include <array>
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
#include <loom/nn/gpt_parallel.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/lr_schedule.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/data_parallel.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>

namespace loom::train {

/// The phase a pipeline action's time is charged to: forward and backward compute to forward and
/// backward; the four transfers (whose time is mostly waiting for the neighbouring stage: the
/// pipeline bubble) to exposed_comm.
constexpr phase phase_of(parallel::pipe_op op) noexcept {
  switch (op) {
    case parallel::pipe_op::forward: return phase::forward;
    case parallel::pipe_op::backward: return phase::backward;
    default: return phase::exposed_comm;
  }
}

/// Template arguments: M a models::model_config; Policy a loom::policy whose layout is
/// layout<TP, PP> (parallel::fits<layout, M>() must hold); B, T the micro-batch and sequence
/// capacity; Comm the communicator type (comm::threads, comm::mpi); Attn the attention tag; Scaler
/// train::no_loss_scaler (default) or train::dynamic_loss_scaler (required for fp16), as trainer.
template <models::model_config M, class Policy, int B, int T, class Comm, class Attn = kernels::fused,
          loss_scaler Scaler = no_loss_scaler>
  requires parallel::communicator_for<Comm, float>
class parallel_trainer {
  static_assert(!Policy::precision::needs_loss_scaling || Scaler::enabled,
                "loom::train::parallel_trainer: fp16 needs a loss scaler (half-precision gradients underflow and "
                "overflow without one): use train::parallel_trainer<M, Policy, B, T, Comm, Attn, "
                "train::dynamic_loss_scaler>");

 public:
  using model_t = nn::gpt_parallel<M, Policy, Attn>;
  using device = typename Policy::device;
  using layout = typename Policy::layout;
  using acts_t = typename model_t::template activations<B, T>;
  using acc_t = typename model_t::acc_t;
  using storage_t = typename model_t::storage_t;
  using grad_t = typename model_t::grad_t;
  using scaler_t = Scaler;
  using comm_t = Comm;
  static constexpr int micro_batch = B, seq_len = T, TP = layout::tp, PP = layout::pp;

  /// Splits `world` into the tp, dp and pp groups of layout<TP, PP> (parallel::make_groups;
  /// collective over world, which need not outlive the trainer), then allocates this rank's part
  /// of the model (initialised with cfg.seed exactly as the single-rank model's slices), its
  /// AdamW state and parallel::max_in_flight(PP, grad_accum, stage) activation sets.
  /// cfg.micro_batch and cfg.grad_accum are per dp rank; grad_accum is the pipeline's
  /// micro-batch count m. With ddp.zero1 the AdamW moments are sharded over the dp group (see
  /// the file comment; ddp.bucket_mb and ddp.overlap apply to its buckets; without zero1 `ddp` is
  /// not used): optimizer().first_moment() is empty and data_parallel() holds the shards.
  /// Throws loom::input_error when world.size() is not a multiple of TP*PP, a setting is invalid,
  /// or zero1 is asked for with a precision that keeps fp32 master weights (on every rank alike).
  parallel_trainer(context<device>& ctx, trainer_config cfg, Comm& world, parallel::ddp_options ddp = {})
      : parallel_trainer(ctx, cfg, parallel::make_groups<layout>(world), ddp) {}

  /// As above with groups already made by parallel::make_groups<layout>(world) (moved in).
  parallel_trainer(context<device>& ctx, trainer_config cfg, parallel::groups<Comm> groups,
                   parallel::ddp_options ddp = {})
      : cfg_(checked(cfg)), g_(std::move(groups)), model_(ctx, g_.tp.rank(), g_.pp.rank(), cfg_.seed),
        opt_(ctx, cfg_.adamw, model_), scaler_(cfg_.loss_scaler), inputs_(std::size_t(cfg_.grad_accum) * B * T, ctx.stream),
        targets_(inputs_.size(), ctx.stream), host_in_(inputs_.size()), host_tg_(inputs_.size()),
        plan_(parallel::one_f_one_b(PP, cfg_.grad_accum, g_.pp.rank())) {
    if (g_.tp.size() != TP || g_.pp.size() != PP)
      throw input_error("parallel_trainer: groups of size tp " + std::to_string(g_.tp.size()) + ", pp " +
                        std::to_string(g_.pp.size()) + " for layout<" + std::to_string(TP) + ", " + std::to_string(PP) +
                        ">; make them with parallel::make_groups<layout<" + std::to_string(TP) + ", " +
                        std::to_string(PP) + ">>(world)");
    if (ddp.zero1) {
      if constexpr (optim::adamw<model_t>::has_master) {
        throw input_error("parallel_trainer: ZeRO-1 with " + std::string(Policy::precision::name) +
                          " would need its fp32 master weights sharded too, which is not implemented; use fp32 "
                          "with --zero1, or drop --zero1");
      } else {
        auto engine = std::make_unique<parallel::data_parallel<model_t, Comm>>(ctx, g_.dp, ddp);
        std::array<bool, nn::num_param_tensors> counts{};
        for (int k = 0; k < nn::num_param_tensors; ++k)
          counts[std::size_t(k)] = nn::counts_in_norm<M, layout>(nn::param(k), g_.tp.rank(), g_.pp.rank());
        engine->count_in_norm(counts);
        zero_ = std::move(engine);
        opt_.release_moments();
      }
    }
    const int ring = parallel::max_in_flight(PP, cfg_.grad_accum, g_.pp.rank());
    acts_.reserve(std::size_t(ring));
    for (int i = 0; i < ring; ++i) acts_.emplace_back(ctx);
  }

  /// This rank's part of the model (tp_rank(), stage()); parameters in param_table<M, layout>
  /// order, local shapes. nn::gather_parameters turns them into the single-rank model's.
  model_t& model() noexcept { return model_; }
  const model_t& model() const noexcept { return model_; }
  /// Not copyable or movable: the ZeRO-1 engine keeps a reference to the dp group it holds.
  parallel_trainer(const parallel_trainer&) = delete;
  parallel_trainer& operator=(const parallel_trainer&) = delete;

  /// AdamW over this rank's parameters (moments of the same local shapes; released with ZeRO-1,
  /// whose shards data_parallel() holds; its step() counts the updates either way).
  optim::adamw<model_t>& optimizer() noexcept { return opt_; }
  const optim::adamw<model_t>& optimizer() const noexcept { return opt_; }
  /// Master weights = parameters, after weights were loaded into model() from elsewhere
  /// (nn::load_global_parameters of imported weights). No-op for precisions without master weights.
  void sync_master_weights(context<device>& ctx) { opt_.sync_master_weights(ctx, model_); }
  /// The loss scaler (its state() / set_state() go into checkpoints; identical on every rank).
  Scaler& loss_scaler() noexcept { return scaler_; }
  const Scaler& loss_scaler() const noexcept { return scaler_; }
  /// The settings, with micro_batch and seq_len 0 replaced by the capacities B and T.
  const trainer_config& config() const noexcept { return cfg_; }
  /// The saved-activation ring (max_in_flight(PP, grad_accum, stage) sets of (B, T)).
  std::span<const acts_t> activations() const noexcept { return acts_; }
  /// Bytes of the activation ring.
  std::size_t activation_bytes() const noexcept { return acts_.empty() ? 0 : acts_.size() * acts_.front().bytes(); }

  /// This rank's groups: tp (size TP), dp (size dp_size()), pp (size PP), Megatron rank order.
  parallel::groups<Comm>& groups() noexcept { return g_; }
  Comm& tp_group() noexcept { return g_.tp; }
  Comm& dp_group() noexcept { return g_.dp; }
  Comm& pp_group() noexcept { return g_.pp; }
  /// Tensor-parallel rank in [0, TP), pipeline stage in [0, PP), data-parallel rank and degree.
  int tp_rank() const noexcept { return model_.tp_rank(); }
  int stage() const noexcept { return model_.stage(); }
  int dp_rank() const noexcept { return g_.dp.rank(); }
  int dp_size() const noexcept { return g_.dp.size(); }
  /// The ZeRO-1 engine over the dp group (moment shards, their ranges in this rank's parameter
  /// buffer, memory()), or null without ddp_options::zero1. io::save_checkpoint and
  /// load_checkpoint read and write the shards through it.
  parallel::grad_sync<model_t>* data_parallel() const noexcept { return zero_.get(); }
  /// Bytes of AdamW state this rank holds: the two moments of its cell (1/dp of them with ZeRO-1,
  /// up to the chunks' padding), plus fp32 master weights when the precision keeps them.
  std::size_t optimizer_bytes() const noexcept {
    using opt_t = optim::adamw<model_t>;
    const std::size_t masters = opt_t::has_master ? model_t::num_parameters * sizeof(typename opt_t::master_t) : 0;
    return (zero_ ? zero_->memory().moments : opt_.first_moment().bytes() + opt_.second_moment().bytes()) + masters;
  }

  /// Steps taken, skipped ones included. Without a loss scaler the schedule follows this count
  /// (a skipped step advances it); with one it follows optimizer().step(), as in trainer.
  long step_count() const noexcept { return step_; }
  void set_step_count(long s) noexcept { step_ = s; }

  /// Called at the start (begin = true) and end of every phase inside step() and evaluate():
  /// h2d_copy; each pipeline action as forward, backward or exposed_comm (receives and sends:
  /// the time spent waiting for the neighbouring stage, i.e. the bubble); exposed_comm for the
  /// tied-embedding, dp and norm reductions; optimizer. Phases never nest. Empty by default.
  std::function<void(phase, bool begin)> on_phase;

  /// Windows per step on this dp rank (grad_accum * micro_batch).
  std::size_t windows_per_step() const noexcept { return std::size_t(cfg_.grad_accum) * cfg_.micro_batch; }
  /// Tokens per window: seq_len + 1 (inputs and the shifted targets).
  std::size_t window() const noexcept { return std::size_t(cfg_.seq_len) + 1; }
  /// Target tokens per step on this dp rank (times dp_size() for the global batch).
  std::size_t tokens_per_step() const noexcept { return windows_per_step() * cfg_.seq_len; }

  /// One optimizer step. `windows`: this dp rank's share of the global batch, grad_accum *
  /// micro_batch rows of seq_len+1 token ids (row-major; inputs row[0..seq_len), targets
  /// row[1..seq_len]). Every rank of one tp x pp group passes the same windows (the first stage
  /// reads the inputs, the last the targets). Collective over all groups. Returns the same
  /// step_result on every rank of the world. Throws loom::input_error on a wrong size or an id
  /// outside [0, vocab).
  step_result step(context<device>& ctx, std::span<const std::int32_t> windows) {
    if (windows.size() != windows_per_step() * window())
      throw input_error("a dp rank's share of the global batch needs grad_accum*micro_batch = " +
                        std::to_string(windows_per_step()) + " windows of " + std::to_string(window()) + " tokens (" +
                        std::to_string(windows_per_step() * window()) + " ids), got " + std::to_string(windows.size()));
    validate_tokens(windows, M::vocab, "training batch");
    const std::span<std::int32_t> in(host_in_.data(), tokens_per_step()), tg(host_tg_.data(), tokens_per_step());
    split_windows(windows, in, tg);
    return step(ctx, in, tg);
  }

  /// One optimizer step on explicit inputs and targets of this dp rank, each (grad_accum,
  /// micro_batch, seq_len) int32; targets equal to kernels::ignore_index (-1) add no loss and no
  /// gradient. Throws loom::input_error on wrong sizes, ids outside [0, vocab), or a global batch
  /// whose targets are all ignored.
  step_result step(context<device>& ctx, std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
    const std::size_t n = tokens_per_step();
    if (inputs.size() != n || targets.size() != n)
      throw input_error("inputs and targets of a dp rank's share need grad_accum*micro_batch*seq_len = " +
                        std::to_string(n) + " ids each, got " + std::to_string(inputs.size()) + " and " +
                        std::to_string(targets.size()));
    validate_tokens(inputs, M::vocab, "training inputs");
    std::int64_t count = count_targets(targets, M::vocab);
    g_.dp.all_reduce(std::span<std::int64_t>(&count, 1), parallel::reduce_op::sum);
    if (count == 0)
      throw input_error("every target of the global batch is ignored (-1); the batch holds no tokens to learn from");
    const int b = cfg_.micro_batch, t = cfg_.seq_len, m = cfg_.grad_accum;
    const double loss_scale = scaler_.scale();
    mark(phase::h2d_copy, true);
    device::copy_to_device(inputs_.data(), inputs.data(), inputs.size_bytes(), ctx.stream);
    device::copy_to_device(targets_.data(), targets.data(), targets.size_bytes(), ctx.stream);
    mark(phase::h2d_copy, false);
    model_.zero_grad(ctx);
    // Phase attribution: the executor reports each action after it ran; the schedule is a pure
    // function, so the phase of the next action is known and opened as the previous one closes.
    std::size_t next = 0;
    if (!plan_.empty()) mark(phase_of(plan_[0].op), true);
    auto observe = [&](const parallel::pipe_action& a, double) {
      mark(phase_of(a.op), false);
      if (++next < plan_.size()) mark(phase_of(plan_[next].op), true);
    };
    acc_t loss = nn::pipeline_forward_backward<model_t, B, T>(
        ctx, model_, std::span<acts_t>(acts_), g_.tp, g_.pp, m, inputs_.data(), targets_.data(), b, t,
        acc_t(loss_scale / double(count)), observe);
    mark(phase::exposed_comm, true);
    model_.tie_embedding_gradients(ctx, g_.pp);
    step_result r;
    if (zero_) {  // ZeRO-1: reduce-scatter the buckets; the norm of the owned chunks over dp, tp, pp
      ctx.synchronize();
      if (g_.dp.size() > 1) g_.dp.all_reduce(std::span<acc_t>(&loss, 1), parallel::reduce_op::sum);
      zero_->begin_backward(ctx);
      for (int layer = model_t::L; layer >= -1; --layer) zero_->grads_ready(ctx, model_, layer);
      double sumsq = zero_->finish(ctx, model_, 0.0).grad_sumsq;
      g_.tp.all_reduce(std::span<double>(&sumsq, 1), parallel::reduce_op::sum);
      g_.pp.all_reduce(std::span<double>(&sumsq, 1), parallel::reduce_op::sum);
      r.grad_norm = std::sqrt(sumsq) / loss_scale;  // unscale, then clip
    } else {
      if (g_.dp.size() > 1) {
        ctx.synchronize();
        const auto grads = model_.gradients();
        g_.dp.all_reduce(std::span<grad_t>(grads.data(), grads.size()), parallel::reduce_op::sum);
        g_.dp.all_reduce(std::span<acc_t>(&loss, 1), parallel::reduce_op::sum);
      }
      r.grad_norm = model_.grad_norm(ctx, g_.tp, g_.pp) / loss_scale;  // unscale, then clip
    }
    int overflow = !std::isfinite(r.grad_norm);  // the same on every rank (see the file comment)
    if (g_.dp.size() > 1) g_.dp.all_reduce(std::span<int>(&overflow, 1), parallel::reduce_op::max);
    mark(phase::exposed_comm, false);
    mark(phase::optimizer, true);
    r.tokens = long(count);
    r.loss = double(loss) / double(count);
    r.loss_scale = loss_scale;
    r.lr = cfg_.schedule(Scaler::enabled ? opt_.step() : step_);
    r.warning = scaler_.update(!overflow, step_);
    ++step_;
    if (overflow) {
      r.skipped = true;  // on every rank: parameters, moments (and, with a scaler, the schedule) untouched
    } else if (zero_) {
      const long t = opt_.step() + 1;
      zero_->update(ctx, model_, cfg_.adamw, r.lr,
                    optim::clip_coefficient(r.grad_norm, cfg_.adamw.max_grad_norm) / loss_scale, t);
      opt_.set_step(t);
      ctx.synchronize();
    } else {
      opt_.update(ctx, model_, r.lr, optim::clip_coefficient(r.grad_norm, cfg_.adamw.max_grad_norm) / loss_scale);
      ctx.synchronize();
    }
    mark(phase::optimizer, false);
    return r;
  }

  /// Mean loss (nats/token) over `windows`: rows >= 1 rows of seq_len+1 ids, no update. The
  /// rows run through the pipeline in micro-batches of micro_batch rows, the last one with the
  /// rows that are left (b < micro_batch), so every window counts exactly once: the
  /// token-weighted mean over all of them, the same as train::trainer::evaluate on one rank
  /// whatever the micro-batch (up to fp32 summation order). Collective over the tp and pp
  /// groups; every rank of a tp x pp group passes the same windows and gets the same value; dp
  /// replicas may evaluate different windows or not at all. Throws loom::input_error when
  /// `windows` is empty or not whole windows, or on an id outside [0, vocab) (on every rank alike).
  double evaluate(context<device>& ctx, std::span<const std::int32_t> windows) {
    const int t = cfg_.seq_len;
    const std::size_t w = window();
    if (windows.empty() || windows.size() % w != 0)
      throw input_error("evaluation needs one or more windows of " + std::to_string(w) + " tokens (seq_len + 1), got " +
                        std::to_string(windows.size()) + " ids");
    validate_tokens(windows, M::vocab, "evaluation batch");
    constexpr int tag_activation = 0;  // as the pipeline executor's
    auto& acts = acts_.front();
    const std::size_t rows = windows.size() / w;
    double sum = 0;  // meaningful on the last stage
    for (std::size_t first = 0; first < rows; first += std::size_t(cfg_.micro_batch)) {
      const int b = int(std::min<std::size_t>(std::size_t(cfg_.micro_batch), rows - first));
      const std::size_t bt = std::size_t(b) * t, NC = bt * std::size_t(M::d_model);
      const std::span<std::int32_t> in(host_in_.data(), bt), tg(host_tg_.data(), bt);
      split_windows(windows.subspan(first * w, std::size_t(b) * w), in, tg);
      device::copy_to_device(inputs_.data(), in.data(), in.size_bytes(), ctx.stream);
      device::copy_to_device(targets_.data(), tg.data(), tg.size_bytes(), ctx.stream);
      if (!model_.first_stage()) g_.pp.recv(std::span<storage_t>(acts.input(), NC), stage() - 1, tag_activation);
      sum += double(model_.forward(ctx, acts, g_.tp, inputs_.data(), targets_.data(), b, t));
      if (!model_.last_stage()) {
        ctx.synchronize();
        g_.pp.send(std::span<const storage_t>(acts.output(), NC), stage() + 1, tag_activation);
      }
    }
    ctx.synchronize();
    g_.pp.broadcast(std::span<double>(&sum, 1), PP - 1);
    return sum / double(rows * std::size_t(t));
  }

 private:
  static trainer_config checked(trainer_config c) {
    if (c.micro_batch == 0) c.micro_batch = B;
    if (c.seq_len == 0) c.seq_len = T;
    if (c.micro_batch < 1 || c.micro_batch > B)
      throw input_error("micro-batch size " + std::to_string(c.micro_batch) + " is outside [1, " + std::to_string(B) +
                        "], the capacity this trainer was compiled for; pass --micro-batch <= " + std::to_string(B));
    if (c.seq_len < 1 || c.seq_len > T)
      throw input_error("sequence length " + std::to_string(c.seq_len) + " is outside [1, " + std::to_string(T) +
                        "] (the model " + std::string(M::name) + " has " + std::to_string(M::max_seq) +
                        " positions; this trainer was compiled for " + std::to_string(T) + "); pass --seq-len <= " +
                        std::to_string(T));
    if (c.grad_accum < 1)
      throw input_error("gradient accumulation steps (the pipeline's micro-batches) must be >= 1; pass e.g. --grad-accum " +
                        std::to_string(PP));
    c.schedule.validate();
    return c;
  }
  void mark(phase p, bool begin) {
    if (on_phase) on_phase(p, begin);
  }
  // rows of seq_len+1 ids -> inputs row[0..seq_len), targets row[1..seq_len]
  void split_windows(std::span<const std::int32_t> w, std::span<std::int32_t> in, std::span<std::int32_t> tg) const {
    train::split_windows(w, std::size_t(cfg_.seq_len), in, tg);
  }

  trainer_config cfg_;
  parallel::groups<Comm> g_;
  model_t model_;
  optim::adamw<model_t> opt_;
  Scaler scaler_;
  std::unique_ptr<parallel::grad_sync<model_t>> zero_;  // ZeRO-1 over g_.dp (data_parallel), or null
  std::vector<acts_t> acts_;
  buffer<device, std::int32_t> inputs_, targets_;
  std::vector<std::int32_t> host_in_, host_tg_;
  std::vector<parallel::pipe_action> plan_;
  long step_ = 0;
};

}  // namespace loom::train
