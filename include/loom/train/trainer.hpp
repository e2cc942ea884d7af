#pragma once
/// \file loom::train::trainer: one optimizer step of a model on every layout — one rank,
/// data parallel, tensor and pipeline parallel (Megatron-LM's 3D parallelism: Shoeybi et al.
/// 2019; Narayanan et al. 2021 §2), ZeRO-1, fp32/bf16/fp16:
///   train::trainer<M, Policy, B, T>        layout<1,1> on one rank; data parallel by passing the
///                                          dp communicator to the constructor
///   train::trainer<M, Policy, B, T, Comm>  any layout<TP,PP> over a world communicator of type
///                                          Comm, data parallel over the ranks beyond TP*PP
///
/// A global batch is dp * grad_accum micro-batches of micro_batch windows of seq_len+1 tokens.
/// One step, on every rank (ranks ordered tp fastest, then dp, then pp; parallel::make_groups):
///   1. validate the token ids; count the non-ignored targets of this dp rank's share and sum
///      the count over the dp group (every rank scales by the global count, so the loss is the
///      mean over the global batch whatever the micro-batch count);
///   2. zero gradients; forward/backward of grad_accum micro-batches in the 1F1B order of the
///      pipeline group (parallel::pipeline_forward_backward; PP = 1: forward, backward per
///      micro-batch), TP collectives inside each layer; during the last micro-batch's backward
///      the model's ready(layer) events start the dp reduction of the finished buckets
///      (parallel/data_parallel.hpp), so it overlaps the backward on every layout;
///   3. sum a tied embedding's two copies (first and last stage), then reduce its bucket;
///   4. wait for the buckets (all-reduce, or ZeRO-1's reduce-scatter); the squared norm of this
///      rank's chunks of the rows that count on it (models::counts_in_norm), summed over dp, then
///      tp, then pp: every element of the unsharded model once, the same number on every rank;
///   5. skip the update on every rank if the norm is not finite; clip; AdamW (ZeRO-1: the sharded
///      optimizer on the owned chunks, bucket by bucket, each bucket's parameters all-gathered
///      over dp while the next one updates).
/// With trainer_config::dropout > 0, micro-batch i of dp rank r in step s trains with the masks
/// of dropout_key(seed, s, r * grad_accum + i) (nn/dropout.hpp): the same on every layout and
/// after a resume; evaluate() runs without dropout.
/// The loss, gradient norm and update equal one rank's on the whole global batch up to fp32
/// summation order.
///
/// ZeRO-1 (ddp_options::zero1; Rajbhandari et al., arXiv:1910.02054, stage 1): buckets padded to
/// dp equal chunks; the optimizer is optim::zero1 (zero1_optimizer()), whose moments and, with
/// bf16/fp16, fp32 master weights exist only for the owned chunks: (2 + masters)/dp of the cell's
/// optimizer state. Its update writes the owned parameters (the masters' rounding, cast once);
/// data_parallel() all-gathers the parameters in the storage type. optimizer() (optim::adamw)
/// then holds no state; its step() still counts the updates.
///
/// Mixed precision (docs/precision.md): bf16/fp16 parameters and activations, fp32 parameter
/// gradients (model grad_t), fp32 master weights and moments in AdamW; activation messages of
/// TP/PP travel in the storage type, their reductions sum in fp32. With a loss scaler (Scaler =
/// precision::dynamic_loss_scaler, required for fp16) the dlogits are multiplied by S, the global
/// norm is divided by S (unscale, then clip), AdamW multiplies the gradients by clip/S, and a
/// step whose norm is not finite is skipped on every rank (the norm is reduced over every
/// group, so every rank sees the same value and its scaler takes the same decision) and S
/// backs off; the learning-rate schedule then follows the optimizer's step count.
///
/// Optimizer offload (trainer_config::offload_optimizer; ZeRO-Offload, arXiv:2101.06840): the
/// optimizer is optim::offload_adamw (offload_optimizer()), whose masters and moments live in
/// pinned host memory and whose update streams the gradients to the host and the parameters back
/// in chunks; optimizer() then holds no state and counts the steps. With offload_overlap (the
/// default) the update runs beside the next step's forward, whose layers wait for their own
/// parameters (nn::transformer::before_layer -> offload_adamw::await_layer); every accessor of
/// the state (model(), offload_optimizer(), checkpoint_state, evaluate) waits for it first.
/// Devices with a transfer stream only (device::ascend); not with ZeRO-1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/lr_schedule.hpp>
#include <loom/optim/offload.hpp>
#include <loom/optim/zero1.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/data_parallel.hpp>
#include <loom/parallel/scalars.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/train/checkpoint_state.hpp>
#include <loom/precision/loss_scaler.hpp>
#include <loom/train/memory_plan.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/step.hpp>

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
/// layout<TP, PP> (models::fits<layout, M>() must hold); B, T the micro-batch and sequence
/// capacity; Comm the communicator type of the groups (comm::threads, comm::mpi, comm::hccl),
/// or parallel::local_group (the default) for the layout<1,1> trainer whose data-parallel
/// communicator type is erased; Attn the attention tag; Scaler precision::no_loss_scaler (default) or
/// precision::dynamic_loss_scaler (required for fp16).
template <models::model_config M, class Policy, int B, int T, class Comm = parallel::local_group,
          class Attn = kernels::fused, precision::loss_scaler Scaler = precision::no_loss_scaler>
class trainer {
  static_assert(!Policy::precision::needs_loss_scaling || Scaler::enabled,
                "loom::train::trainer: fp16 needs a loss scaler (half-precision gradients underflow and "
                "overflow without one): use train::trainer<M, Policy, B, T, Comm, Attn, "
                "precision::dynamic_loss_scaler>");
  static constexpr bool local = std::is_same_v<Comm, parallel::local_group>;

 public:
  using model_t = nn::transformer<M, Policy, Attn>;
  using device = typename Policy::device;
  using layout = typename Policy::layout;
  using acts_t = typename model_t::template activations<B, T>;
  using acc_t = typename model_t::acc_t;
  using storage_t = typename model_t::storage_t;
  using grad_t = typename model_t::grad_t;
  using scaler_t = Scaler;
  using comm_t = Comm;
  static constexpr int micro_batch = B, seq_len = T, TP = layout::tp, PP = layout::pp;
  /// A device with a copy engine (device::ascend) receives the batch windows as they are, on a
  /// copy stream, and splits them into inputs and targets itself; the CPU splits on the host.
  static constexpr bool device_split = requires { typename device::copy_engine; };
  /// On a device that reads the loss back (not the CPU) whose cross-entropy can copy the per-token
  /// losses out without a wait (TP = 1, PP = 1), a step without data parallelism reads them
  /// together with the gradient norm: one host wait per step instead of two.
  static constexpr bool deferred_loss =
      !std::is_same_v<device, loom::device::cpu> && TP == 1 && PP == 1 &&
      requires(context<device>& c, storage_t* p, acc_t* a, const std::int32_t* t) {
        model_t::ops::crossentropy(c, p, a, t, 1, 1, 1, true, acc_t(1), a);
      };
  /// The offloaded optimizer's type (optim::offload_adamw) on a device that can stream it, else
  /// an empty stand-in (trainer_config::offload_optimizer is refused there).
  struct no_offload {};
  using offload_t = std::conditional_t<optim::can_offload_v<device>, optim::offload_adamw<model_t>, no_offload>;
  static_assert(!local || (TP == 1 && PP == 1),
                "loom::train::trainer runs the whole model on each rank (layout<1,1>, data parallel on top); "
                "for layout<TP,PP> use train::trainer<M, Policy, B, T, Comm> with a world communicator");

  /// One rank: allocates the model (initialised with cfg.seed), the optimizer state and the
  /// activation table. Throws loom::input_error for invalid settings.
  trainer(context<device>& ctx, trainer_config cfg)
    requires local
      : trainer(ctx, cfg, parallel::groups<Comm>{}, 0) {}

  /// Data parallel on layout<1,1> over the group `dp` (every rank of it constructs one, with the
  /// same cfg; dp must outlive the trainer). cfg.micro_batch and grad_accum are per rank. With
  /// ddp.zero1 the optimizer state is sharded over dp (optimizer() holds none; the shards live
  /// in zero1_optimizer()). Throws loom::input_error for invalid settings.
  template <class DpComm>
    requires(local && parallel::communicator_for<DpComm, float>)
  trainer(context<device>& ctx, trainer_config cfg, DpComm& dp, parallel::ddp_options ddp = {})
      : trainer(ctx, cfg, parallel::groups<Comm>{}, 0) {
    attach(ctx, std::make_unique<parallel::data_parallel<model_t, DpComm>>(ctx, dp, ddp), ddp);
  }

  /// Splits `world` into the tp, dp and pp groups of layout<TP, PP> (parallel::make_groups;
  /// collective over world, which need not outlive the trainer), then allocates this rank's part
  /// of the model (initialised with cfg.seed exactly as the single-rank model's slices), its
  /// AdamW state and parallel::max_in_flight(PP, grad_accum, stage) activation sets.
  /// cfg.micro_batch and cfg.grad_accum are per dp rank; grad_accum is the pipeline's
  /// micro-batch count m. With more than one dp rank (or ddp.zero1) the gradients are reduced
  /// over dp by parallel::data_parallel with `ddp`'s buckets. Throws loom::input_error when
  /// world.size() is not a multiple of TP*PP or a setting is invalid (on every rank alike).
  trainer(context<device>& ctx, trainer_config cfg, Comm& world, parallel::ddp_options ddp = {})
    requires(!local)
      : trainer(ctx, cfg, parallel::make_groups<layout>(world), ddp) {}

  /// As above with groups already made by parallel::make_groups<layout>(world) (moved in).
  trainer(context<device>& ctx, trainer_config cfg, parallel::groups<Comm> groups, parallel::ddp_options ddp = {})
    requires(!local)
      : trainer(ctx, cfg, std::move(groups), 0) {
    if (g_.tp.size() != TP || g_.pp.size() != PP)
      throw input_error("train::trainer: groups of size tp " + std::to_string(g_.tp.size()) + ", pp " +
                        std::to_string(g_.pp.size()) + " for layout<" + std::to_string(TP) + ", " + std::to_string(PP) +
                        ">; make them with parallel::make_groups<layout<" + std::to_string(TP) + ", " +
                        std::to_string(PP) + ">>(world)");
    if (g_.dp.size() > 1 || ddp.zero1) {
      auto engine = std::make_unique<parallel::data_parallel<model_t, Comm>>(ctx, g_.dp, ddp);
      if constexpr (TP > 1 || PP > 1) engine->count_in_norm(model_.tp_rank(), model_.stage());  // rows this rank owns
      attach(ctx, std::move(engine), ddp);
    }
  }

  /// The bytes a trainer of this type allocates on one rank (train::memory_plan), computed from
  /// the tables it allocates from, without allocating: cfg as given to the constructor; dp_size
  /// and dp_rank, the data-parallel group and this rank's place in it; stage, the pipeline stage
  /// (its activation tables: parallel::max_in_flight(PP, grad_accum, stage)); ddp, the options of
  /// the data-parallel engine (buckets; with zero1 the optimizer state sharded), or null without
  /// one — a trainer has one when built with a dp group on layout<1,1>, and on a TP x PP layout
  /// when dp_size > 1 or ZeRO-1. Throws loom::input_error for the settings the constructor refuses.
  static memory_plan plan(trainer_config cfg, int dp_size, int dp_rank, int stage, const parallel::ddp_options* ddp) {
    cfg = checked(cfg);
    if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size || stage < 0 || stage >= PP)
      throw input_error("memory plan: dp rank " + std::to_string(dp_rank) + " of " + std::to_string(dp_size) + ", stage " +
                        std::to_string(stage) + " of " + std::to_string(PP) + " is not a rank of the layout");
    constexpr std::size_t N = model_t::num_parameters;
    memory_plan p;
    p.parameters = N * sizeof(storage_t);
    p.gradients = N * sizeof(grad_t);
    std::size_t state = N;  // elements of each moment and of the master copy
    if (ddp) {
      const auto d = parallel::bucket_plan<model_t>::memory_of(std::size_t(dp_size), std::size_t(dp_rank), *ddp);
      p.buckets = d.buckets;
      if (ddp->zero1) state = d.shard_elements;
    }
    using master_t = typename optim::adamw<model_t>::master_t;
    if (cfg.offload_optimizer) {
      check_offload(cfg, ddp);
      if constexpr (optim::can_offload_v<device>) p.host_optimizer = offload_t::host_bytes_of(N, cfg.offload_chunk);
    } else {
      p.moments = 2 * state * sizeof(master_t);
      p.master_weights = optim::adamw<model_t>::has_master ? state * sizeof(master_t) : 0;
    }
    const auto a = acts_t::sizes_of(cfg.recompute);
    p.activations = std::size_t(parallel::max_in_flight(PP, cfg.grad_accum, stage)) *
                    (a.storage_total * sizeof(storage_t) + a.acc_total * sizeof(acc_t));
    return p;
  }

  /// Not copyable or movable: the data-parallel engine keeps a reference to the dp group.
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// This rank's part of the model (tp_rank(), stage()); parameters in param_table<M, layout>
  /// order, local shapes. nn::gather_parameters turns them into the single-rank model's. Waits
  /// for an overlapped offloaded update first (its parameters are then on the device).
  model_t& model() {
    settle();
    return model_;
  }
  const model_t& model() const {
    settle();
    return model_;
  }
  /// AdamW over this rank's parameters (moments and masters of the same local shapes; empty with
  /// ZeRO-1, whose state zero1_optimizer() holds). Its step() counts the updates either way and
  /// is the step count both optimizers use: set it to resume.
  optim::adamw<model_t>& optimizer() noexcept { return opt_; }
  const optim::adamw<model_t>& optimizer() const noexcept { return opt_; }
  /// With ZeRO-1, the sharded optimizer (this dp rank's moments and, below fp32, master weights,
  /// laid out by its ranges()); null otherwise.
  optim::zero1<model_t>* zero1_optimizer() noexcept { return zero_.get(); }
  const optim::zero1<model_t>* zero1_optimizer() const noexcept { return zero_.get(); }
  /// With trainer_config::offload_optimizer, the offloaded optimizer (masters and moments in
  /// pinned host memory: optim::offload_adamw), its overlapped update waited for; null otherwise.
  offload_t* offload_optimizer() {
    settle();
    return offload_.get();
  }
  const offload_t* offload_optimizer() const {
    settle();
    return offload_.get();
  }
  /// Master weights = parameters, after weights were loaded into model() from elsewhere
  /// (io::import_gpt2, nn::load_global_parameters). No-op for precisions without master weights.
  void sync_master_weights(context<device>& ctx) {
    opt_.sync_master_weights(ctx, model_);
    if (zero_) zero_->sync_master_weights(ctx, model_);
    if constexpr (optim::can_offload_v<device>)
      if (offload_) offload_->sync_master_weights(ctx, model_);
  }
  /// The loss scaler (its state() / set_state() go into checkpoints; identical on every rank).
  Scaler& loss_scaler() noexcept { return scaler_; }
  const Scaler& loss_scaler() const noexcept { return scaler_; }
  /// The settings, with micro_batch and seq_len 0 replaced by the capacities B and T.
  const trainer_config& config() const noexcept { return cfg_; }
  /// The saved-activation ring (max_in_flight(PP, grad_accum, stage) sets of (B, T); one at PP = 1).
  std::span<const acts_t> activations() const noexcept { return acts_; }
  /// Bytes of the activation ring.
  std::size_t activation_bytes() const noexcept { return acts_.empty() ? 0 : acts_.size() * acts_.front().bytes(); }

  /// This rank's groups: tp (size TP), dp, pp (size PP), Megatron rank order (one-rank
  /// parallel::local_groups for train::trainer, whose dp communicator lives in data_parallel()).
  parallel::groups<Comm>& groups() noexcept { return g_; }
  Comm& tp_group() noexcept { return g_.tp; }
  Comm& dp_group() noexcept { return g_.dp; }
  Comm& pp_group() noexcept { return g_.pp; }
  /// Tensor-parallel rank in [0, TP), pipeline stage in [0, PP), data-parallel rank and degree.
  int tp_rank() const noexcept { return model_.tp_rank(); }
  int stage() const noexcept { return model_.stage(); }
  int dp_rank() const noexcept { return sync_ ? sync_->rank() : 0; }
  int dp_size() const noexcept { return sync_ ? sync_->size() : 1; }
  /// The data-parallel engine (buckets, the ZeRO-1 shard ranges in this rank's parameter
  /// buffer, memory()), or null on one data-parallel rank.
  parallel::grad_sync<model_t>* data_parallel() const noexcept { return sync_.get(); }
  /// Bytes of optimizer state this rank holds: the two AdamW moments of its cell plus fp32
  /// master weights when the precision keeps them; with ZeRO-1 all three for the owned chunks
  /// only (1/dp of them, up to the chunks' padding). 0 with optimizer offload.
  std::size_t optimizer_bytes() const noexcept { return zero_ ? zero_->bytes() : opt_.bytes(); }
  /// Pinned host bytes of the offloaded optimizer (optim::offload_adamw::host_bytes()); 0 without.
  std::size_t host_optimizer_bytes() const noexcept {
    if constexpr (optim::can_offload_v<device>) return offload_ ? offload_->host_bytes() : 0;
    else return 0;
  }

  /// Steps taken, skipped ones included. Without a loss scaler the schedule follows this count
  /// (a skipped step advances it); with one it follows optimizer().step().
  long step_count() const noexcept { return step_; }
  void set_step_count(long s) noexcept { step_ = s; }

  /// This rank's state as io checkpoints it (io/checkpoint/state.hpp): parameters, master
  /// weights, AdamW moments or their ZeRO-1 shards, steps, loss scaler, configuration. The
  /// view points into this trainer's buffers; io::load_checkpoint writes through it.
  io::state_view checkpoint_state(context<device>& ctx) const { return detail::state_view_of(ctx, *this); }
  /// Applies what io::load_checkpoint restored besides tensors: step count, optimizer step (of
  /// both optimizers), loss scaler state (when given).
  void restore(const io::restored_scalars& r) {
    step_ = r.step;
    opt_.set_step(r.optimizer_step);
    if (zero_) zero_->set_step(r.optimizer_step);
    if (r.scaler) scaler_.set_state(*r.scaler);
  }

  /// Called at the start (begin = true) and end of every phase inside step():
  /// h2d_copy (the step's micro-batches at once); each pipeline action as forward, backward or
  /// exposed_comm (receives and sends: the time spent waiting for the neighbouring stage, i.e.
  /// the bubble); exposed_comm for the tied-embedding, dp and norm reductions left after
  /// backward (none on one rank of layout<1,1>: its norm is part of the optimizer phase);
  /// optimizer. Phases never nest.
  /// Empty by default (then the executor is not timed at all).
  std::function<void(phase, bool begin)> on_phase;
  /// Set when on_phase drives a device clock (stream events: train::ascend_phase_timer): the
  /// pipeline's actions and the optimizer are then reported as enqueued, without a stream
  /// synchronize after each (what a host clock needs to charge the device work to its phase).
  bool device_clock = false;

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
  /// step_result on every rank. Throws loom::input_error on a wrong size or an id outside
  /// [0, vocab).
  /// On a device with a copy engine (device::ascend) the windows go to the device as they are,
  /// on the copy stream: from pinned host memory (data::loader's buffers, D::allocate_host) the
  /// copy is asynchronous and runs beside the previous step's optimizer, then the NPU splits
  /// them (kernels::ascend::split_windows); `windows` may be reused when step() returns.
  step_result step(context<device>& ctx, std::span<const std::int32_t> windows) {
    if (windows.size() != windows_per_step() * window())
      throw input_error("a step needs grad_accum*micro_batch = " + std::to_string(windows_per_step()) +
                        " windows of " + std::to_string(window()) + " tokens (" +
                        std::to_string(windows_per_step() * window()) + " ids) per data-parallel rank, got " +
                        std::to_string(windows.size()));
    validate_tokens(windows, M::vocab, "training batch");
    if constexpr (device_split) {
      const long count = long(tokens_per_step());  // validated ids: no target is ignored
      return run_step(ctx, count, [&] {
        copier_.copy_to_device(ctx, windows_.data(), windows.data(), windows.size_bytes());
        model_t::ops::split_windows(ctx, windows_.data(), inputs_.data(), targets_.data(), int(windows_per_step()),
                                    cfg_.seq_len);
        copier_.release(ctx);  // the next copy may overwrite windows_ once the split has read it
      });
    } else {
      const std::span<std::int32_t> in(host_in_.get(), tokens_per_step()), tg(host_tg_.get(), tokens_per_step());
      split_windows(windows, in, tg);
      return step(ctx, in, tg);
    }
  }

  /// One optimizer step on explicit inputs and targets of this dp rank, each (grad_accum,
  /// micro_batch, seq_len) int32; targets equal to kernels::ignore_index (-1) add no loss and no
  /// gradient. Throws loom::input_error on wrong sizes, ids outside [0, vocab), or a global batch
  /// whose targets are all ignored.
  step_result step(context<device>& ctx, std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
    const std::size_t n = tokens_per_step();
    if (inputs.size() != n || targets.size() != n)
      throw input_error("inputs and targets of a step need grad_accum*micro_batch*seq_len = " + std::to_string(n) +
                        " ids each per data-parallel rank, got " + std::to_string(inputs.size()) + " and " +
                        std::to_string(targets.size()));
    validate_tokens(inputs, M::vocab, "training inputs");
    return run_step(ctx, count_targets(targets, M::vocab), [&] {
      device::copy_to_device(inputs_.data(), inputs.data(), inputs.size_bytes(), ctx.stream);
      device::copy_to_device(targets_.data(), targets.data(), targets.size_bytes(), ctx.stream);
    });
  }

 private:
  /// Both step()s from here: `count` non-ignored targets on this dp rank; `upload()` enqueues the
  /// batch into inputs_ and targets_.
  template <class Upload>
  step_result run_step(context<device>& ctx, long count, Upload&& upload) {
    if (sync_) count = sync_->global_sum(count);  // every rank scales by the global count
    if (count == 0)
      throw input_error("every target of the global batch is ignored (-1); the batch holds no tokens to learn from");
    const double loss_scale = scaler_.scale();
    mark(phase::h2d_copy, true);
    upload();
    mark(phase::h2d_copy, false);
    if (!offload_pending()) model_.zero_grad(ctx);  // else the overlapped update zeroes them once downloaded
    if (sync_) sync_->begin_backward(ctx);
    acc_t* host_losses = host_losses_ && !sync_ ? host_losses_.get() : nullptr;  // read with the norm
    const double loss = forward_backward(ctx, acc_t(loss_scale / double(count)), host_losses);
    // the reductions after backward are exposed communication; one rank's norm is the optimizer's
    const phase reduce = sync_ || TP > 1 || PP > 1 ? phase::exposed_comm : phase::optimizer;
    mark(reduce, true);
    model_.tie_embedding_gradients(ctx, g_.pp);
    step_result r;
    double loss_sum = loss, sumsq = 0;
    if (sync_) {  // the embedding's bucket, then every bucket's reduction is waited for
      sync_->grads_ready(ctx, model_, -1);
      const auto s = sync_->finish(ctx, model_, loss);
      loss_sum = s.loss_sum;
      sumsq = s.grad_sumsq;
    } else if constexpr (TP == 1 && PP == 1) {
      const auto g = model_.gradients();
      sumsq = model_t::ops::sum_of_squares(ctx, g.data(), g.size());  // synchronizes: the losses are in
      if (host_losses)
        loss_sum = parallel::host_loss_sum(host_losses, cfg_.grad_accum, std::size_t(cfg_.micro_batch) * cfg_.seq_len);
    } else {
      sumsq = model_.local_grad_sum_of_squares(ctx);
    }
    if constexpr (TP > 1) sumsq = parallel::sum_over(ctx, g_.tp, sumsq);  // Note [host scalars]
    if constexpr (PP > 1) sumsq = parallel::sum_over(ctx, g_.pp, sumsq);
    r.grad_norm = std::sqrt(sumsq) / loss_scale;  // unscale, then clip
    if (reduce == phase::exposed_comm) {
      mark(phase::exposed_comm, false);
      mark(phase::optimizer, true);
    }
    const bool finite = std::isfinite(r.grad_norm);  // the same on every rank: reduced over every group
    r.tokens = count;
    r.loss = loss_sum / double(count);
    r.loss_scale = loss_scale;
    r.lr = cfg_.schedule(Scaler::enabled ? opt_.step() : step_);
    r.warning = scaler_.update(finite, step_);
    ++step_;
    const double coef = optim::clip_coefficient(r.grad_norm, cfg_.adamw.max_grad_norm) / loss_scale;
    if (!finite) {
      r.skipped = true;  // on every rank: parameters, moments (and, with a scaler, the schedule) untouched
    } else if (zero_) {  // the sharded update, bucket by bucket, each bucket all-gathered after it
      const long t = opt_.step() + 1;
      sync_->gather_parameters(ctx, model_, [&](const parallel::grad_block<grad_t>& g) {
        zero_->update_block(ctx, model_, g, r.lr, coef, t);
      });
      zero_->set_step(t);
      opt_.set_step(t);
      if (on_phase && !device_clock) ctx.synchronize();
    } else if (offload_) {
      if constexpr (optim::can_offload_v<device>) {
        const long t = opt_.step() + 1;
        if (cfg_.offload_overlap) offload_->update_overlapped(ctx, model_, r.lr, coef, t);
        else offload_->update(ctx, model_, r.lr, coef, t);
        opt_.set_step(t);
      }
      if (on_phase && !device_clock) ctx.synchronize();
    } else {
      opt_.update(ctx, model_, r.lr, coef);
      if (on_phase && !device_clock) ctx.synchronize();  // the host clock's optimizer phase
    }
    mark(phase::optimizer, false);
    if (sync_) {
      if (sync_->options().check_every > 0) settle();  // it reads the parameters
      sync_->check_replicas(ctx, model_, step_);
    }
    if constexpr (device_split) copier_.wait_source_read();  // done already: the norm's readback waited
    return r;
  }

 public:
  /// Mean loss (nats/token) over `windows`: one or more rows of seq_len+1 ids (row-major), no
  /// update. The rows run through the pipeline in micro-batches of micro_batch rows, the last
  /// one with the rows that are left (b < micro_batch), so every window counts exactly once: the
  /// token-weighted mean over all of them (the sum of the per-token losses over rows * seq_len
  /// targets), whatever the micro-batch, up to fp32 summation order. Collective over the tp and
  /// pp groups; every rank of a tp x pp group passes the same windows and gets the same value;
  /// dp replicas may evaluate different windows or not at all. Throws loom::input_error when
  /// `windows` is empty or not whole windows, or on an id outside [0, vocab) (on every rank alike).
  double evaluate(context<device>& ctx, std::span<const std::int32_t> windows) {
    const int t = cfg_.seq_len;
    const std::size_t w = window();
    if (windows.empty() || windows.size() % w != 0)
      throw input_error("evaluation needs one or more windows of " + std::to_string(w) + " tokens (seq_len + 1), got " +
                        std::to_string(windows.size()) + " ids");
    validate_tokens(windows, M::vocab, "evaluation batch");
    settle();
    constexpr int tag_activation = 0;  // as the pipeline executor's
    auto& acts = acts_.front();
    const std::size_t rows = windows.size() / w;
    double sum = 0;  // meaningful on the last stage
    for (std::size_t first = 0; first < rows; first += std::size_t(cfg_.micro_batch)) {
      const int b = int(std::min<std::size_t>(std::size_t(cfg_.micro_batch), rows - first));
      const std::size_t bt = std::size_t(b) * t, NC = bt * std::size_t(M::d_model);
      const std::span<std::int32_t> in(host_in_.get(), bt), tg(host_tg_.get(), bt);
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
    if constexpr (PP > 1) sum = parallel::broadcast_from(ctx, g_.pp, sum, PP - 1);
    return sum / double(rows * std::size_t(t));
  }

 private:
  /// The shared part of every constructor (the int tag only selects it).
  trainer(context<device>& ctx, trainer_config cfg, parallel::groups<Comm>&& groups, int)
      : cfg_(checked(cfg)), g_(std::move(groups)), model_(ctx, g_.tp.rank(), g_.pp.rank(), cfg_.seed),
        opt_(cfg_.offload_optimizer ? optim::adamw<model_t>(cfg_.adamw) : optim::adamw<model_t>(ctx, cfg_.adamw, model_)),
        offload_(make_offload(ctx, cfg_, model_)), scaler_(cfg_.loss_scaler), inputs_(std::size_t(cfg_.grad_accum) * B * T, ctx.stream),
        targets_(inputs_.size(), ctx.stream), host_in_(pinned<std::int32_t>(inputs_.size())),
        host_tg_(pinned<std::int32_t>(inputs_.size())),
        host_losses_(deferred_loss ? pinned<acc_t>(std::size_t(cfg_.grad_accum) * parallel::host_loss_stride(std::size_t(B) * T))
                                   : host_buffer<acc_t>()),
        windows_(device_split ? std::size_t(cfg_.grad_accum) * B * (T + 1) : 0, ctx.stream), copier_(ctx),
        plan_(parallel::one_f_one_b(PP, cfg_.grad_accum, g_.pp.rank())) {
    const int ring = parallel::max_in_flight(PP, cfg_.grad_accum, g_.pp.rank());
    acts_.reserve(std::size_t(ring));
    for (int i = 0; i < ring; ++i) acts_.emplace_back(ctx, cfg_.recompute);
    if constexpr (optim::can_offload_v<device>)
      if (offload_ && cfg_.offload_overlap)
        model_.before_layer = [o = offload_.get()](context<device>& c, int layer) { o->await_layer(c, layer); };
  }

  /// Installs the data-parallel engine; with ZeRO-1 the sharded optimizer over its ranges takes
  /// the place of the unsharded state (released).
  void attach(context<device>& ctx, std::unique_ptr<parallel::grad_sync<model_t>> engine, const parallel::ddp_options& ddp) {
    check_offload(cfg_, &ddp);
    if (ddp.zero1) {
      zero_ = std::make_unique<optim::zero1<model_t>>(ctx, cfg_.adamw, model_, engine->shard_ranges());
      opt_.release();
    }
    sync_ = std::move(engine);
  }

  /// Step 2: the pipeline's forward/backward over grad_accum micro-batches; the last
  /// micro-batch's backward reports ready(layer) for layers L..0 to the data-parallel engine
  /// (ready(-1), the embedding, waits for the tied-embedding sum). Returns the loss sum of this
  /// dp rank's share (on every stage).
  double forward_backward(context<device>& ctx, acc_t grad_scale, acc_t* host_losses) {
    const int b = cfg_.micro_batch, t = cfg_.seq_len, m = cfg_.grad_accum;
    auto ready = [&](int layer) {
      if (sync_ && layer >= 0) sync_->grads_ready(ctx, model_, layer);
    };
    // masks keyed by (seed, step, global micro-batch): dp rank r's micro-batch i is r*m + i
    const nn::dropout_plan drop{cfg_.dropout, cfg_.seed, std::uint64_t(step_), std::uint64_t(dp_rank()) * std::uint64_t(m)};
    if (!on_phase)
      return parallel::pipeline_forward_backward<model_t, B, T>(ctx, model_, std::span<acts_t>(acts_), g_.tp, g_.pp, m,
                                                          inputs_.data(), targets_.data(), b, t, grad_scale,
                                                          parallel::no_observer{}, ready, drop, host_losses, plan_);
    // Phase attribution: the executor reports each action after it ran; the schedule is a pure
    // function, so the phase of the next action is known and opened as the previous one closes.
    std::size_t next = 0;
    if (!plan_.empty()) mark(phase_of(plan_[0].op), true);
    auto observe = [&](const parallel::pipe_action& a, double) {
      mark(phase_of(a.op), false);
      if (++next < plan_.size()) mark(phase_of(plan_[next].op), true);
    };
    if constexpr (!std::is_same_v<device, loom::device::cpu>)  // the CPU's clock is the host's
      if (device_clock)
        return parallel::pipeline_forward_backward<model_t, B, T>(ctx, model_, std::span<acts_t>(acts_), g_.tp, g_.pp, m,
                                                            inputs_.data(), targets_.data(), b, t, grad_scale,
                                                            parallel::device_clock_observer<decltype(observe)>{observe},
                                                            ready, drop, host_losses, plan_);
    return parallel::pipeline_forward_backward<model_t, B, T>(ctx, model_, std::span<acts_t>(acts_), g_.tp, g_.pp, m,
                                                        inputs_.data(), targets_.data(), b, t, grad_scale, observe, ready,
                                                        drop, host_losses, plan_);
  }

  /// The offloaded optimizer when cfg asks for it (cfg is checked), else null.
  static std::unique_ptr<offload_t> make_offload(context<device>& ctx, const trainer_config& cfg, const model_t& model) {
    if constexpr (optim::can_offload_v<device>)
      if (cfg.offload_optimizer) return std::make_unique<offload_t>(ctx, cfg.adamw, model, cfg.offload_chunk);
    return nullptr;
  }
  /// Refuses optimizer offload with ZeRO-1 (ddp, when given, the data-parallel options).
  static void check_offload(const trainer_config& c, const parallel::ddp_options* ddp) {
    if (c.offload_optimizer && ddp && ddp->zero1)
      throw input_error("--offload-optimizer with --zero1: the offloaded optimizer holds the whole state, not a ZeRO-1 "
                        "shard; drop --zero1 (offload already moves the optimizer state off the device) or drop "
                        "--offload-optimizer");
  }
  static trainer_config checked(trainer_config c) {
    if (c.micro_batch == 0) c.micro_batch = B;
    if (c.seq_len == 0) c.seq_len = T;
    if (c.micro_batch < 1 || c.micro_batch > B)
      throw input_error("micro-batch size " + std::to_string(c.micro_batch) + " is outside [1, " + std::to_string(B) +
                        "], the capacity this trainer was compiled for; pass --micro-batch <= " + std::to_string(B) +
                        " or compile a larger capacity");
    if (c.seq_len < 1 || c.seq_len > T)
      throw input_error("sequence length " + std::to_string(c.seq_len) + " is outside [1, " + std::to_string(T) +
                        "] (the model " + std::string(M::name) + " has " + std::to_string(M::max_seq) +
                        " positions; this trainer was compiled for " + std::to_string(T) + "); pass --seq-len <= " +
                        std::to_string(T));
    if (c.grad_accum < 1)
      throw input_error("gradient accumulation steps (the pipeline's micro-batches) must be >= 1; pass e.g. --grad-accum " +
                        std::to_string(PP));
    c.schedule.validate();
    check_dropout_probability(c.dropout, "dropout (--dropout)");
    model_t::check_dropout({c.dropout, 0});  // refuses p > 0 where dropout is not implemented
    if (c.offload_optimizer) {
      if constexpr (!optim::can_offload_v<device>)
        throw input_error("--offload-optimizer on device " + std::string(device::name) +
                          ": the optimizer state is in host memory already; drop --offload-optimizer (it moves "
                          "the state off an NPU: --device ascend)");
      else
        offload_t::check_chunk(c.offload_chunk);
    }
    return c;
  }
  void mark(phase p, bool begin) {
    if (on_phase) on_phase(p, begin);
  }
  /// Whether an overlapped offloaded update is still in flight (optim::offload_adamw::pending).
  bool offload_pending() const noexcept {
    if constexpr (optim::can_offload_v<device>) return offload_ && offload_->pending();
    else return false;
  }
  /// Waits for an overlapped offloaded update: host state final, parameters on the device.
  void settle() const {
    if constexpr (optim::can_offload_v<device>)
      if (offload_) offload_->wait();
  }
  // rows of seq_len+1 ids -> inputs row[0..seq_len), targets row[1..seq_len]
  void split_windows(std::span<const std::int32_t> w, std::span<std::int32_t> in, std::span<std::int32_t> tg) const {
    train::split_windows(w, std::size_t(cfg_.seq_len), in, tg);
  }

  trainer_config cfg_;
  parallel::groups<Comm> g_;
  model_t model_;
  optim::adamw<model_t> opt_;
  std::unique_ptr<optim::zero1<model_t>> zero_;  // ZeRO-1's sharded optimizer, or null
  std::unique_ptr<offload_t> offload_;           // the offloaded optimizer, or null
  Scaler scaler_;
  std::unique_ptr<parallel::grad_sync<model_t>> sync_;  // the dp reduction (data_parallel), or null on one dp rank
  std::vector<acts_t> acts_;
  buffer<device, std::int32_t> inputs_, targets_;
  /// Host memory from D::allocate_host (pinned: aclrtMallocHost on an NPU), so copies to and
  /// from the device are asynchronous on the stream.
  struct host_deleter {
    void operator()(void* p) const noexcept { device::deallocate_host(p); }
  };
  template <class X>
  using host_buffer = std::unique_ptr<X[], host_deleter>;
  template <class X>
  static host_buffer<X> pinned(std::size_t n) {
    return host_buffer<X>(static_cast<X*>(device::allocate_host(n * sizeof(X))));
  }
  /// The host's split of the windows (explicit-inputs step(), evaluate(), and step() without a
  /// device split).
  host_buffer<std::int32_t> host_in_, host_tg_;
  /// deferred_loss: grad_accum slots of parallel::host_loss_stride(B*T) per-token losses.
  host_buffer<acc_t> host_losses_;
  /// device_split: the step's windows on the device, and the copy stream that fills it.
  buffer<device, std::int32_t> windows_;
  struct no_copy_engine {
    explicit no_copy_engine(const context<device>&) noexcept {}
  };
  template <class D>
  struct copy_engine_of {
    using type = no_copy_engine;
  };
  template <class D>
    requires requires { typename D::copy_engine; }
  struct copy_engine_of<D> {
    using type = typename D::copy_engine;
  };
  typename copy_engine_of<device>::type copier_;
  std::vector<parallel::pipe_action> plan_;
  long step_ = 0;
};

}  // namespace loom::train
