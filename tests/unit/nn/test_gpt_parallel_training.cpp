// 20 optimizer steps (AdamW, global-norm clipping active) of gpt_parallel on models::tiny_parallel
// give the single-rank loss curve, for (TP, PP, DP) = (2,1,1), (1,2,1), (2,2,1), (2,2,2), and
// the parameters after training match the single-rank ones gathered to global shape.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/gpt.hpp>
#include <loom/nn/gpt_parallel.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/parallel/comm_threads.hpp>

namespace {

using namespace loom;
using M = models::tiny_parallel;
using cpu = device::cpu;

constexpr int B = 2, T = 8, steps = 20;
constexpr double lr = 3e-3;
const optim::adamw_config adam{0.9, 0.95, 1e-8, 0.1, 0.5};  // max_grad_norm 0.5: clipping is active

/// Step s's global batch: `micro` micro-batches of (B, T), tokens drawn from a fixed pattern so
/// the model can learn (next token = (token * 7 + 3) mod vocab, with noise).
struct step_batch {
  std::vector<std::int32_t> in, tg;
  int valid = 0;
  step_batch(int s, int micro) : in(std::size_t(micro * B * T)), tg(in.size()) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = std::int32_t(random_below(M::vocab, 11, std::uint64_t(s), i));
      tg[i] = random_below(4, 12, std::uint64_t(s), i) == 0 ? std::int32_t(random_below(M::vocab, 13, std::uint64_t(s), i))
                                                            : std::int32_t((in[i] * 7 + 3) % M::vocab);
    }
    tg[5] = kernels::ignore_index;
    for (auto x : tg) valid += x != kernels::ignore_index;
  }
};

template <class Prec>
struct single_rank_curve {
  using model_t = nn::gpt<M, policy<cpu, Prec, layout<1, 1>>>;
  std::vector<double> losses, norms;
  std::vector<typename Prec::storage> params;
  explicit single_rank_curve(int micro) {
    context<cpu> ctx;
    model_t model(ctx, 2024);
    optim::adamw<model_t> opt(ctx, adam);
    typename model_t::template activations<B, T> acts(ctx);
    for (int s = 0; s < steps; ++s) {
      const step_batch data(s, micro);
      const auto scale = typename model_t::acc_t(1.0 / data.valid);
      model.zero_grad(ctx);
      double loss = 0;
      for (int i = 0; i < micro; ++i) {
        const std::size_t off = std::size_t(i) * B * T;
        loss += double(model.forward(ctx, acts, data.in.data() + off, data.tg.data() + off, B, T, scale));
        model.backward(ctx, acts, data.in.data() + off, B, T);
      }
      const double norm = optim::adamw<model_t>::grad_norm(ctx, model);
      opt.update(ctx, model, lr, optim::clip_coefficient(norm, adam.max_grad_norm));
      losses.push_back(loss / data.valid);
      norms.push_back(norm);
    }
    params.assign(model.parameters().begin(), model.parameters().end());
  }
};

template <class Prec, int TP, int PP, int DP>
void training_case(int micro_per_replica) {
  CAPTURE(TP);
  CAPTURE(PP);
  CAPTURE(DP);
  using model_t = nn::gpt_parallel<M, policy<cpu, Prec, layout<TP, PP>>>;
  using S = typename Prec::storage;
  const int m = micro_per_replica;
  const single_rank_curve<Prec> ref(m * DP);
  std::vector<std::vector<double>> losses(std::size_t(TP * PP * DP)), norms(losses.size());
  std::vector<std::vector<S>> params(losses.size());
  std::vector<int> tps(losses.size()), stages(losses.size());
  comm::run_threads(TP * PP * DP, [&](comm::threads& world) {
    auto g = parallel::make_groups<layout<TP, PP>>(world);
    context<cpu> ctx;
    model_t model(ctx, g.tp.rank(), g.pp.rank(), 2024);
    optim::adamw<model_t> opt(ctx, adam);
    using acts_t = typename model_t::template activations<B, T>;
    std::vector<acts_t> ring;
    for (int i = 0; i < parallel::max_in_flight(PP, m, g.pp.rank()); ++i) ring.emplace_back(ctx);
    const auto me = std::size_t(world.rank());
    for (int s = 0; s < steps; ++s) {
      const step_batch data(s, m * DP);
      const std::size_t off = std::size_t(g.dp.rank()) * m * B * T;
      model.zero_grad(ctx);
      auto loss = nn::pipeline_forward_backward<model_t, B, T>(
          ctx, model, std::span<acts_t>(ring), g.tp, g.pp, m, data.in.data() + off, data.tg.data() + off, B, T,
          typename model_t::acc_t(1.0 / data.valid));
      model.tie_embedding_gradients(ctx, g.pp);
      const auto grads = model.gradients();
      g.dp.all_reduce(std::span<S>(grads.data(), grads.size()), parallel::reduce_op::sum);
      g.dp.all_reduce(std::span<decltype(loss)>(&loss, 1), parallel::reduce_op::sum);
      const double norm = model.grad_norm(ctx, g.tp, g.pp);
      opt.update(ctx, model, lr, optim::clip_coefficient(norm, adam.max_grad_norm));
      losses[me].push_back(double(loss) / data.valid);
      norms[me].push_back(norm);
    }
    params[me].assign(model.parameters().begin(), model.parameters().end());
    tps[me] = g.tp.rank();
    stages[me] = g.pp.rank();
  });
  CHECK(ref.losses.back() < ref.losses.front() - 0.1);  // it trains (so the curve is not flat)
  CHECK(ref.norms.front() > adam.max_grad_norm);         // and clipping is active at the start
  double worst = 0;
  for (std::size_t r = 0; r < losses.size(); ++r)
    for (int s = 0; s < steps; ++s) {
      worst = std::max(worst, std::abs(losses[r][std::size_t(s)] / ref.losses[std::size_t(s)] - 1));
      CAPTURE(r);
      CAPTURE(s);
      CHECK(losses[r][std::size_t(s)] == doctest::Approx(ref.losses[std::size_t(s)]).epsilon(1e-5));
      CHECK(norms[r][std::size_t(s)] == doctest::Approx(ref.norms[std::size_t(s)]).epsilon(1e-4));
    }
  MESSAGE("layout (" << TP << "," << PP << "," << DP << "): loss " << ref.losses.front() << " -> " << ref.losses.back()
                    << ", worst relative loss deviation " << worst);
  // Parameters after 20 steps: within 5% of one learning-rate step of the single-rank ones. Not a
  // relative 1e-5: AdamW's update lr * m / sqrt(v) turns the fp32 rounding of a near-zero
  // gradient element (summed in another order across ranks) into a visible fraction of lr
  // (measured up to 1.4% of lr at layout<2,2>); the loss curve above is the criterion.
  using ref_t = typename single_rank_curve<Prec>::model_t;
  for (int k = 0; k < nn::num_param_tensors; ++k) {
    const auto p = nn::param(k);
    double err = 0;
    for (std::size_t r = 0; r < params.size(); ++r) {
      if (!nn::stage_uses(p, stages[r], PP)) continue;
      for (std::size_t i = 0; i < model_t::table[std::size_t(k)].size(); ++i) {
        const std::size_t gi = nn::global_index<M, layout<TP, PP>>(p, tps[r], stages[r], i);
        const double want = double(ref.params[ref_t::offsets[std::size_t(k)] + gi]);
        err = std::max(err, std::abs(double(params[r][model_t::offsets[std::size_t(k)] + i]) - want));
      }
    }
    INFO(model_t::table[std::size_t(k)].name);
    CHECK(err <= 0.05 * lr);
  }
}

}  // namespace

TEST_CASE("gpt_parallel training: 20 AdamW steps give the single-rank loss curve (fp32, relative 1e-5)") {
  training_case<precision::fp32, 2, 1, 1>(2);
  training_case<precision::fp32, 1, 2, 1>(3);
  training_case<precision::fp32, 2, 2, 1>(2);
  training_case<precision::fp32, 2, 2, 2>(2);
}
