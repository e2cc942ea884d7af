// bench_step_timer — what the always-on step breakdown costs: real training steps (forward,
// backward, AdamW on the CPU) timed from outside, with the breakdown on (train::step_timer fed
// by the trainer's on_phase hook, as train_gpt does, plus step_metrics::record) and compiled
// out (train::null_step_timer, no hook, no record), in one process. The two variants alternate
// in blocks of steps, so machine load (other processes) hits both alike.
//
//   build/bench/bench_step_timer [--blocks N] [--steps-per-block K] [--trace]
//
// --trace measures the timeline profiler instead (io::trace_recorder + io::trace_observer, as
// train_gpt --profile-steps attaches them): "off" = no profile (context::hook null, the phase hook
// feeding the step timer only), "on" = recording every kernel and phase zone. Prints ms/step off
// and on, the recorder's own measured time per step (trace_stats::recorder_seconds), events per
// step, and the off-cost: kernel calls per step times a null-hook kernel_scope (timed alone).
// char_tiny only: its 2.4 ms step (idle machine) is where a per-kernel cost shows most.
//
// Prints per config: median ms/step on and off, their ratio (with the spread of the per-block
// ratios), and the instrumentation alone (the same calls without the work) per step, as a
// fraction of the step: the robust figure when the machine is noisy. The budget: < 1 %.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/io/trace.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

/// One step with the breakdown on: what train_gpt does around tr.step().
template <class Tr>
double step_on(Tr& tr, loom::context<loom::device::cpu>& ctx, std::span<const std::int32_t> w,
               loom::train::step_timer& timer, loom::train::step_metrics& metrics, long step) {
  using namespace loom::train;
  const auto t0 = clock_type::now();
  timer.begin_step();
  { auto d = timer.scope(phase::data_wait); }
  const auto r = tr.step(ctx, w);
  const auto rec = metrics.record({.step = step, .tokens = r.tokens, .loss = r.loss, .lr = r.lr, .grad_norm = r.grad_norm},
                                  timer.end_step());
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  if (rec.time.total < 0) std::abort();  // keep the record alive
  return ms;
}

/// One step with the breakdown compiled out.
template <class Tr>
double step_off(Tr& tr, loom::context<loom::device::cpu>& ctx, std::span<const std::int32_t> w,
                loom::train::null_step_timer& timer) {
  using namespace loom::train;
  const auto t0 = clock_type::now();
  timer.begin_step();
  { auto d = timer.scope(phase::data_wait); }
  (void)tr.step(ctx, w);
  (void)timer.end_step();
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// The fp32 trainer both comparisons time (a constant-ish learning rate), and one step's windows
/// of random token ids.
template <class M, int B, int T>
struct timed_trainer {
  using trainer_t = loom::train::trainer<M, loom::policy<loom::device::cpu, loom::precision::fp32>, B, T>;
  static loom::train::trainer_config config() {
    loom::train::trainer_config cfg;
    cfg.schedule = {1e-3, 1e-4, 10, 1000000};
    return cfg;
  }
  static std::vector<std::int32_t> windows(const trainer_t& tr) {
    std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(loom::random_below(M::vocab, 1, 0, i));
    return w;
  }
  loom::context<loom::device::cpu> ctx;
  trainer_t tr{ctx, config()};
  std::vector<std::int32_t> w = windows(tr);
};

template <class M, int B, int T>
void run(int blocks, int per_block) {
  using namespace loom;
  timed_trainer<M, B, T> setup;
  auto& ctx = setup.ctx;
  auto& tr = setup.tr;
  const auto& w = setup.w;

  train::step_timer timer;
  train::null_step_timer null_timer;
  train::step_metrics metrics({.flops_per_token = 1e6, .peak_flops = 1e11, .total_steps = 1000000});
  long hooks = 0;
  auto hook = [&](train::phase p, bool begin) {
    ++hooks;
    if (begin) timer.enter(p);
    else timer.leave();
  };
  for (int i = 0; i < 3; ++i) (void)tr.step(ctx, w);  // warm-up: first touch, thread pool

  std::vector<double> on, off, ratios;
  long step = 0;
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> blk_on, blk_off;
    for (int half = 0; half < 2; ++half) {
      const bool with = (half == 0) == (b % 2 == 0);  // alternate which variant goes first
      if (with) tr.on_phase = hook;
      else tr.on_phase = nullptr;
      for (int k = 0; k < per_block; ++k) {
        if (with) blk_on.push_back(step_on(tr, ctx, w, timer, metrics, step++));
        else blk_off.push_back(step_off(tr, ctx, w, null_timer));
      }
    }
    ratios.push_back(median(blk_on) / median(blk_off));
    on.insert(on.end(), blk_on.begin(), blk_on.end());
    off.insert(off.end(), blk_off.begin(), blk_off.end());
  }
  const long hooks_per_step = hooks / std::max(1L, step);

  // the instrumentation alone: the same calls per step without the work
  tr.on_phase = hook;
  constexpr int reps = 200000;
  const auto t0 = clock_type::now();
  double sink = 0;
  for (int i = 0; i < reps; ++i) {
    timer.begin_step();
    { auto d = timer.scope(train::phase::data_wait); }
    for (long h = 0; h < hooks_per_step; h += 2) {
      tr.on_phase(train::phase::forward, true);
      tr.on_phase(train::phase::forward, false);
    }
    sink += metrics.record({.step = i, .tokens = 1, .loss = 1, .lr = 1, .grad_norm = 1}, timer.end_step()).tokens_per_second;
  }
  const double alone_us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / reps;
  if (sink < 0) std::abort();

  std::sort(ratios.begin(), ratios.end());
  const double m_on = median(on), m_off = median(off);
  std::printf("| %-10s | %2d x %3d | %5d x %2d | %9.3f | %9.3f | %+7.2f %% | %+6.2f .. %+6.2f %% | %3ld | %7.2f | %8.4f %% |\n",
              std::string(M::name).c_str(), B, T, blocks, per_block, m_on, m_off, 100 * (m_on / m_off - 1),
              100 * (ratios[ratios.size() / 4] - 1), 100 * (ratios[ratios.size() * 3 / 4] - 1), hooks_per_step, alone_us,
              100 * alone_us / (1e3 * m_off));
  std::fflush(stdout);
}

/// The timeline profiler on (recording kernels and phases) vs off (no hook), alternating blocks.
template <class M, int B, int T>
void run_trace(int blocks, int per_block) {
  using namespace loom;
  timed_trainer<M, B, T> setup;
  auto& ctx = setup.ctx;
  auto& tr = setup.tr;
  const auto& w = setup.w;
  io::trace_recorder rec({.window = {0, 1L << 40}, .max_events = std::size_t(1) << 22});
  io::trace_observer obs(rec);
  train::step_timer timer;
  std::array<double, train::phase_count> began{};
  bool tracing = false;
  tr.on_phase = [&](train::phase p, bool begin) {  // as train_gpt: step timer always, trace zones when profiling
    if (begin) {
      timer.enter(p);
      began[std::size_t(p)] = io::trace_recorder::now_us();
    } else {
      timer.leave();
      if (tracing) rec.complete(train::phase_name(p), "step", began[std::size_t(p)], io::trace_recorder::now_us() - began[std::size_t(p)]);
    }
  };
  for (int i = 0; i < 3; ++i) (void)tr.step(ctx, w);  // warm-up
  std::vector<double> on, off, ratios;
  long step = 0, traced_steps = 0;
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> blk_on, blk_off;
    for (int half = 0; half < 2; ++half) {
      tracing = (half == 0) == (b % 2 == 0);
      ctx.hook = tracing ? &obs : nullptr;
      for (int k = 0; k < per_block; ++k) {
        const auto t0 = clock_type::now();
        if (tracing) rec.begin_step(step);
        timer.begin_step();
        {
          auto d = timer.scope(train::phase::data_wait);
          const auto z = rec.zone("data_wait", "data");  // inert unless recording
        }
        (void)tr.step(ctx, w);
        (void)timer.end_step();
        ++step;
        const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        (tracing ? blk_on : blk_off).push_back(ms);
        traced_steps += tracing;
      }
    }
    ratios.push_back(median(blk_on) / median(blk_off));
    on.insert(on.end(), blk_on.begin(), blk_on.end());
    off.insert(off.end(), blk_off.begin(), blk_off.end());
  }
  const auto st = rec.stats();
  // kernel calls per step: the kernel zones recorded / traced steps
  std::size_t kernel_events = 0;
  const auto doc = rec.to_json();
  for (const auto& e : doc["traceEvents"]) kernel_events += e.value("cat", std::string()) == "kernel";
  const double kernels_per_step = double(kernel_events) / double(std::max(1L, traced_steps));
  // the off-cost: a kernel_scope with a null hook around an opaque call, alone
  constexpr int reps = 20000000;
  kernel_hook* volatile null_hook = nullptr;
  volatile int sink = 0;
  const auto t0 = clock_type::now();
  for (int i = 0; i < reps; ++i) {
    const kernel_scope k(null_hook, "matmul_forward");
    sink = sink + 1;
  }
  const auto t1 = clock_type::now();
  for (int i = 0; i < reps; ++i) sink = sink + 1;
  const double scope_ns =
      std::max(0.0, (std::chrono::duration<double, std::nano>(t1 - t0) - std::chrono::duration<double, std::nano>(clock_type::now() - t1)).count() / reps);
  std::sort(ratios.begin(), ratios.end());
  const double m_on = median(on), m_off = median(off);
  const double rec_us = 1e6 * st.recorder_seconds / double(std::max(1L, traced_steps));
  std::printf("| %-10s | %2d x %3d | %5d x %2d | %9.3f | %9.3f | %+7.2f %% | %+6.2f .. %+6.2f %% | %7.0f | %8.1f | %6.2f %% | %5.0f | %7.4f | %8.5f %% |\n",
              std::string(M::name).c_str(), B, T, blocks, per_block, m_off, m_on, 100 * (m_on / m_off - 1),
              100 * (ratios[ratios.size() / 4] - 1), 100 * (ratios[ratios.size() * 3 / 4] - 1),
              double(st.events) / double(std::max(1L, traced_steps)), rec_us, 100 * rec_us / (1e3 * m_off), kernels_per_step,
              scope_ns, 100 * kernels_per_step * scope_ns * 1e-6 / m_off);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  int blocks = 40, per_block = 10;
  bool trace = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--trace") {
      trace = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) break;
    if (a == "--blocks") blocks = std::max(2, std::atoi(argv[i + 1]));
    else if (a == "--steps-per-block") per_block = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "bench_step_timer: unknown flag %s; use --blocks N --steps-per-block K [--trace]\n", a.c_str());
      return 2;
    }
  }
  std::printf("load average before: %s\n", load_average().c_str());
  if (trace) {
    std::printf("| config     | B x T    | blocks x K | off ms/step | on ms/step | on/off - 1 | per-block IQR      | events/step | recorder µs/step | recorder/step | kernels/step | null hook ns | off cost/step |\n");
    std::printf("|------------|----------|------------|-------------|------------|------------|--------------------|-------------|------------------|---------------|--------------|--------------|---------------|\n");
    run_trace<loom::models::char_tiny, 8, 32>(blocks, per_block);  // the smallest step: the largest relative cost
    std::printf("load average after: %s\n", load_average().c_str());
    return 0;
  }
  std::printf("| config     | B x T    | blocks x K | on ms/step | off ms/step | on/off - 1 | per-block IQR      | hooks | alone µs | alone/step |\n");
  std::printf("|------------|----------|------------|-----------|-----------|-----------|--------------------|-------|---------|------------|\n");
  run<loom::models::char_tiny, 8, 32>(blocks, per_block);
  run<loom::models::quickstart, 16, 128>(blocks, per_block);
  std::printf("load average after: %s\n", load_average().c_str());
  return 0;
}
