#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include <loom/models/configs.hpp>
#include <loom/train/metrics.hpp>

using loom::train::phase;

namespace {
/// A clock the test moves by hand, so that phase attribution can be checked exactly.
struct fake_clock {
  using duration = std::chrono::microseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<fake_clock>;
  static constexpr bool is_steady = true;
  static inline std::int64_t us = 0;
  static time_point now() noexcept { return time_point(duration(us)); }
  static void advance(std::int64_t d) noexcept { us += d; }
};

std::map<std::string, double> as_map(const loom::train::scalar_list& l) {
  std::map<std::string, double> m;
  for (const auto& s : l.span()) m[std::string(s.tag)] = s.value;
  return m;
}
}  // namespace

TEST_CASE("step_timer: exclusive nested phases, exact with a hand-moved clock") {
  fake_clock::us = 1'000'000;
  loom::train::basic_step_timer<fake_clock> t;
  t.begin_step();
  fake_clock::advance(100);  // other
  {
    auto s = t.scope(phase::data_wait);
    fake_clock::advance(2000);
  }
  {
    auto s = t.scope(phase::h2d_copy);
    fake_clock::advance(30);
  }
  {
    auto f = t.scope(phase::forward);
    fake_clock::advance(5000);
    {
      auto c = t.scope(phase::exposed_comm);  // TP all-reduce wait inside forward
      fake_clock::advance(700);
    }
    fake_clock::advance(300);
  }
  {
    auto b = t.scope(phase::backward);
    fake_clock::advance(9000);
    {
      auto c = t.scope(phase::exposed_comm);
      fake_clock::advance(1100);
    }
  }
  fake_clock::advance(50);  // other
  {
    auto o = t.scope(phase::optimizer);
    fake_clock::advance(1200);
  }
  fake_clock::advance(20);  // other
  const auto b = t.end_step();
  CHECK(b[phase::data_wait] == doctest::Approx(2000e-6).epsilon(1e-12));
  CHECK(b[phase::h2d_copy] == doctest::Approx(30e-6).epsilon(1e-12));
  CHECK(b[phase::forward] == doctest::Approx(5300e-6).epsilon(1e-12));
  CHECK(b[phase::exposed_comm] == doctest::Approx(1800e-6).epsilon(1e-12));
  CHECK(b[phase::backward] == doctest::Approx(9000e-6).epsilon(1e-12));
  CHECK(b[phase::optimizer] == doctest::Approx(1200e-6).epsilon(1e-12));
  CHECK(b[phase::other] == doctest::Approx(170e-6).epsilon(1e-9));
  CHECK(b.total == doctest::Approx(19500e-6).epsilon(1e-12));
  double sum = 0;
  for (double s : b.seconds) sum += s;
  CHECK(sum == b.total);

  // The next step starts clean; a step without a data scope has no data phase
  // (what --synthetic-data produces).
  t.begin_step();
  {
    auto f = t.scope(phase::forward);
    fake_clock::advance(10);
  }
  const auto b2 = t.end_step();
  CHECK(b2[phase::data_wait] == 0);
  CHECK(b2[phase::forward] == doctest::Approx(10e-6));
  CHECK(b2.total == doctest::Approx(10e-6));
}

TEST_CASE("step_timer: nesting deeper than the stack charges the deepest tracked phase") {
  fake_clock::us = 0;
  loom::train::basic_step_timer<fake_clock> t;
  t.begin_step();
  for (int i = 0; i < 15; ++i) t.enter(phase::forward);
  t.enter(phase::backward);  // depth 16: beyond the stack, still forward
  fake_clock::advance(5);
  t.leave();
  for (int i = 0; i < 15; ++i) t.leave();
  fake_clock::advance(3);
  const auto b = t.end_step();
  CHECK(b[phase::forward] == doctest::Approx(5e-6));
  CHECK(b[phase::backward] == 0);
  CHECK(b[phase::other] == doctest::Approx(3e-6));
}

TEST_CASE("step_timer: real clock, phases sum to the step time") {
  loom::train::step_timer t;
  t.begin_step();
  volatile double x = 0;
  for (int p = 0; p < 6; ++p) {
    auto s = t.scope(static_cast<phase>(p));
    for (int i = 0; i < 20000; ++i) x = x + 1.0;
  }
  const auto b = t.end_step();
  double sum = 0;
  for (double s : b.seconds) sum += s;
  CHECK(sum == doctest::Approx(b.total).epsilon(1e-12));
  CHECK(b.total > 0);
  for (int p = 0; p < 6; ++p) CHECK(b.seconds[p] > 0);
}

TEST_CASE("flops_per_token and MFU: hand-derived values for the benchmark configs") {
  using namespace loom::train;
  // bench_small: V=8192, d=384, L=6 -> 8192*384 + 6*(12*384^2 + 13*384) + 2*384
  static_assert(gpt_parameters_without_position<loom::models::bench_small>() == 3145728 + 6 * (1769472 + 4992) + 768);
  CHECK(gpt_parameters_without_position<loom::models::bench_small>() == 13793280);
  // GPT-2 small: Hugging Face reports 124,439,808 parameters with vocab 50257 and wpe 1024x768;
  // loom stores vocab_padded 50304 rows: +47*768.
  CHECK(gpt_parameters_without_position<loom::models::gpt2_small>() == 124439808 - 1024 * 768 + 47 * 768);
  // 6N + 12 L T d at T = 256
  CHECK(flops_per_token<loom::models::bench_small>(256) == 6.0 * 13793280 + 12.0 * 6 * 256 * 384);
  CHECK(flops_per_token<loom::models::bench_small>(256) == 89837568.0);
  // PyTorch at ~2900 tok/s on a 517 GFLOP/s machine is "about 50 %".
  CHECK(mfu(89837568.0, 2900.0, 517e9) == doctest::Approx(0.503928).epsilon(1e-5));
  CHECK(std::isnan(mfu(1.0, 1.0, 0.0)));
}

TEST_CASE("step_metrics: rolling tokens/s, MFU, ETA and the summary") {
  using namespace loom::train;
  step_metrics m({.flops_per_token = 1e6, .peak_flops = 1e10, .total_steps = 10, .window = 3});
  auto make = [](double secs) {
    step_breakdown b;
    b.seconds[std::size_t(phase::forward)] = secs * 0.25;
    b.seconds[std::size_t(phase::backward)] = secs * 0.5;
    b.seconds[std::size_t(phase::other)] = secs * 0.25;
    b.total = secs;
    return b;
  };
  const double secs[] = {0.4, 0.1, 0.2, 0.3, 0.5};
  const std::int64_t toks[] = {1000, 1000, 2000, 3000, 1000};
  step_record r;
  for (int i = 0; i < 5; ++i) r = m.record({.step = i, .tokens = toks[i], .loss = 3.0 - i, .lr = 1e-3}, make(secs[i]));
  // Window of 3: steps 2..4 -> 6000 tokens in 1.0 s.
  CHECK(r.tokens_per_second == doctest::Approx(6000.0));
  CHECK(r.step_seconds == doctest::Approx(1.0 / 3));
  CHECK(r.mfu == doctest::Approx(6000.0 * 1e6 / 1e10));
  CHECK(r.eta_seconds == doctest::Approx(5 * (1.0 / 3)));  // steps 5..9 remain
  const auto& s = m.summary();
  CHECK(s.steps == 5);
  CHECK(s.first_step == 0);
  CHECK(s.last_step == 4);
  CHECK(s.total == doctest::Approx(1.5));
  CHECK(s.min_step == doctest::Approx(0.1));
  CHECK(s.max_step == doctest::Approx(0.5));
  CHECK(s.tokens == 8000);
  CHECK(s.mean_ms(phase::backward) == doctest::Approx(1e3 * 0.75 / 5));
  CHECK(s.share(phase::forward) == doctest::Approx(0.25));
  m.reset_summary();
  CHECK(m.summary().steps == 0);
  r = m.record({.step = 5, .tokens = 10}, make(1.0));
  CHECK(m.summary().first_step == 5);
  CHECK(m.summary().min_step == doctest::Approx(1.0));
}

TEST_CASE("step_metrics::scalars: the tags every sink receives") {
  using namespace loom::train;
  step_record r;
  r.report = {.step = 3, .tokens = 100, .loss = 2.5, .lr = 6e-4, .grad_norm = 0.75};
  r.time.seconds[std::size_t(phase::forward)] = 0.012;
  r.time.total = 0.02;
  r.tokens_per_second = 5000;
  r.mfu = 0.42;
  loom::memory_counter c;
  c.add(loom::memory_kind::parameters, 3 << 20);
  c.add(loom::memory_kind::activations, 1 << 20);
  c.remove(loom::memory_kind::activations, 1 << 20);
  const auto snap = c.snapshot();
  const loom::process_memory os{.rss = 100 << 20, .peak_rss = 200 << 20, .available = true};
  const auto m = as_map(step_metrics::scalars(r, &snap, &os));
  CHECK(m.at("train/loss") == 2.5);
  CHECK(m.at("train/lr") == 6e-4);
  CHECK(m.at("train/grad_norm") == 0.75);
  CHECK(m.count("train/loss_scale") == 0);  // NaN: not reported
  CHECK(m.at("train/skipped") == 0);
  CHECK(m.at("perf/step_ms") == doctest::Approx(20));
  CHECK(m.at("perf/tokens_per_s") == 5000);
  CHECK(m.at("perf/mfu") == 0.42);
  CHECK(m.at("time/forward_ms") == doctest::Approx(12));
  CHECK(m.at("time/data_wait_ms") == 0);
  CHECK(m.at("memory/parameters_mib") == 3);
  CHECK(m.at("memory/activations_mib") == 0);
  CHECK(m.at("memory/tracked_peak_mib") == 4);
  CHECK(m.at("memory/rss_mib") == 100);
  CHECK(m.at("memory/rss_peak_mib") == 200);
  const auto bare = as_map(step_metrics::scalars(r));
  CHECK(bare.count("memory/rss_mib") == 0);
  CHECK(bare.count("time/other_ms") == 1);
}
