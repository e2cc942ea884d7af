#pragma once
/// \file Where each step's time goes, and the rates derived from it: the always-on step
/// breakdown, tokens/s, model FLOPs utilisation (MFU), ETA, and the scalars every sink logs.
///
///   step_timer      exclusive-time phase clock for one step (RAII scopes, nestable)
///   step_metrics    rolling rates (tokens/s, MFU, ETA) and a summary of the phases since the
///                   last summary; turns a step into the scalar list TensorBoard/JSONL receive
///   flops_per_token 6 N + 12 L T d  (Chowdhery et al., "PaLM", 2022, appendix B)
///
/// Cost: one steady_clock read per phase transition (about 25-60 ns here), a few dozen per step:
/// far below 1 % of a millisecond-scale step.
///
/// Asynchronous devices: the timer measures host time. On Ascend a kernel launch returns before
/// the kernel runs, so host phases measure enqueue time and the wait lands in whatever phase
/// synchronises next. For a true device breakdown synchronise the stream at phase boundaries
/// (`--sync-phases`, costs overlap) or time with device events; on the CPU host time is exact.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include <loom/core/memory.hpp>
#include <loom/io/scalar.hpp>
#include <loom/models/configs.hpp>
#include <loom/models/params.hpp>

namespace loom::train {

/// The parts a training step is split into (the practice guide's breakdown).
///   data_wait     waiting for the loader (time the prefetch did not hide)
///   h2d_copy      host -> device copy of the batch
///   forward       forward pass, all micro-batches
///   backward      backward pass, all micro-batches
///   exposed_comm  communication the host waited for (not hidden behind compute): bucket
///                 waits, TP/PP collectives it blocked on, pipeline bubbles waiting on recv
///   optimizer     unscale, non-finite check, grad norm, clip, AdamW, cast, lr tick
///   other         everything not inside a phase scope (logging, bookkeeping)
enum class phase : std::uint8_t { data_wait, h2d_copy, forward, backward, exposed_comm, optimizer, other };
inline constexpr std::size_t phase_count = 7;

constexpr std::string_view phase_name(phase p) noexcept {
  constexpr std::array<std::string_view, phase_count> names{"data_wait", "h2d_copy",  "forward", "backward",
                                                            "exposed_comm", "optimizer", "other"};
  return names[static_cast<std::size_t>(p)];
}

/// One step's wall time split into phases, in seconds. sum(seconds) == total exactly.
struct step_breakdown {
  std::array<double, phase_count> seconds{};
  double total = 0;
  double operator[](phase p) const noexcept { return seconds[static_cast<std::size_t>(p)]; }
};

/// Exclusive-time phase clock for one step: time is charged to the innermost open phase, so
/// nested scopes never double count (a TP all-reduce wait inside forward is charged to
/// exposed_comm, not also to forward) and the phases sum to the step exactly; time outside any
/// scope is `other`.
///
///   timer.begin_step();
///   { auto s = timer.scope(phase::data_wait); batch = loader.next(); }
///   { auto s = timer.scope(phase::forward);   ...  { auto c = timer.scope(phase::exposed_comm); h.wait(); } }
///   step_breakdown b = timer.end_step();
///
/// Clock: any type with a static now() returning a std::chrono::time_point (tests use a fake).
/// Enabled = false compiles the timer out: every member is an empty inline function, end_step()
/// returns an all-zero breakdown (null_step_timer; bench/bench_step_timer measures one against
/// the other in one run).
/// Nesting deeper than 16 levels charges the extra levels to the 16th level's phase. Single-threaded: one
/// timer per training-loop thread. Never throws.
template <class Clock = std::chrono::steady_clock, bool Enabled = true>
class basic_step_timer {
 public:
  /// RAII scope returned by scope(): leaves the phase when destroyed. Move-only.
  class scope_guard {
   public:
    scope_guard(scope_guard&& o) noexcept : t_(std::exchange(o.t_, nullptr)) {}
    scope_guard& operator=(scope_guard&&) = delete;
    scope_guard(const scope_guard&) = delete;
    ~scope_guard() {
      if (t_) t_->leave();
    }

   private:
    friend class basic_step_timer;
    explicit scope_guard(basic_step_timer* t) noexcept : t_(t) {}
    basic_step_timer* t_;
  };

  /// Starts a step: clears the breakdown, current phase = other.
  void begin_step() noexcept {
    if constexpr (!Enabled) return;
    b_ = {};
    depth_ = 0;
    stack_[0] = phase::other;
    start_ = last_ = Clock::now();
  }
  /// Enters phase p until the matching leave().
  void enter(phase p) noexcept {
    if constexpr (!Enabled) return;
    charge();
    if (depth_ + 1 < max_depth) stack_[++depth_] = p;
    else ++overflow_;  // too deep: keep charging the deepest tracked phase
  }
  /// Leaves the innermost phase (back to the enclosing one).
  void leave() noexcept {
    if constexpr (!Enabled) return;
    charge();
    if (overflow_) --overflow_;
    else if (depth_ > 0) --depth_;
  }
  [[nodiscard]] scope_guard scope(phase p) noexcept {
    enter(p);
    return scope_guard(this);
  }
  /// Ends the step; open scopes keep running into the next step's `other`.
  step_breakdown end_step() noexcept {
    if constexpr (!Enabled) return {};
    charge();
    b_.total = std::chrono::duration<double>(last_ - start_).count();
    // Re-derive `other` so that the sum is exact despite floating-point accumulation order.
    double known = 0;
    for (std::size_t i = 0; i + 1 < phase_count; ++i) known += b_.seconds[i];
    b_.seconds[static_cast<std::size_t>(phase::other)] = std::max(0.0, b_.total - known);
    b_.total = known + b_.seconds[static_cast<std::size_t>(phase::other)];
    return b_;
  }

 private:
  static constexpr int max_depth = 16;
  void charge() noexcept {
    const auto now = Clock::now();
    b_.seconds[static_cast<std::size_t>(stack_[depth_])] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  step_breakdown b_{};
  std::array<phase, max_depth> stack_{phase::other};
  int depth_ = 0;
  int overflow_ = 0;
  typename Clock::time_point start_{}, last_{};
};
using step_timer = basic_step_timer<>;
/// The step timer compiled out (same interface, no clock reads, zero breakdowns).
using null_step_timer = basic_step_timer<std::chrono::steady_clock, false>;

/// Model FLOPs per trained token, forward + backward: 6 N + 12 L T d.
/// N = parameters without position embeddings (each multiplies once per token: 2 flops forward,
/// 4 backward), 12 L T d = attention scores and weighted sum (QK^T and AV, forward + backward).
/// `seq_len` is the trained sequence length T, not max_seq. Recomputation is *not* counted
/// (MFU counts model FLOPs, not hardware FLOPs). Source: PaLM, appendix B.
constexpr double flops_per_token(double n_params_no_pos, int n_layer, int seq_len, int d_model) noexcept {
  return 6.0 * n_params_no_pos + 12.0 * double(n_layer) * double(seq_len) * double(d_model);
}

/// Parameters of model M that multiply once per token (its table without the tables that are
/// only looked up: models::parameter_count<M>(false)). For GPT-2: the tied token embedding / LM head
/// (vocab_padded x d), per layer ln1, qkv, attn proj, ln2, fc, fc proj with biases
/// (12 d^2 + 13 d), final layernorm (2 d). Counted at vocab_padded, as stored and multiplied.
template <models::model_config M>
constexpr std::int64_t gpt_parameters_without_position() noexcept {
  return std::int64_t(models::parameter_count<M>(false));
}

/// flops_per_token for model M trained at sequence length `seq_len`.
template <models::model_config M>
constexpr double flops_per_token(int seq_len) noexcept {
  return flops_per_token(double(gpt_parameters_without_position<M>()), M::n_layer, seq_len, M::d_model);
}

/// Model FLOPs utilisation: achieved model FLOP/s over the peak FLOP/s of the hardware that
/// processed those tokens. Returns NaN if peak_flops <= 0.
constexpr double mfu(double flops_per_token, double tokens_per_second, double peak_flops) noexcept {
  return peak_flops > 0 ? flops_per_token * tokens_per_second / peak_flops : std::numeric_limits<double>::quiet_NaN();
}

/// Settings of step_metrics.
struct metrics_config {
  double flops_per_token = 0;    ///< model FLOPs per token (flops_per_token()); 0 = no MFU
  double peak_flops = 0;         ///< FLOP/s of the hardware doing the work (bench::measure_fp32_peak,
                                 ///< times the devices if tokens are global); 0 = no MFU
  std::int64_t total_steps = 0;  ///< last step + 1, for the ETA; 0 = no ETA
  std::size_t window = 20;       ///< steps in the rolling averages (tokens/s, MFU, ETA), 1..256
};

/// What the trainer knows at the end of a step. NaN = not available (not logged).
struct step_report {
  std::int64_t step = 0;
  std::int64_t tokens = 0;  ///< tokens this step processed (per rank or global: match peak_flops)
  double loss = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double loss_scale = std::numeric_limits<double>::quiet_NaN();  ///< fp16 dynamic loss scale
  bool skipped = false;  ///< non-finite gradients: the update was skipped
};

/// One step with its derived rates.
struct step_record {
  step_report report;
  step_breakdown time;
  double tokens_per_second = 0;  ///< rolling average over the window
  double mfu = std::numeric_limits<double>::quiet_NaN();          ///< rolling, 0..1
  double eta_seconds = std::numeric_limits<double>::quiet_NaN();  ///< remaining steps x rolling step time
  double step_seconds = 0;       ///< rolling mean step time
};

/// Phases accumulated over the steps since the last reset (for the console's summary table).
struct step_summary {
  std::int64_t first_step = 0, last_step = -1;
  std::size_t steps = 0;
  std::array<double, phase_count> seconds{};  ///< sums
  double total = 0, min_step = 0, max_step = 0;
  std::int64_t tokens = 0;
  double mean_ms(phase p) const noexcept { return steps ? 1e3 * seconds[std::size_t(p)] / double(steps) : 0; }
  double share(phase p) const noexcept { return total > 0 ? seconds[std::size_t(p)] / total : 0; }
  double mean_step_ms() const noexcept { return steps ? 1e3 * total / double(steps) : 0; }
  double tokens_per_second() const noexcept { return total > 0 ? double(tokens) / total : 0; }
};

/// A fixed-capacity list of scalars (no allocation per step); tags are string literals.
struct scalar_list {
  std::array<io::scalar, 40> items{};
  std::size_t size = 0;
  void push(std::string_view tag, double value) noexcept {
    if (size < items.size()) items[size++] = {tag, value};
  }
  std::span<const io::scalar> span() const noexcept { return {items.data(), size}; }
  operator std::span<const io::scalar>() const noexcept { return span(); }
};

/// Rolling rates and summaries over steps. Single-threaded (the training loop). Never throws.
class step_metrics {
 public:
  explicit step_metrics(metrics_config cfg = {}) : cfg_(cfg) {
    cfg_.window = std::clamp<std::size_t>(cfg_.window, 1, ring_.size());
  }

  /// Adds a finished step; returns it with the rolling rates.
  step_record record(const step_report& r, const step_breakdown& t) noexcept {
    ring_[head_] = {t.total, r.tokens};
    head_ = (head_ + 1) % cfg_.window;
    filled_ = std::min(filled_ + 1, cfg_.window);
    double secs = 0;
    std::int64_t toks = 0;
    for (std::size_t i = 0; i < filled_; ++i) {
      secs += ring_[i].seconds;
      toks += ring_[i].tokens;
    }
    step_record out{r, t};
    out.step_seconds = secs / double(filled_);
    out.tokens_per_second = secs > 0 ? double(toks) / secs : 0;
    if (cfg_.flops_per_token > 0 && cfg_.peak_flops > 0)
      out.mfu = mfu(cfg_.flops_per_token, out.tokens_per_second, cfg_.peak_flops);
    if (cfg_.total_steps > 0)
      out.eta_seconds = double(std::max<std::int64_t>(0, cfg_.total_steps - (r.step + 1))) * out.step_seconds;

    if (sum_.steps == 0) {
      sum_.first_step = r.step;
      sum_.min_step = sum_.max_step = t.total;
    }
    sum_.last_step = r.step;
    ++sum_.steps;
    for (std::size_t i = 0; i < phase_count; ++i) sum_.seconds[i] += t.seconds[i];
    sum_.total += t.total;
    sum_.min_step = std::min(sum_.min_step, t.total);
    sum_.max_step = std::max(sum_.max_step, t.total);
    sum_.tokens += r.tokens;
    return out;
  }

  /// Phases since the last reset_summary().
  const step_summary& summary() const noexcept { return sum_; }
  void reset_summary() noexcept { sum_ = {}; }
  const metrics_config& config() const noexcept { return cfg_; }

  /// The scalars of one step for TensorBoard / JSON lines (same tags in both):
  ///   train/loss train/lr train/grad_norm train/loss_scale train/skipped   (NaN ones omitted)
  ///   perf/step_ms perf/tokens_per_s perf/mfu
  ///   time/<phase>_ms for each phase (this step, not averaged)
  ///   memory/<kind>_mib, memory/tracked_peak_mib         if `mem` is given
  ///   memory/rss_mib, memory/rss_peak_mib                if `os` is given and available
  static scalar_list scalars(const step_record& s, const memory_snapshot* mem = nullptr,
                             const process_memory* os = nullptr) noexcept {
    scalar_list l;
    auto maybe = [&](std::string_view tag, double v) {
      if (!std::isnan(v)) l.push(tag, v);
    };
    maybe("train/loss", s.report.loss);
    maybe("train/lr", s.report.lr);
    maybe("train/grad_norm", s.report.grad_norm);
    maybe("train/loss_scale", s.report.loss_scale);
    l.push("train/skipped", s.report.skipped ? 1.0 : 0.0);
    l.push("perf/step_ms", 1e3 * s.time.total);
    l.push("perf/tokens_per_s", s.tokens_per_second);
    maybe("perf/mfu", s.mfu);
    constexpr std::array<std::string_view, phase_count> time_tags{
        "time/data_wait_ms", "time/h2d_copy_ms", "time/forward_ms", "time/backward_ms",
        "time/exposed_comm_ms", "time/optimizer_ms", "time/other_ms"};
    for (std::size_t i = 0; i < phase_count; ++i) l.push(time_tags[i], 1e3 * s.time.seconds[i]);
    constexpr double mib = 1.0 / (1024.0 * 1024.0);
    if (mem) {
      constexpr std::array<std::string_view, memory_kind_count> mem_tags{
          "memory/parameters_mib", "memory/gradients_mib", "memory/optimizer_mib",
          "memory/activations_mib", "memory/workspace_mib", "memory/other_mib"};
      for (std::size_t i = 0; i < memory_kind_count; ++i) l.push(mem_tags[i], double(mem->current[i]) * mib);
      l.push("memory/tracked_peak_mib", double(mem->total_peak) * mib);
    }
    if (os && os->available) {
      l.push("memory/rss_mib", double(os->rss) * mib);
      l.push("memory/rss_peak_mib", double(os->peak_rss) * mib);
    }
    return l;
  }

 private:
  struct sample {
    double seconds = 0;
    std::int64_t tokens = 0;
  };
  metrics_config cfg_;
  std::array<sample, 256> ring_{};
  std::size_t head_ = 0, filled_ = 0;
  step_summary sum_{};
};

}  // namespace loom::train
