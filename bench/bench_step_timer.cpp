// bench_step_timer — what the always-on step breakdown costs: real training steps (forward,
// backward, AdamW on the CPU) timed from outside, with the breakdown on (train::step_timer fed
// by the trainer's on_phase hook, as train_gpt does, plus step_metrics::record) and compiled
// out (train::null_step_timer, no hook, no record), in one process. The two variants alternate
// in blocks of steps, so machine load (other processes) hits both alike.
//
//   build/bench/bench_step_timer [--blocks N] [--steps-per-block K]
//
// Prints per config: median ms/step on and off, their ratio (with the spread of the per-block
// ratios), and the instrumentation alone (the same calls without the work) per step, as a
// fraction of the step: the robust figure when the machine is noisy. The budget: < 1 %.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <loom/device/cpu.hpp>
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

template <class M, int B, int T>
void run(int blocks, int per_block) {
  using namespace loom;
  using P = policy<device::cpu, precision::fp32>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {1e-3, 1e-4, 10, 1000000};
  train::trainer<M, P, B, T> tr(ctx, cfg);
  std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 1, 0, i));

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

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  int blocks = 40, per_block = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--blocks") blocks = std::max(2, std::atoi(argv[i + 1]));
    else if (a == "--steps-per-block") per_block = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "bench_step_timer: unknown flag %s; use --blocks N --steps-per-block K\n", a.c_str());
      return 2;
    }
  }
  std::printf("load average before: %s\n", load_average().c_str());
  std::printf("| config     | B x T    | blocks x K | on ms/step | off ms/step | on/off - 1 | per-block IQR      | hooks | alone µs | alone/step |\n");
  std::printf("|------------|----------|------------|-----------|-----------|-----------|--------------------|-------|---------|------------|\n");
  run<loom::models::char_tiny, 8, 32>(blocks, per_block);
  run<loom::models::quickstart, 16, 128>(blocks, per_block);
  std::printf("load average after: %s\n", load_average().c_str());
  return 0;
}
