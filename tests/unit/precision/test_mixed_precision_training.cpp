// Mixed-precision training: the dynamic loss scaler on its own; fp16 with forced overflows
// (exactly those steps skipped, the scale halves, parameters bitwise unchanged, training goes
// on); bf16 master weights keep updates below bf16 resolution; 200 steps on tinyshakespeare
// in bf16 and fp16 track the fp32 loss curve.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <loom/data/byte_dataset.hpp>
#include <loom/data/sampler.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

#include "../data/paths.hpp"
#include "../snapshot.hpp"

using namespace loom;

namespace {

template <class Prec>
using cpu_policy = policy<device::cpu, Prec>;

std::vector<std::int32_t> random_windows(std::size_t rows, std::size_t window, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> w(rows * window);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(vocab, seed, 3, i));
  return w;
}

using loom_test::bitwise_equal;
using loom_test::copy_of;

}  // namespace

TEST_CASE("dynamic_loss_scaler: halves on overflow down to the floor, doubles after the interval, warns on a trend") {
  precision::loss_scaler_config cfg;
  cfg.initial_scale = 512;
  cfg.growth_interval = 3;
  cfg.min_scale = 64;
  cfg.warn_reductions = 2;
  cfg.warn_window = 10;
  precision::dynamic_loss_scaler s(cfg);
  CHECK(s.scale() == 512);
  CHECK(s.update(false, 0).empty());
  CHECK(s.scale() == 256);
  CHECK(s.update(false, 1).empty());
  CHECK(s.scale() == 128);
  const std::string w = s.update(false, 2);  // third reduction within 10 steps: > 2
  CHECK(s.scale() == 64);
  CHECK(w.find("step 2") != std::string::npos);
  CHECK(w.find("reduced 3 times") != std::string::npos);
  CHECK_FALSE(s.update(false, 3).empty());
  CHECK(s.scale() == 64);  // the floor
  for (long k = 4; k < 6; ++k) CHECK(s.update(true, k).empty());
  CHECK(s.scale() == 64);
  CHECK(s.state().good_steps == 2);
  s.update(true, 6);  // third good step in a row: grow
  CHECK(s.scale() == 128);
  CHECK(s.state().good_steps == 0);
  CHECK(s.update(false, 20).empty());  // the old reductions left the window
  CHECK(s.scale() == 64);
  s.set_state({1024, 1});
  CHECK(s.scale() == 1024);
  CHECK(s.state().good_steps == 1);
  CHECK_THROWS_AS(s.set_state({0, 0}), input_error);
  cfg.backoff_factor = 1.5;
  CHECK_THROWS_WITH_AS(precision::dynamic_loss_scaler{cfg}, doctest::Contains("backoff_factor"), input_error);
  CHECK(precision::dynamic_loss_scaler{}.scale() == 512);  // the Ascend guide's default
  CHECK(precision::dynamic_loss_scaler{}.config().growth_interval == 2000);
}

TEST_CASE("fp16 trainer: forced overflows skip exactly those steps, halve the scale, leave the state bitwise alone") {
  using M = models::tiny;
  using P = cpu_policy<precision::fp16>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {3e-3, 3e-4, 2, 20};
  train::trainer<M, P, 2, 8, parallel::local_group, kernels::fused, precision::dynamic_loss_scaler> tr(ctx, cfg);
  CHECK(tr.loss_scaler().scale() == 512);
  const auto w = random_windows(2, 9, M::vocab, 5);
  // 2^40 makes dlogits = S/16 (p - y) overflow half (max 65504); 2^39 still does.
  const double huge = 0x1p40;
  const std::vector<int> forced = {3, 6, 7};
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < 12; ++s) {
    CAPTURE(s);
    const bool force = std::find(forced.begin(), forced.end(), s) != forced.end();
    const bool resumes = s > 0 && std::find(forced.begin(), forced.end(), s - 1) != forced.end() && !force;
    if (force && !(s == 7)) tr.loss_scaler().set_state({huge, 5});  // step 7 keeps step 6's halved 2^39
    if (resumes) tr.loss_scaler().set_state({512, 0});
    const auto params = copy_of(tr.model().parameters());
    const auto masters = copy_of(tr.optimizer().master_weights());
    const auto m = copy_of(tr.optimizer().first_moment());
    const auto v = copy_of(tr.optimizer().second_moment());
    const long opt_step = tr.optimizer().step();
    const double scale = tr.loss_scaler().scale();
    const auto r = tr.step(ctx, w);
    CHECK(r.loss_scale == scale);
    CHECK(std::isfinite(r.loss));
    CHECK(r.skipped == force);
    if (force) {
      CHECK(tr.loss_scaler().scale() == scale / 2);  // halves each time: 2^40 -> 2^39 -> 2^38
      CHECK(tr.loss_scaler().state().good_steps == 0);
      CHECK(bitwise_equal(params, tr.model().parameters()));
      CHECK(bitwise_equal(masters, tr.optimizer().master_weights()));
      CHECK(bitwise_equal(m, tr.optimizer().first_moment()));
      CHECK(bitwise_equal(v, tr.optimizer().second_moment()));
      CHECK(tr.optimizer().step() == opt_step);  // and so the schedule: it follows the optimizer
    } else {
      CHECK(std::isfinite(r.grad_norm));
      CHECK(tr.loss_scaler().scale() == 512);
      CHECK_FALSE(bitwise_equal(params, tr.model().parameters()));
      CHECK(tr.optimizer().step() == opt_step + 1);
      CHECK(r.lr == cfg.schedule(opt_step));  // no schedule step lost to the skipped ones
    }
    if (s == 0) first_loss = r.loss;
    if (!force) last_loss = r.loss;
  }
  CHECK(tr.step_count() == 12);
  CHECK(tr.optimizer().step() == 12 - long(forced.size()));
  CHECK(last_loss < first_loss);  // training continued: the same batch, learned
}

TEST_CASE("bf16 master weights: updates below bf16 resolution still move the parameters") {
  // lr 1e-5: an AdamW step moves a weight by about lr, while bf16 spaces weights of size
  // 0.02 about 2^-6 * 2^-7 = 1.2e-4 apart, so a bf16-only update rounds back to the same weight.
  using M = models::tiny;
  using P = cpu_policy<precision::bf16>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {1e-5, 1e-5, 0, 1};
  cfg.adamw.weight_decay = 0;
  train::trainer<M, P, 2, 8> tr(ctx, cfg);
  const auto w = random_windows(2, 9, M::vocab, 9);
  const auto start = copy_of(tr.model().parameter(models::param::qkv_w));
  // the same AdamW steps applied to the bf16 weights directly (no master copy), same gradients
  auto direct = start;
  std::vector<float> m(start.size()), v(start.size());
  std::vector<Eigen::bfloat16> g16(start.size());
  for (int s = 0; s < 30; ++s) {
    const auto r = tr.step(ctx, w);
    REQUIRE_FALSE(r.skipped);
    const auto g = tr.model().gradient(models::param::qkv_w);
    for (std::size_t i = 0; i < g.size(); ++i) g16[i] = Eigen::bfloat16(g[i]);
    kernels::cpu::adamw_update(direct.data(), m.data(), v.data(), g16.data(), direct.size(), 1e-5f, 0.9f, 0.95f, 1e-8f,
                               0.0f, float(optim::clip_coefficient(r.grad_norm, 1.0)), long(s + 1));
  }
  std::size_t moved = 0, moved_direct = 0;
  const auto now = tr.model().parameter(models::param::qkv_w);
  for (std::size_t i = 0; i < start.size(); ++i) {
    moved += now[i] != start[i];
    moved_direct += direct[i] != start[i];
  }
  MESSAGE("30 AdamW steps at lr 1e-5 moved " << moved << " of " << start.size() << " bf16 qkv weights with fp32 masters, "
                                             << moved_direct << " without");
  CHECK(moved > start.size() * 8 / 10);
  CHECK(moved_direct < start.size() * 2 / 10);  // only weights below ~2.5e-3, whose bf16 spacing is finer than lr
}

namespace {

/// Per-step training losses of `steps` steps of char_tiny on tinyshakespeare's bytes (the
/// same windows for every precision).
template <class Prec, class Scaler>
std::vector<double> shakespeare_losses(int steps) {
  using M = models::char_tiny;
  constexpr int B = 8, T = 32;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {3e-3, 3e-4, 10, steps};
  train::trainer<M, cpu_policy<Prec>, B, T, parallel::local_group, kernels::fused, Scaler> tr(ctx, cfg);
  const data::byte_dataset text(loom_test::data_dir() / "tinyshakespeare.txt", T + 1);
  data::window_sampler sampler(text.train().size(), T + 1, 1234);
  std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    sampler.next(std::span<const std::uint8_t>(text.train()), std::span(w));
    const auto r = tr.step(ctx, w);
    REQUIRE_FALSE(r.skipped);
    losses.push_back(r.loss);
  }
  return losses;
}

/// The 20-step means of a loss curve, as text ("5.41 4.02 ...").
std::string window_means(const std::vector<double>& a) {
  std::string s;
  for (std::size_t i = 0; i + 20 <= a.size(); i += 20) {
    double sum = 0;
    for (std::size_t j = i; j < i + 20; ++j) sum += a[j];
    s += std::to_string(sum / 20).substr(0, 5) + " ";
  }
  return s;
}

/// Largest difference of the 20-step means of two loss curves.
double curve_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i + 20 <= a.size(); i += 20) {
    double sa = 0, sb = 0;
    for (std::size_t j = i; j < i + 20; ++j) sa += a[j], sb += b[j];
    worst = std::max(worst, std::abs(sa - sb) / 20);
  }
  return worst;
}

}  // namespace

TEST_CASE("200 steps on tinyshakespeare: bf16 and fp16 track the fp32 loss curve") {
  const int steps = 200;
  const auto f32 = shakespeare_losses<precision::fp32, precision::no_loss_scaler>(steps);
  const auto b16 = shakespeare_losses<precision::bf16, precision::no_loss_scaler>(steps);
  const auto f16 = shakespeare_losses<precision::fp16, precision::dynamic_loss_scaler>(steps);
  const double db = curve_distance(b16, f32), dh = curve_distance(f16, f32);
  MESSAGE("loss fp32 " << f32.front() << " -> " << f32.back() << "; 20-step means differ from fp32 by at most " << db
                       << " (bf16), " << dh << " (fp16) nats\n20-step means: fp32 " << window_means(f32) << "\n"
                       << "               bf16 " << window_means(b16) << "\n               fp16 " << window_means(f16));
  CHECK(f32.back() < f32.front() - 1.0);  // it learned something
  CHECK(b16.back() < b16.front() - 1.0);
  // measured (2-core boxes, 1 and 2 threads): fp16 0.004-0.058 nats; bf16 0.042-0.067 on AMD
  // Zen 5 and Intel Xeon, but 0.178 on AMD Zen 4 at -O2/-O3 and 0.045 there at -O1 (the test's
  // own code compiled without FMA contraction): the bf16 curve leaves fp32's after step ~120
  // (20-step means 3.11 vs 2.95 at step 180) or not, depending on last-bit differences
  // elsewhere. bf16's 8-bit mantissa makes that trajectory sensitive; why it separates on one
  // side is an open question (docs/precision.md). The bound catches a broken bf16 path (a wrong
  // rounding or a lost master weight moves the curve by more than 0.5 nats).
  CHECK(db < 0.25);
  CHECK(dh < 0.06);
}
