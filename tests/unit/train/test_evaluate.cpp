// Evaluation covers every window it is given, once: trainer::evaluate and
// parallel_trainer::evaluate over a number of windows that is not a multiple of the
// micro-batch give the token-weighted mean loss of all of them (a float64 model with the same
// weights, one window at a time, is the reference), whatever the micro-batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/trainer.hpp>
#include <loom/train/trainer.hpp>

using namespace loom;

namespace {

template <class M>
std::vector<std::int32_t> eval_windows(std::size_t rows, std::size_t window, std::uint64_t seed) {
  std::vector<std::int32_t> w(rows * window);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, seed, 5, i));
  return w;
}

/// Mean loss per target token over every window, in float64, one window at a time, with the
/// parameters `params` (the single-rank parameter order of M).
template <class M, int T>
double reference_mean_loss(std::span<const float> params, const std::vector<std::int32_t>& windows, int t) {
  using P64 = policy<device::cpu, precision::fp64>;
  context<device::cpu> ctx;
  nn::transformer<M, P64> model(ctx, 1);
  std::transform(params.begin(), params.end(), model.parameters().begin(), [](float x) { return double(x); });
  typename nn::transformer<M, P64>::template activations<1, T> acts(ctx);
  const std::size_t w = std::size_t(t) + 1, rows = windows.size() / w;
  double sum = 0;
  std::vector<std::int32_t> in(static_cast<std::size_t>(t)), tg(in.size());
  for (std::size_t r = 0; r < rows; ++r) {
    train::split_windows(std::span(windows).subspan(r * w, w), std::size_t(t), std::span(in), std::span(tg));
    sum += model.forward(ctx, acts, in.data(), tg.data(), 1, t);
  }
  return sum / double(rows * std::size_t(t));
}

train::trainer_config eval_config(int micro_batch, int seq_len) {
  train::trainer_config cfg;
  cfg.micro_batch = micro_batch;
  cfg.seq_len = seq_len;
  cfg.schedule = {3e-3, 3e-4, 2, 10};
  return cfg;
}

}  // namespace

TEST_CASE("trainer::evaluate: 7 windows in micro-batches of 1..4 all count; the float64 mean, whatever the micro-batch") {
  using M = models::tiny;
  using P = policy<device::cpu, precision::fp32>;
  constexpr int B = 4, T = 13;
  const int t = 11;  // shorter than the capacity
  context<device::cpu> ctx;
  const auto train_batch = eval_windows<M>(4, t + 1, 3);
  const auto windows = eval_windows<M>(7, t + 1, 9);  // 7: not a multiple of 2, 3 or 4
  std::vector<double> got;
  std::vector<float> params;
  for (int b : {1, 2, 3, 4}) {
    CAPTURE(b);
    auto cfg = eval_config(b, t);
    cfg.grad_accum = 4 / b;  // the same global batch, so the same weights after one step
    if (b == 3) cfg.grad_accum = 1;
    train::trainer<M, P, B, T> tr(ctx, cfg);
    if (b != 3) tr.step(ctx, train_batch);
    if (b == 1) params.assign(tr.model().parameters().begin(), tr.model().parameters().end());
    if (b == 3) {  // untrained weights: its own reference
      const std::vector<float> p0(tr.model().parameters().begin(), tr.model().parameters().end());
      const double ref0 = reference_mean_loss<M, T>(p0, windows, t);
      CHECK(std::abs(tr.evaluate(ctx, windows) - ref0) <= 2e-6 * ref0);
      CHECK(std::abs(tr.evaluate(ctx, std::span(windows).first(2 * std::size_t(t + 1))) -
                     reference_mean_loss<M, T>(p0, std::vector<std::int32_t>(windows.begin(), windows.begin() + 2 * (t + 1)), t)) <=
            2e-6 * ref0);  // fewer windows than one micro-batch
      continue;
    }
    got.push_back(tr.evaluate(ctx, windows));
  }
  const double ref = reference_mean_loss<M, T>(params, windows, t);
  CHECK(ref > 1.0);
  for (const double g : got) CHECK(std::abs(g - ref) <= 2e-6 * ref);
  train::trainer<M, P, B, T> tr(ctx, eval_config(3, t));
  CHECK_THROWS_AS(tr.evaluate(ctx, {}), input_error);
  CHECK_THROWS_AS(tr.evaluate(ctx, std::span(windows).first(windows.size() - 1)), input_error);  // not whole windows
}

TEST_CASE("parallel_trainer::evaluate (TP 2, PP 2): 5 windows in micro-batches of 2 all count; the float64 mean") {
  using M = models::tiny_parallel;
  constexpr int B = 2, T = 8;
  using trainer_t = train::trainer<M, policy<device::cpu, precision::fp32, parallel::layout<2, 2>>, B, T, comm::threads>;
  const auto windows = eval_windows<M>(5, T + 1, 21);
  std::vector<double> evals(4), evals_one(4);
  std::vector<float> params;
  comm::run_threads(4, [&](comm::threads& w) {
    context<device::cpu> ctx;
    trainer_t tr(ctx, eval_config(B, T), w);
    evals[std::size_t(w.rank())] = tr.evaluate(ctx, windows);
    evals_one[std::size_t(w.rank())] = tr.evaluate(ctx, std::span(windows).first(T + 1));
    const auto global = nn::gather_parameters(ctx, tr.model(), tr.tp_group(), tr.pp_group());
    if (w.rank() == 0) params.assign(global.begin(), global.end());
  });
  const double ref = reference_mean_loss<M, T>(params, windows, T);
  const double ref_one = reference_mean_loss<M, T>(params, std::vector<std::int32_t>(windows.begin(), windows.begin() + T + 1), T);
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(std::abs(evals[std::size_t(r)] - ref) <= 2e-6 * ref);
    CHECK(std::abs(evals_one[std::size_t(r)] - ref_one) <= 2e-6 * ref_one);
    CHECK(evals[std::size_t(r)] == evals[0]);
  }
}
