#pragma once
/// \file parallel::pipeline_forward_backward: the executor of one optimizer step's micro-batches
/// on one rank, in the 1F1B order of parallel::one_f_one_b (parallel/schedule.hpp), moving
/// activations down and gradients up the pipeline group. Generic over the model: it calls
/// Model::forward and Model::backward of one stage (nn::transformer, nn/transformer.hpp) and
/// knows nothing else of it.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/scalars.hpp>
#include <loom/parallel/schedule.hpp>

namespace loom::parallel {

/// The default `ready` hook of a model's backward (nn::transformer::backward): does nothing.
struct no_ready_hook {
  constexpr void operator()(int) const noexcept {}
};

/// One optimizer step's forward and backward passes over m micro-batches on this rank, in the
/// 1F1B order of one_f_one_b(PP, m, model.stage()), moving activations down and
/// gradients up the pipeline over `pp` (tags 0 and 1). With PP == 1 this is plain gradient
/// accumulation: forward m, backward m, for m = 0..m-1.
///   ring     activation sets; micro-batch i uses ring[i % ring.size()]. Needs at least
///            max_in_flight(PP, m, stage) sets (input_error otherwise): 1F1B guarantees
///            micro-batch i - ring.size() has finished its backward when i starts its forward.
///   inputs, targets  (m, b, t) int32: micro-batch i at offset i*b*t (inputs read on the first
///            stage, targets on the last; every stage may pass the same pointers)
///   grad_scale       as Model::forward (1 / non-ignored targets of the whole step for a mean)
/// Accumulates (+=) the parameter gradients; call tie_embedding_gradients afterwards when PP > 1.
/// Returns the sum of the per-token losses over all micro-batches (micro-batch sums added in
/// double), identical on every rank
/// (computed on the last stage, broadcast over pp). Collective over tp and pp.
/// Sends are issued before the matching receives are posted on the peer (1F1B's order): the
/// communicator's send must not wait for its receiver (comm::threads: eager). See
/// parallel/schedule.hpp.
/// `observe(action, seconds)` is called after every action with its wall time (including the
/// wait of a receive), after synchronizing the stream (not for a device_clock_observer); the
/// default does nothing and costs nothing.
/// `ready` is passed to the backward of the last micro-batch (m-1), whose ready(layer) events
/// tell data parallelism which gradients are final (transformer::backward).
/// `drop`: training dropout (Model::dropout_plan, nn::dropout_plan for nn::transformer); micro-batch
/// i runs forward with drop.at(i) (nn/dropout.hpp) and its backward regenerates those masks.
/// Default: off.
/// `host_losses`: null (default), or m slots of host_loss_stride(b*t) floats of pinned host memory:
/// micro-batch i's per-token losses go to slot i (activations::host_losses) where the kernels can
/// copy them without a wait, and the loss those micro-batches add to the return value is 0; read
/// the slots after synchronizing (see host_loss_sum).
/// `schedule`: this stage's action list, one_f_one_b(PP, m, stage); empty (default):
/// computed here, one allocation per call (the trainer passes the list it made once).
struct no_observer {
  void operator()(const pipe_action&, double) const noexcept {}
};
/// An observer for a device with its own clock (stream events: train::ascend_phase_timer): `f`
/// is called after each action is enqueued, without synchronizing the stream, and its seconds
/// are the host's enqueue time.
template <class F>
struct device_clock_observer {
  static constexpr bool device_clock = true;
  F f;
  void operator()(const pipe_action& a, double s) { f(a, s); }
};
/// Floats per micro-batch slot of pipeline_forward_backward's host_losses: n rounded up to 16
/// (64 bytes, what an asynchronous copy's host address needs on the NPU).
constexpr std::size_t host_loss_stride(std::size_t n) noexcept { return (n + 15) / 16 * 16; }
/// The loss sum of m slots of host_losses filled by pipeline_forward_backward with n losses each:
/// each slot's losses added in double in row order and rounded to float (what the kernel returns),
/// the slots' sums added in double — the value the executor returns without host_losses.
template <class Acc>
double host_loss_sum(const Acc* host_losses, int m, std::size_t n) noexcept {
  double loss = 0;
  for (int i = 0; i < m; ++i) {
    double slot = 0;
    const Acc* l = host_losses + std::size_t(i) * host_loss_stride(n);
    for (std::size_t k = 0; k < n; ++k) slot += double(l[k]);
    loss += double(float(slot));
  }
  return loss;
}
template <class Model, int B, int T, class Comm, class Observer = no_observer, class Ready = no_ready_hook,
          class Drop = typename Model::dropout_plan>
double pipeline_forward_backward(context<typename Model::device>& ctx, Model& model,
                                                std::span<typename Model::template activations<B, T>> ring, Comm& tp,
                                                Comm& pp, int m, const std::int32_t* inputs,
                                                const std::int32_t* targets, int b, int t,
                                                typename Model::acc_t grad_scale, Observer&& observe = {},
                                                Ready&& ready = {}, const Drop& drop = {},
                                                typename Model::acc_t* host_losses = nullptr,
                                                std::span<const pipe_action> schedule = {}) {
  constexpr bool timed = !std::is_same_v<std::remove_cvref_t<Observer>, no_observer>;
  constexpr bool host_clock = timed && !requires { std::remove_cvref_t<Observer>::device_clock; };
  using S = typename Model::storage_t;
  constexpr int PP = Model::PP;
  const int stage = model.stage();
  const int need = max_in_flight(PP, m, stage);
  if (int(ring.size()) < need)
    throw input_error("pipeline_forward_backward: " + std::to_string(ring.size()) +
                      " activation sets for stage " + std::to_string(stage) + " of " + std::to_string(PP) +
                      " with " + std::to_string(m) + " micro-batches; 1F1B keeps up to " + std::to_string(need) +
                      " in flight: pass max_in_flight(PP, m, stage) sets");
  const std::size_t N = std::size_t(b) * t, NC = N * std::size_t(Model::C);
  constexpr int tag_activation = 0, tag_gradient = 1;
  double loss = 0;  // each micro-batch's sum added in double, as the trainer reports it
  std::vector<pipe_action> computed;  // only when the caller passed no schedule
  if (schedule.empty()) {
    computed = one_f_one_b(PP, m, stage);
    schedule = computed;
  }
  for (const auto& a : schedule) {
    [[maybe_unused]] const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    auto& acts = ring[std::size_t(a.micro) % ring.size()];
    const std::int32_t* in = inputs + std::size_t(a.micro) * N;
    const std::int32_t* tg = targets ? targets + std::size_t(a.micro) * N : nullptr;
    switch (a.op) {
      case pipe_op::recv_forward: pp.recv(std::span<S>(acts.input(), NC), stage - 1, tag_activation); break;
      case pipe_op::forward:
        acts.host_losses = host_losses ? host_losses + std::size_t(a.micro) * host_loss_stride(N) : nullptr;
        loss += double(model.forward(ctx, acts, tp, in, tg, b, t, grad_scale, drop.at(a.micro)));
        acts.host_losses = nullptr;
        break;
      case pipe_op::send_forward:
        ctx.synchronize();
        pp.send(std::span<const S>(acts.output(), NC), stage + 1, tag_activation);
        break;
      case pipe_op::recv_backward: pp.recv(std::span<S>(acts.output_grad(), NC), stage + 1, tag_gradient); break;
      case pipe_op::backward:
        if (a.micro == m - 1) model.backward(ctx, acts, tp, in, b, t, ready);
        else model.backward(ctx, acts, tp, in, b, t);
        break;
      case pipe_op::send_backward:
        ctx.synchronize();
        pp.send(std::span<const S>(acts.input_grad(), NC), stage - 1, tag_gradient);
        break;
    }
    if constexpr (timed) {
      if constexpr (host_clock) ctx.synchronize();  // the action's device work is in its time
      observe(a, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  if constexpr (PP > 1) loss = broadcast_from(ctx, pp, loss, PP - 1);  // Note [host scalars]
  return loss;
}

}  // namespace loom::parallel
