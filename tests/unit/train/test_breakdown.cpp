// The step breakdown on real training steps: the phases the trainer reports sum to the step's
// wall time measured from outside, each phase agrees with an independent clock around the
// trainer's hooks, and the hooks cover the work (little is left in `other`).
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>

using namespace loom;

TEST_CASE("step breakdown: phases of real trainer steps sum to the step time from an outside clock") {
  using M = models::char_tiny;
  using P = policy<device::cpu, precision::fp32>;
  using clock = std::chrono::steady_clock;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.micro_batch = 5;  // not the compiled capacity
  cfg.grad_accum = 3;
  cfg.schedule = {1e-3, 1e-4, 2, 100};
  train::trainer<M, P, 8, 32> tr(ctx, cfg);
  std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 7, 1, i));

  train::step_timer timer;
  std::array<double, train::phase_count> independent{};  // seconds, from the hooks' own clock reads
  clock::time_point opened{};
  int hooks = 0;
  tr.on_phase = [&](train::phase p, bool begin) {
    ++hooks;
    if (begin) {  // the outside reads enclose the timer's, so independent >= timer always
      opened = clock::now();
      timer.enter(p);
    } else {
      timer.leave();
      independent[std::size_t(p)] += std::chrono::duration<double>(clock::now() - opened).count();
    }
  };
  (void)tr.step(ctx, w);  // warm-up
  // Closeness is judged on the best of 5 steps: a preemption between two clock reads (other
  // processes on the machine) can widen one step's gap, not all five. The one-sided bounds
  // (an enclosing clock never measures less) hold on every step.
  constexpr std::array hooked{train::phase::h2d_copy, train::phase::forward, train::phase::backward, train::phase::optimizer};
  double best_outside_gap = 1;  // seconds by which the gap exceeds 3 %, best step
  double best_covered = 0;      // largest share of forward + backward + optimizer in a step
  std::array<double, hooked.size()> best_phase_gap;
  best_phase_gap.fill(1);
  for (int s = 0; s < 5; ++s) {
    independent = {};
    hooks = 0;
    const auto t0 = clock::now();
    timer.begin_step();
    std::vector<std::int32_t> batch;
    {
      auto d = timer.scope(train::phase::data_wait);
      batch = w;  // the "loader": a copy
    }
    (void)tr.step(ctx, batch);
    const train::step_breakdown b = timer.end_step();
    const double outside = std::chrono::duration<double>(clock::now() - t0).count();

    CAPTURE(s);
    CHECK(hooks == 2 * (2 * cfg.grad_accum + 2));  // h2d; forward, backward per micro-batch; optimizer
    double sum = 0;
    for (double x : b.seconds) sum += x;
    CHECK(sum == doctest::Approx(b.total).epsilon(1e-12));
    CHECK(sum <= outside);
    best_outside_gap = std::min(best_outside_gap, (outside - sum) - 0.03 * outside);
    for (std::size_t i = 0; i < hooked.size(); ++i) {
      const auto p = hooked[i];
      CAPTURE(train::phase_name(p));
      CHECK(b[p] > 0);
      CHECK(b[p] <= independent[std::size_t(p)]);
      const double own = independent[std::size_t(p)];
      best_phase_gap[i] = std::min(best_phase_gap[i], (own - b[p]) - 0.03 * own);
    }
    // the hooks cover the step: forward + backward + optimizer are most of it (best step: a
    // preemption inside another phase of one step is not the hooks' fault)
    best_covered = std::max(best_covered, (b[train::phase::forward] + b[train::phase::backward] +
                                           b[train::phase::optimizer]) / b.total);
    CHECK(b[train::phase::exposed_comm] == 0);
  }
  // the phases sum to the step time seen from outside, and each phase to its own clock, within
  // 3 % + 20 µs (the absolute part covers the clock reads and hook calls of the short h2d_copy)
  CHECK(best_outside_gap <= 20e-6);
  CHECK(best_covered > 0.8);
  for (double g : best_phase_gap) CHECK(g <= 20e-6);
}

namespace {
struct counting_clock {  // counts now() calls
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<counting_clock>;
  static constexpr bool is_steady = true;
  static inline int calls = 0;
  static time_point now() noexcept { return time_point(duration(++calls)); }
};
}  // namespace

TEST_CASE("step timer compiled out (Enabled = false): no clock reads, zero breakdowns") {
  train::basic_step_timer<counting_clock, false> off;
  train::basic_step_timer<counting_clock, true> on;
  auto run = [](auto& t) {
    t.begin_step();
    {
      auto s = t.scope(train::phase::forward);
      auto c = t.scope(train::phase::exposed_comm);
    }
    return t.end_step();
  };
  counting_clock::calls = 0;
  const auto b = run(off);
  CHECK(counting_clock::calls == 0);
  CHECK(b.total == 0);
  for (double x : b.seconds) CHECK(x == 0);
  const auto a = run(on);  // the enabled timer: begin, 2 enters, 2 leaves, end
  CHECK(counting_clock::calls == 6);
  CHECK(a.total == doctest::Approx(5e-9));
  CHECK(a[train::phase::exposed_comm] == doctest::Approx(1e-9));
}
