#pragma once
/// \file The template behind train::session (train/session.hpp): trainer_session wraps one
/// train::trainer; make_session builds one for a world_ref (train/whole_model.hpp has the
/// whole_model of a config). A program includes this header only in the translation units
/// that instantiate a session (one per instance: cmake/LoomSessions.cmake generates them), and
/// train/session.hpp everywhere else.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint/state.hpp>
#include <loom/io/trace.hpp>
#include <loom/kernels/cpu.hpp>  // the cpu instances' kernels
#include <loom/models/params.hpp>
#include <loom/nn/shard.hpp>
#include <loom/parallel/any_comm.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/policy.hpp>
#include <loom/train/session.hpp>
#include <loom/train/trainer.hpp>

namespace loom::train {

/// The model_facts of config M, as a reference.
template <models::model_config M>
inline const model_facts& facts_ref() noexcept {
  static constexpr model_facts f = models::facts_of<M>();
  return f;
}

/// The device side of a trainer_session on device D: the context the trainer runs on, the
/// communicator its groups use, and the device's memory statistics. Defined here for
/// device::cpu (the world itself carries the collectives) and in train/ascend_session.hpp for
/// device::ascend (an NPU per rank, HCCL bootstrapped over the world).
template <class D>
class session_device;

template <>
class session_device<device::cpu> {
 public:
  session_device(const session_args&, int /*world_rank*/) noexcept {}
  context<device::cpu>& ctx() noexcept { return ctx_; }
  /// The communicator the trainer's groups are split from: the world.
  parallel::any_communicator& collectives(parallel::any_communicator& world) noexcept { return world; }
  void add_memory(session_memory&) const noexcept {}
  // device time and the device's profiler: the host's clock is the CPU's (session's defaults)
  void begin_step() noexcept {}
  void end_step() noexcept {}
  void on_phase(phase, bool) noexcept {}
  std::optional<step_breakdown> breakdown() const noexcept { return std::nullopt; }
  bool start_profiler(const std::filesystem::path&) noexcept { return false; }
  void stop_profiler() noexcept {}

 private:
  context<device::cpu> ctx_;
};

/// One rank of a run of M under Policy (device, precision, layout<TP,PP>), capacities B x T,
/// attention Attn, on World: parallel::any_communicator (the world, whatever its backend), or
/// std::nullptr_t (one rank without data parallelism; layout<1,1> only). fp16 runs with
/// precision::dynamic_loss_scaler. Construction is collective over the world (the trainer splits it
/// into groups).
template <models::model_config M, class Policy, int B, int T, class World, class Attn = kernels::fused>
class trainer_session final : public session {
  using L = typename Policy::layout;
  static constexpr bool parallel_world = !std::is_same_v<World, std::nullptr_t>;
  static constexpr bool layered = L::tp * L::pp > 1;
  static_assert(parallel_world || !layered, "trainer_session: a tp x pp layout needs a world communicator");
  using scaler_t =
      std::conditional_t<Policy::precision::needs_loss_scaling, precision::dynamic_loss_scaler, precision::no_loss_scaler>;
  using comm_t = std::conditional_t<layered, World, parallel::local_group>;

 public:
  using trainer_t = train::trainer<M, Policy, B, T, comm_t, Attn, scaler_t>;
  using device_t = typename Policy::device;
  using storage_t = typename trainer_t::storage_t;

  /// Builds the trainer on `world`. Throws loom::input_error for invalid settings
  /// (trainer_config, a world size that is not a multiple of TP*PP).
  trainer_session(const session_args& a, World world) : world_(std::move(world)), dev_(a, world_rank()) {
    ctx_.hook = a.hook;
    if constexpr (parallel_world) {
      auto& c = dev_.collectives(world_);
      if (a.observer) c.set_observer(a.observer);  // before the trainer splits it
      parallel::ddp_options ddp = a.ddp;
      if constexpr (layered) ddp.check_every = 0;
      tr_.emplace(ctx_, a.cfg, c, ddp);
    } else {
      tr_.emplace(ctx_, a.cfg);
    }
    tr_->device_clock = !std::is_same_v<device_t, device::cpu>;  // an NPU's phases: its own clock, if any
    set_phase_callback(nullptr);  // the device's phase timer, if any
  }

  const model_facts& model() const noexcept override { return facts_ref<M>(); }
  std::size_t parameter_count(bool with_embeddings) const noexcept override {
    return with_embeddings ? models::parameter_count<M>() : models::parameter_count<M>(false);
  }
  std::string_view precision() const noexcept override { return Policy::precision::name; }
  std::string_view device() const noexcept override { return device_t::name; }
  std::string_view attention() const noexcept override { return Attn::name; }
  int micro_batch_capacity() const noexcept override { return B; }
  int seq_capacity() const noexcept override { return T; }
  session_rank rank() const noexcept override {
    session_rank r;
    if constexpr (parallel_world) r.world_rank = world_.rank(), r.world_size = world_.size();
    r.tp = L::tp, r.pp = L::pp, r.dp = tr_->dp_size();
    r.tp_rank = tr_->tp_rank(), r.stage = tr_->stage(), r.dp_rank = tr_->dp_rank();
    return r;
  }
  const trainer_config& config() const noexcept override { return tr_->config(); }
  std::size_t windows_per_step() const noexcept override { return tr_->windows_per_step(); }
  session_memory memory() const override {
    session_memory m;
    // from the types, not through model(): that waits for an overlapped offloaded update
    m.parameters = trainer_t::model_t::num_parameters * sizeof(storage_t);
    m.gradients = trainer_t::model_t::num_parameters * sizeof(typename trainer_t::grad_t);
    m.optimizer = tr_->optimizer_bytes();
    m.host_optimizer = tr_->host_optimizer_bytes();
    m.activations = tr_->activation_bytes();
    m.dp_buffers = tr_->data_parallel() ? tr_->data_parallel()->memory().buckets : 0;
    dev_.add_memory(m);
    return m;
  }
  bool loss_scaling() const noexcept override { return scaler_t::enabled; }
  double loss_scale() const noexcept override {
    if constexpr (scaler_t::enabled) return tr_->loss_scaler().scale();
    else return 1.0;
  }
  std::size_t bucket_count() const noexcept override {
    return tr_->data_parallel() ? tr_->data_parallel()->bucket_count() : 0;
  }

  void set_phase_callback(std::function<void(phase, bool)> f) override {
    if constexpr (std::is_same_v<device_t, device::cpu>) {
      tr_->on_phase = std::move(f);  // the host's clock is the device's: nothing to add
    } else {
      tr_->on_phase = [this, f = std::move(f)](phase p, bool begin) {
        dev_.on_phase(p, begin);
        if (f) f(p, begin);
      };
    }
  }
  step_result step(std::span<const std::int32_t> windows) override {
    dev_.begin_step();
    const auto r = tr_->step(ctx_, windows);
    dev_.end_step();
    return r;
  }
  std::optional<step_breakdown> device_breakdown() const override { return dev_.breakdown(); }
  bool start_device_profiler(const std::filesystem::path& dir) override { return dev_.start_profiler(dir); }
  device::host_allocator host_memory() const noexcept override {
    return device::host_allocator::of<typename Policy::device>();
  }
  void stop_device_profiler() override { dev_.stop_profiler(); }
  double evaluate(std::span<const std::int32_t> windows) override { return tr_->evaluate(ctx_, windows); }
  long step_count() const noexcept override { return tr_->step_count(); }

  void save_checkpoint(const std::filesystem::path& root, const io::run_state& state, io::checkpoint_options opt,
                       bool collective) override {
    io_.save(tr_->checkpoint_state(ctx_), root, state, std::move(opt), collective ? world() : nullptr);
  }
  std::optional<std::filesystem::path> wait_checkpoint(bool collective) override {
    return io_.wait(collective ? world() : nullptr);
  }
  double last_write_seconds() const noexcept override { return io_.last_write_seconds(); }
  io::checkpoint_info resume(const std::filesystem::path& dir,
                             const std::function<void(const std::string&)>& warn) override {
    auto info = session_io::load(dir, std::as_const(*tr_).checkpoint_state(ctx_), warn);
    tr_->restore(io::restored_scalars{info.step, info.optimizer_step, info.loss_scaler});
    return info;
  }

  void load_global_parameters(std::span<const float> global) override {
    const std::vector<storage_t> narrow(global.begin(), global.end());  // bf16/fp16: rounded once, here
    nn::load_global_parameters(ctx_, tr_->model(), std::span<const storage_t>(narrow));
    tr_->sync_master_weights(ctx_);  // the fp32 masters start from the loaded weights
  }
  std::vector<float> gather_parameters() override {
    const auto g = nn::gather_parameters(ctx_, tr_->model(), tr_->tp_group(), tr_->pp_group());
    return std::vector<float>(g.begin(), g.end());  // bf16/fp16 widened: exact
  }
  std::vector<std::byte> parameter_bytes() const override {
    const auto p = tr_->model().parameters();
    std::vector<std::byte> b(p.bytes());
    device_t::copy_to_host(b.data(), p.data(), b.size(), ctx_.stream);
    ctx_.synchronize();
    return b;
  }
  void restore_parameter_bytes(std::span<const std::byte> b) override {
    const auto p = tr_->model().parameters();
    if (b.size() != p.bytes())
      throw input_error("restore_parameter_bytes: " + std::to_string(b.size()) + " bytes for a parameter buffer of " +
                        std::to_string(p.bytes()));
    device_t::copy_to_device(p.data(), b.data(), b.size(), ctx_.stream);
    ctx_.synchronize();
    tr_->sync_master_weights(ctx_);
  }

  int broadcast_from_lead(int value) override {
    if constexpr (parallel_world) world_.broadcast(std::span<int>(&value, 1), 0);
    return value;
  }
  void gather_trace(const io::trace_recorder& rec, const std::filesystem::path& file) override {
    session_io::gather_trace(rec, world(), file);
  }

  /// The wrapped trainer (for tests).
  trainer_t& trainer() noexcept { return *tr_; }

 private:
  parallel::any_communicator* world() noexcept {
    if constexpr (parallel_world) return &world_;
    else return nullptr;
  }
  int world_rank() const noexcept {
    if constexpr (parallel_world) return world_.rank();
    else return 0;
  }

  World world_;  ///< host memory: checkpoints, traces, broadcast_from_lead (and HCCL's bootstrap)
  mutable session_device<device_t> dev_;
  context<device_t>& ctx_ = dev_.ctx();
  std::optional<trainer_t> tr_;
  session_io io_;  ///< destroyed first: waits for a save in flight
};

/// A session of instance (M, Policy, B, T, Attn) on `w`: for layout<1,1> any world (none: one
/// rank; threads or mpi: data parallel over it), for a tp x pp layout a threads or MPI world.
/// Throws loom::input_error for a tp x pp layout without a world.
template <models::model_config M, class Policy, int B, int T, class Attn>
std::unique_ptr<session> make_session(const session_args& a, world_ref w) {
  constexpr bool layered = Policy::layout::tp * Policy::layout::pp > 1;
  if (w.type == world_ref::kind::none) {
    if constexpr (!layered) return std::make_unique<trainer_session<M, Policy, B, T, std::nullptr_t, Attn>>(a, nullptr);
    throw input_error("model " + std::string(M::name) + ": a tp x pp layout needs a world communicator (--ranks or mpirun)");
  }
  return std::make_unique<trainer_session<M, Policy, B, T, parallel::any_communicator, Attn>>(a, any_communicator_of(w));
}

/// session_instance::plan of instance (M, Policy, B, T, Attn): its trainer's plan for a world of
/// world_size ranks (none when world_size is 1 on layout<1,1>, as train_gpt runs one rank).
/// Throws loom::input_error when world_size is not a multiple of TP*PP or the settings are invalid.
template <models::model_config M, class Policy, int B, int T, class Attn>
memory_plan plan_session(const session_args& a, int world_size, int dp_rank, int stage) {
  constexpr int TP = Policy::layout::tp, PP = Policy::layout::pp;
  if (world_size < 1 || world_size % (TP * PP) != 0)
    throw input_error("memory plan: " + std::to_string(world_size) + " ranks are not a multiple of TP x PP = " +
                      std::to_string(TP * PP) + "; pass --ranks " + std::to_string(TP * PP) + " (or a multiple)");
  const int dp = world_size / (TP * PP);
  const bool engine = TP * PP > 1 ? dp > 1 || a.ddp.zero1 : world_size > 1;
  using trainer_t = typename trainer_session<M, Policy, B, T, parallel::any_communicator, Attn>::trainer_t;
  return trainer_t::plan(a.cfg, dp, dp_rank, stage, engine ? &a.ddp : nullptr);
}

}  // namespace loom::train
