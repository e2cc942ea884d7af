#pragma once
/// \file The non-interleaved 1F1B pipeline schedule as a pure function, its bubble formula, and a
/// discrete-event simulator that executes the schedules of all stages together.
///
/// Source: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
/// Megatron-LM" (SC'21, arXiv:2104.04473) §2.2.1 (PipeDream-Flush / 1F1B, bubble fraction
/// (p-1)/(m+p-1)); Megatron-LM core `forward_backward_pipelining_without_interleaving`
/// (num_warmup_microbatches = min(pipeline_size - rank - 1, num_microbatches)).
///
/// Worked example, 4 stages, 6 micro-batches (F3 = forward of micro-batch 3, B = backward):
///   stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5      warm-up 3 = 4 - 0 - 1
///   stage 1:    F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5   warm-up 2
///   stage 2:       F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5  warm-up 1
///   stage 3:          F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5  warm-up 0: alternates at once
/// Stage s holds at most min(warm-up + 1, m) micro-batches' activations at a time, which sizes
/// its saved-activation ring; the first stage holds the most (p), the last one.
///
/// Communication is part of the schedule: every action list also says when to receive a
/// micro-batch's input activation from stage s-1 (recv_forward), send the output to stage s+1
/// (send_forward), receive the output gradient from stage s+1 (recv_backward) and send the input
/// gradient to stage s-1 (send_backward). Messages between two stages flow in micro-batch order
/// on each of the two channels (activations down, gradients up), so a receiver never needs to
/// look at tags to tell micro-batches apart.
///
/// Send semantics. With eager (buffered) sends the plain order is deadlock-free. With rendezvous
/// sends (MPI_Send may wait for the matching receive), it is not: in the steady state stage s
/// sends an activation to s+1 and then waits for a gradient from s+1, while s+1 sends that
/// gradient and then waits for the activation — each send waits for a receive the other side
/// has not reached. Megatron avoids this by batching each such pair into one
/// send_forward_recv_backward (batch_isend_irecv). loom orders the pair instead:
/// one_f_one_b(..., p2p_order::rendezvous_safe), the default, swaps every adjacent
/// (send, receive) pair with the same neighbour on odd stages into (receive, send), so on each
/// link the even stage sends first and the odd stage receives first. simulate_schedule() proves the result deadlock-free
/// under both semantics, and that the plain order deadlocks under rendezvous.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::parallel {

/// One step of a stage's pipeline schedule.
enum class pipe_op : std::uint8_t {
  recv_forward,   ///< receive micro-batch `micro`'s input activation from stage s-1
  forward,        ///< run the stage's layers forward on micro-batch `micro`, saving activations
  send_forward,   ///< send its output activation to stage s+1
  recv_backward,  ///< receive the gradient of its output from stage s+1
  backward,       ///< run backward on micro-batch `micro`, releasing its saved activations
  send_backward,  ///< send the gradient of its input to stage s-1
};

/// "recv_forward", "forward", ...
constexpr std::string_view to_string(pipe_op op) noexcept {
  switch (op) {
    case pipe_op::recv_forward: return "recv_forward";
    case pipe_op::forward: return "forward";
    case pipe_op::send_forward: return "send_forward";
    case pipe_op::recv_backward: return "recv_backward";
    case pipe_op::backward: return "backward";
    case pipe_op::send_backward: return "send_backward";
  }
  return "?";
}

/// An action: what to do, and on which micro-batch (0-based, in data order).
struct pipe_action {
  pipe_op op;
  int micro;
  friend constexpr bool operator==(pipe_action, pipe_action) = default;
};

/// True for forward and backward (the actions that compute); false for the four transfers.
constexpr bool is_compute(pipe_op op) noexcept { return op == pipe_op::forward || op == pipe_op::backward; }

namespace detail {
constexpr void check_schedule_args(int stages, int micro_batches, int stage, const char* api) {
  if (stages < 1)
    throw input_error(std::string(api) + ": " + std::to_string(stages) +
                      " pipeline stages; the pipeline-parallel degree must be at least 1");
  if (micro_batches < 1)
    throw input_error(std::string(api) + ": " + std::to_string(micro_batches) +
                      " micro-batches; a step needs at least one micro-batch");
  if (stage < 0 || stage >= stages)
    throw input_error(std::string(api) + ": stage " + std::to_string(stage) + " is outside [0, " +
                      std::to_string(stages) + "); pass this rank's pipeline rank (groups.pp.rank())");
}
}  // namespace detail

/// Forward passes stage `stage` runs before its first backward: min(stages - stage - 1, m).
/// Throws loom::input_error for stages < 1, micro_batches < 1 or a stage outside [0, stages).
constexpr int warmup_depth(int stages, int micro_batches, int stage) {
  detail::check_schedule_args(stages, micro_batches, stage, "warmup_depth");
  return std::min(stages - stage - 1, micro_batches);
}

/// The most micro-batches whose activations stage `stage` holds at once under 1F1B:
/// min(warmup_depth + 1, m). Size the saved-activation ring with it.
constexpr int max_in_flight(int stages, int micro_batches, int stage) {
  return std::min(warmup_depth(stages, micro_batches, stage) + 1, micro_batches);
}

/// Idle fraction of every stage when forward and backward of one micro-batch take the same time
/// on every stage and communication is free: (p-1)/(m+p-1) (Narayanan et al. 2021, §2.2.1).
/// Throws loom::input_error for stages < 1 or micro_batches < 1.
constexpr double bubble_fraction(int stages, int micro_batches) {
  detail::check_schedule_args(stages, micro_batches, 0, "bubble_fraction");
  return double(stages - 1) / double(micro_batches + stages - 1);
}

/// How one_f_one_b orders a stage's adjacent (send, receive) pairs.
enum class p2p_order : std::uint8_t {
  plain,            ///< send first everywhere: deadlock-free only with eager sends
  rendezvous_safe,  ///< odd stages receive first: deadlock-free with eager and rendezvous sends
};

/// The 1F1B action list of pipeline stage `stage` (0 = first, holds the embedding) of `stages`,
/// for `micro_batches` micro-batches (m). Pure function; usable in constant expressions.
///
/// Order (w = warmup_depth):
///   warm-up   for i < w:      [recv_forward i] forward i [send_forward i]
///   steady    for i < m - w:  [recv_forward w+i] forward w+i [send_forward w+i]
///                             [recv_backward i] backward i [send_backward i]
///   cool-down for i >= m - w: [recv_backward i] backward i [send_backward i]
/// where [..] is present only if the neighbouring stage exists (no recv_forward/send_backward on
/// stage 0, no send_forward/recv_backward on the last stage). With stages == 1 this is
/// forward 0, backward 0, forward 1, ... — gradient accumulation over micro-batches.
/// Size: 2m compute actions + 2m transfers per existing neighbour.
/// Works for any m >= 1; with m < stages the warm-up is cut to m and the bubble grows (see
/// pipeline_fills). With p2p_order::rendezvous_safe (default), on odd stages a send immediately
/// followed by a receive on the same link (send_forward w+i / recv_backward i with stage s+1,
/// send_backward i / recv_forward w+i+1 with stage s-1; different buffers) is swapped when the
/// neighbour holds the mirrored pair adjacent (Megatron's send_forward_recv_backward /
/// send_backward_recv_forward), so the two pairs meet in opposite orders; see the file comment.
/// Cost O(m) per stage, O(m^2) for the rendezvous-safe order.
/// Throws loom::input_error for bad arguments (see warmup_depth).
constexpr std::vector<pipe_action> one_f_one_b(int stages, int micro_batches, int stage,
                                               p2p_order order = p2p_order::rendezvous_safe) {
  detail::check_schedule_args(stages, micro_batches, stage, "one_f_one_b");
  const int m = micro_batches, w = warmup_depth(stages, m, stage);
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<pipe_action> s;
  s.reserve(std::size_t(2 * m + 2 * m * (int(!first) + int(!last))));
  auto fwd = [&](int i) {
    if (!first) s.push_back({pipe_op::recv_forward, i});
    s.push_back({pipe_op::forward, i});
    if (!last) s.push_back({pipe_op::send_forward, i});
  };
  auto bwd = [&](int i) {
    if (!last) s.push_back({pipe_op::recv_backward, i});
    s.push_back({pipe_op::backward, i});
    if (!first) s.push_back({pipe_op::send_backward, i});
  };
  for (int i = 0; i < w; ++i) fwd(i);
  for (int i = 0; i < m - w; ++i) {
    fwd(w + i);
    bwd(i);
  }
  for (int i = m - w; i < m; ++i) bwd(i);
  if (order == p2p_order::rendezvous_safe && stage % 2 == 1) {
    // Swap a same-link pair only where the neighbour holds the mirrored pair adjacent:
    //   here (send_forward j, recv_backward i)  <->  stage+1: (send_backward i, recv_forward j)
    //   here (send_backward i, recv_forward j)  <->  stage-1: (send_forward j, recv_backward i)
    // Elsewhere (the warm-up/cool-down boundary when m is small) the receive depends on the send
    // and must stay after it.
    auto mirrored = [&](int peer, pipe_action a, pipe_action b) {
      if (peer < 0 || peer >= stages) return false;
      const auto other = one_f_one_b(stages, m, peer, p2p_order::plain);
      for (std::size_t k = 0; k + 1 < other.size(); ++k)
        if (other[k] == a) return other[k + 1] == b;
      return false;
    };
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const pipe_action x = s[i], y = s[i + 1];
      bool swap = false;
      if (x.op == pipe_op::send_forward && y.op == pipe_op::recv_backward)
        swap = mirrored(stage + 1, {pipe_op::send_backward, y.micro}, {pipe_op::recv_forward, x.micro});
      else if (x.op == pipe_op::send_backward && y.op == pipe_op::recv_forward)
        swap = mirrored(stage - 1, {pipe_op::send_forward, y.micro}, {pipe_op::recv_backward, x.micro});
      if (swap) {
        s[i] = y;
        s[i + 1] = x;
        ++i;
      }
    }
  }
  return s;
}

/// The compute actions of a schedule (forward and backward only), in order.
constexpr std::vector<pipe_action> compute_actions(const std::vector<pipe_action>& schedule) {
  std::vector<pipe_action> out;
  for (const auto& a : schedule)
    if (is_compute(a.op)) out.push_back(a);
  return out;
}

namespace detail {
template <int Stages, int MicroBatches>
[[deprecated(
    "1F1B with fewer micro-batches than pipeline stages: correct, but every stage idles (PP-1)/(M+PP-1) "
    ">= 1/2 of the step; raise the gradient-accumulation micro-batch count M to at least PP (4*PP or "
    "more keeps the bubble under 20%)")]] constexpr void pipeline_underfilled() noexcept {}
}  // namespace detail

/// Compile-time check that M micro-batches fill a PP-stage 1F1B pipeline: returns M >= PP. When
/// M < PP it still returns (false) but the compiler prints a deprecation *warning* naming the
/// bubble; it is not an error because the schedule stays correct for any M >= 1 (warm-up cut to
/// M, results identical), and small M is legitimate for debugging, evaluation and tiny runs.
/// PP < 1 or M < 1 is an error. Use `(void)parallel::pipeline_fills<L::pp, M>();` where the
/// micro-batch count is a compile-time constant; the runtime value is checked by the caller.
template <int PP, int M>
constexpr bool pipeline_fills() noexcept {
  static_assert(PP >= 1, "pipeline_fills<PP, M>: the pipeline-parallel degree PP must be at least 1");
  static_assert(M >= 1, "pipeline_fills<PP, M>: a step needs at least one micro-batch (M >= 1)");
  if constexpr (M < PP) detail::pipeline_underfilled<PP, M>();
  return M >= PP;
}

/// What simulate_schedule observed.
struct schedule_trace {
  bool ok = false;                     ///< every stage ran its whole list, every check held
  std::string problem;                 ///< first violated rule or the deadlock, when !ok
  double makespan = 0;                 ///< time when the last stage finished
  std::vector<double> busy;            ///< per stage: time spent in forward/backward
  std::vector<double> idle_fraction;   ///< per stage: 1 - busy / makespan
  std::vector<int> peak_in_flight;     ///< per stage: most micro-batches forwarded, not yet backwarded
};

/// How simulate_schedule models a send.
enum class send_semantics : std::uint8_t {
  eager,       ///< a send returns at once (buffered); comm::threads
  rendezvous,  ///< a send waits until the receiver is at the matching receive (MPI_Ssend; MPI_Send
               ///< for messages above the eager limit)
};

namespace detail {

/// simulate_schedule's state: every stage's action list, program counter, clock and
/// per-micro-batch progress, and the messages in flight between neighbouring stages.
class schedule_simulation {
 public:
  schedule_simulation(std::vector<std::vector<pipe_action>> lists, int micro_batches, double t_forward,
                      double t_backward, send_semantics sends)
      : lists_(std::move(lists)), p_(int(lists_.size())), m_(micro_batches), t_forward_(t_forward),
        t_backward_(t_backward), sends_(sends) {
    const auto P = std::size_t(p_), Mb = std::size_t(m_);
    trace_.busy.assign(P, 0.0);
    trace_.idle_fraction.assign(P, 0.0);
    trace_.peak_in_flight.assign(P, 0);
    down_.resize(P);
    up_.resize(P);
    down_taken_.assign(P, 0);
    up_taken_.assign(P, 0);
    pc_.assign(P, 0);
    clock_.assign(P, 0.0);
    input_in_.assign(P, std::vector<int>(Mb, 0));
    grad_in_.assign(P, std::vector<int>(Mb, 0));
    done_f_.assign(P, std::vector<int>(Mb, 0));
    done_b_.assign(P, std::vector<int>(Mb, 0));
    live_.assign(P, 0);
  }

  /// Runs every stage as far as it can, round after round, until none moves; then checks the
  /// end state. Returns the trace (ok, or the first problem).
  schedule_trace run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t s = 0; s < std::size_t(p_); ++s)
        while (pc_[s] < lists_[s].size()) {
          const pipe_action a = lists_[s][pc_[s]];
          bool ran = true;
          if (std::string why = act(s, a, ran); !why.empty()) return failed(s, a, why);
          if (!ran) break;
          ++pc_[s];
          progress = true;
        }
    }
    return finished();
  }

 private:
  struct message {
    int micro;
    double time;
  };

  /// The first violated rule at stage s's current action a.
  schedule_trace failed(std::size_t s, const pipe_action& a, const std::string& why) {
    trace_.ok = false;
    trace_.problem = "stage " + std::to_string(s) + " action " + std::to_string(pc_[s]) + " (" +
                     std::string(to_string(a.op)) + " " + std::to_string(a.micro) + "): " + why;
    return trace_;
  }

  /// Runs action a of stage s if it can (ran = false: it waits). Returns the violated rule, or "".
  std::string act(std::size_t s, const pipe_action& a, bool& ran) {
    if (a.micro < 0 || a.micro >= m_) return "micro-batch out of range";
    const auto M = std::size_t(a.micro);
    const bool first = s == 0, last = s + 1 == std::size_t(p_);
    switch (a.op) {
      case pipe_op::recv_forward:
        if (first) return "the first stage has no previous stage";
        return receive(s, down_[s - 1], down_taken_[s - 1], a.micro, input_in_[s][M], "activation", ran);
      case pipe_op::recv_backward:
        if (last) return "the last stage has no next stage";
        return receive(s, up_[s], up_taken_[s], a.micro, grad_in_[s][M], "gradient", ran);
      case pipe_op::forward:
        if (done_f_[s][M]) return "forward runs twice";
        if (!first && !input_in_[s][M]) return "forward before its input activation was received";
        done_f_[s][M] = 1;
        compute(s, t_forward_);
        trace_.peak_in_flight[s] = std::max(trace_.peak_in_flight[s], ++live_[s]);
        return {};
      case pipe_op::backward:
        if (!done_f_[s][M]) return "backward before its forward";
        if (done_b_[s][M]) return "backward runs twice";
        if (!last && !grad_in_[s][M]) return "backward before its output gradient was received";
        done_b_[s][M] = 1;
        compute(s, t_backward_);
        --live_[s];
        return {};
      case pipe_op::send_forward:
        if (last) return "the last stage has no next stage";
        if (!done_f_[s][M]) return "sends an activation its forward has not produced";
        ran = send(s, s + 1, pipe_op::recv_forward, a.micro, down_[s]);
        return {};
      case pipe_op::send_backward:
        if (first) return "the first stage has no previous stage";
        if (!done_b_[s][M]) return "sends a gradient its backward has not produced";
        ran = send(s, s - 1, pipe_op::recv_backward, a.micro, up_[s - 1]);
        return {};
    }
    return {};
  }

  void compute(std::size_t s, double t) {
    clock_[s] += t;
    trace_.busy[s] += t;
  }

  /// Takes the next message of queue q (taken: how many were) for micro-batch `micro`, marking
  /// `arrived`; ran = false while q has none.
  std::string receive(std::size_t s, const std::vector<message>& q, std::size_t& taken, int micro, int& arrived,
                      const char* what, bool& ran) {
    if (taken >= q.size()) {
      ran = false;
      return {};
    }
    const message msg = q[taken++];
    if (msg.micro != micro)
      return std::string("the next ") + what + " message is for micro-batch " + std::to_string(msg.micro);
    arrived = 1;
    clock_[s] = std::max(clock_[s], msg.time);
    return {};
  }

  /// Sends micro-batch `micro` from stage `from` to `to` through q: at once when eager; when
  /// rendezvous, only while `to` is blocked at the matching receive (recv_op), both then leaving
  /// at the later of their two clocks (the receive itself completes when the receiver's turn
  /// comes, taking the message pushed here). Returns false when the send must wait.
  bool send(std::size_t from, std::size_t to, pipe_op recv_op, int micro, std::vector<message>& q) {
    if (sends_ == send_semantics::rendezvous) {
      if (pc_[to] >= lists_[to].size()) return false;
      const pipe_action peer = lists_[to][pc_[to]];
      if (peer.op != recv_op || peer.micro != micro) return false;  // not (yet) at the matching receive
      clock_[from] = clock_[to] = std::max(clock_[from], clock_[to]);
    }
    q.push_back({micro, clock_[from]});
    return true;
  }

  /// After no stage can move: a deadlock, a micro-batch never run, or a message never received;
  /// else the makespan and idle fractions.
  schedule_trace finished() {
    for (std::size_t s = 0; s < std::size_t(p_); ++s) {
      if (pc_[s] < lists_[s].size()) {
        const pipe_action a = lists_[s][pc_[s]];
        trace_.problem = "deadlock: stage " + std::to_string(s) + " waits forever at action " + std::to_string(pc_[s]) +
                         " (" + std::string(to_string(a.op)) + " " + std::to_string(a.micro) + ")";
        return trace_;
      }
      for (int i = 0; i < m_; ++i)
        if (!done_f_[s][std::size_t(i)] || !done_b_[s][std::size_t(i)]) {
          trace_.problem = "stage " + std::to_string(s) + " never ran forward and backward of micro-batch " + std::to_string(i);
          return trace_;
        }
      if (down_taken_[s] != down_[s].size() || up_taken_[s] != up_[s].size()) {
        trace_.problem = "messages between stages " + std::to_string(s) + " and " + std::to_string(s + 1) + " left unreceived";
        return trace_;
      }
      trace_.makespan = std::max(trace_.makespan, clock_[s]);
    }
    for (std::size_t s = 0; s < std::size_t(p_); ++s)
      trace_.idle_fraction[s] = trace_.makespan > 0 ? 1.0 - trace_.busy[s] / trace_.makespan : 0.0;
    trace_.ok = true;
    return trace_;
  }

  std::vector<std::vector<pipe_action>> lists_;
  int p_, m_;
  double t_forward_, t_backward_;
  send_semantics sends_;
  schedule_trace trace_;
  // down_[s]: activations sent by stage s to s+1; up_[s]: gradients sent by stage s+1 to s.
  std::vector<std::vector<message>> down_, up_;
  std::vector<std::size_t> down_taken_, up_taken_, pc_;
  std::vector<double> clock_;
  // per stage, per micro-batch: input activation arrived, output gradient arrived, forwarded, backwarded
  std::vector<std::vector<int>> input_in_, grad_in_, done_f_, done_b_;
  std::vector<int> live_;  ///< per stage: micro-batches forwarded, not yet backwarded
};

}  // namespace detail

/// Runs the schedules of all stages together as a discrete-event simulation: forward takes
/// t_forward, backward t_backward, transfers take no time, a receive waits for its matching
/// send, and a send either returns at once (eager) or waits for the matching receive
/// (rendezvous; then both complete together). Checks, per stage: every micro-batch's forward exactly once and
/// before its backward; a forward only after its input arrived (stage > 0), a backward only
/// after its output gradient arrived (last stage: after its own forward); a send only after the
/// compute that produces it; messages taken in the order they were sent, with the expected
/// micro-batch; at the end every message consumed. Deadlock = no stage can move while some
/// still have actions. `schedule(stages, m, stage)` returns each stage's list (one_f_one_b by
/// default). Cost O(p * m) actions, O(p^2 * m) scans in the worst case.
template <class ScheduleFn>
schedule_trace simulate_schedule(int stages, int micro_batches, double t_forward, double t_backward,
                                 ScheduleFn&& schedule, send_semantics sends = send_semantics::eager) {
  detail::check_schedule_args(stages, micro_batches, 0, "simulate_schedule");
  std::vector<std::vector<pipe_action>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(schedule(stages, micro_batches, s));
  return detail::schedule_simulation(std::move(lists), micro_batches, t_forward, t_backward, sends).run();
}

/// simulate_schedule over one_f_one_b(stages, m, stage, order).
inline schedule_trace simulate_one_f_one_b(int stages, int micro_batches, double t_forward = 1.0,
                                           double t_backward = 2.0, p2p_order order = p2p_order::rendezvous_safe,
                                           send_semantics sends = send_semantics::eager) {
  return simulate_schedule(
      stages, micro_batches, t_forward, t_backward, [order](int p, int m, int s) { return one_f_one_b(p, m, s, order); },
      sends);
}

}  // namespace loom::parallel
