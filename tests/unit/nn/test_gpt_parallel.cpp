// gpt_parallel on models::tiny_parallel against the single-rank loom::nn::transformer on the same global batch:
// initialisation (bitwise, checked through io::shard_tensor), loss and every gradient gathered to
// global shape (fp32 max-norm relative 1e-5, float64 1e-12) for tensor-, pipeline- and combined
// layouts on comm::threads, and the global gradient norm without double counting.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/parallel/comm_threads.hpp>

namespace {

using namespace loom;
using M = models::tiny_parallel;
using cpu = device::cpu;

template <class Prec>
double tolerance() {
  return std::is_same_v<typename Prec::storage, double> ? 1e-12 : 1e-5;
}

/// The single-rank run: the gradients of m micro-batches (b, t) accumulated, and the loss sum.
template <class Prec, int B, int T>
struct reference_run {
  using model_t = nn::transformer<M, policy<cpu, Prec, layout<1, 1>>>;
  using S = typename Prec::storage;
  std::vector<S> params, grads;
  double loss = 0, norm = 0;
  reference_run(const std::vector<std::int32_t>& in, const std::vector<std::int32_t>& tg, int m, int b, int t,
                double scale) {
    context<cpu> ctx;
    model_t model(ctx, 1234);
    typename model_t::template activations<B, T> acts(ctx);
    model.zero_grad(ctx);
    for (int i = 0; i < m; ++i) {
      const std::size_t off = std::size_t(i) * b * t;
      loss += double(model.forward(ctx, acts, in.data() + off, tg.data() + off, b, t, typename model_t::acc_t(scale)));
      model.backward(ctx, acts, in.data() + off, b, t);
    }
    params.assign(model.parameters().begin(), model.parameters().end());
    grads.assign(model.gradients().begin(), model.gradients().end());
    norm = std::sqrt(model_t::ops::sum_of_squares(ctx, grads.data(), grads.size()));
  }
  std::span<const S> tensor(const std::vector<S>& buf, int k) const {
    return {buf.data() + model_t::offsets[std::size_t(k)], model_t::table[std::size_t(k)].size()};
  }
};

/// A batch of m micro-batches (b, t) with one ignored target.
struct batch {
  std::vector<std::int32_t> in, tg;
  int valid = 0;
  batch(int m, int b, int t, std::uint64_t seed) : in(std::size_t(m * b * t)), tg(in.size()) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = std::int32_t(random_below(M::vocab, seed, 0, i));
      tg[i] = std::int32_t(random_below(M::vocab, seed, 1, i));
    }
    tg[3] = kernels::ignore_index;
    for (auto x : tg) valid += x != kernels::ignore_index;
  }
};

/// Per-rank results of a parallel run.
template <class S>
struct rank_result {
  int tp = 0, stage = 0;
  std::vector<S> params, grads;
  double loss = 0, norm = 0, naive_sq = 0;
};

/// Runs the layout on TP*PP*DP threads (groups by make_groups: tp fastest, then dp, then pp).
/// Data-parallel replica d takes micro-batches [d*m, (d+1)*m) of the global batch; after the
/// pipeline and the tied-embedding sum, gradients and loss are summed over the dp group (what
/// the DDP trainer does; grad_scale already divides by the global target count).
template <class Prec, int TP, int PP, int B, int T, int DP = 1>
std::vector<rank_result<typename Prec::storage>> parallel_run(const batch& data, int m, int b, int t, double scale) {
  using model_t = nn::transformer<M, policy<cpu, Prec, layout<TP, PP>>>;
  using S = typename Prec::storage;
  std::vector<rank_result<S>> out(std::size_t(TP * PP * DP));
  comm::run_threads(TP * PP * DP, [&](comm::threads& world) {
    auto g = parallel::make_groups<layout<TP, PP>>(world);
    context<cpu> ctx;
    model_t model(ctx, g.tp.rank(), g.pp.rank(), 1234);
    using acts_t = typename model_t::template activations<B, T>;
    std::vector<acts_t> ring;
    for (int i = 0; i < parallel::max_in_flight(PP, m, g.pp.rank()); ++i) ring.emplace_back(ctx);
    model.zero_grad(ctx);
    const std::size_t off = std::size_t(g.dp.rank()) * m * b * t;
    auto loss = parallel::pipeline_forward_backward<model_t, B, T>(ctx, model, std::span<acts_t>(ring), g.tp, g.pp, m,
                                                             data.in.data() + off, data.tg.data() + off, b, t,
                                                             typename model_t::acc_t(scale));
    model.tie_embedding_gradients(ctx, g.pp);
    const auto grads = model.gradients();
    g.dp.all_reduce(std::span<S>(grads.data(), grads.size()), parallel::reduce_op::sum);
    g.dp.all_reduce(std::span<decltype(loss)>(&loss, 1), parallel::reduce_op::sum);
    auto& r = out[std::size_t(world.rank())];
    r.tp = g.tp.rank();
    r.stage = g.pp.rank();
    r.loss = double(loss);
    r.params.assign(model.parameters().begin(), model.parameters().end());
    r.grads.assign(grads.begin(), grads.end());
    r.norm = model.grad_norm(ctx, g.tp, g.pp);
    r.naive_sq = model_t::ops::sum_of_squares(ctx, r.grads.data(), r.grads.size());
  });
  return out;
}

/// Gathers tensor k of every rank into the global tensor (through nn::global_index), checking
/// that every copy of a replicated element agrees with the one taken.
template <class Model, class S>
std::vector<S> gather(const std::vector<rank_result<S>>& ranks, const std::vector<S> rank_result<S>::*buf, int k,
                      std::size_t global_size) {
  std::vector<S> out(global_size);
  std::vector<char> seen(global_size, 0);
  for (const auto& r : ranks) {
    if (!models::stage_uses(Model::table[std::size_t(k)], r.stage, Model::PP)) continue;
    const std::size_t off = Model::offsets[std::size_t(k)], n = Model::table[std::size_t(k)].size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t gi = nn::global_index<M, typename Model::layout>(std::size_t(k), r.tp, r.stage, i);
      if (gi >= global_size) {
        FAIL("global_index out of range for " << Model::table[std::size_t(k)].name);
      }
      const S v = (r.*buf)[off + i];
      if (seen[gi]) {
        if (!(out[gi] == v)) FAIL_CHECK("replicated copies of " << Model::table[std::size_t(k)].name << " differ");
      } else {
        out[gi] = v;
        seen[gi] = 1;
      }
    }
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == std::ptrdiff_t(global_size));  // every element covered
  return out;
}

template <class S>
void check_close(std::span<const S> a, std::span<const S> ref, double tol, std::string_view what) {
  INFO(what);
  REQUIRE(a.size() == ref.size());
  double err = 0, mx = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(ref[i])));
    mx = std::max(mx, std::abs(double(ref[i])));
  }
  CHECK(err <= tol * mx);
}

template <class Prec, int TP, int PP, int DP = 1>
void equivalence_case(int m) {
  CAPTURE(TP);
  CAPTURE(PP);
  CAPTURE(DP);
  CAPTURE(m);
  constexpr int B = 2, T = 7;
  const int b = 2, t = 6;  // t < T: the capacity is not the size used
  using model_t = nn::transformer<M, policy<cpu, Prec, layout<TP, PP>>>;
  using S = typename Prec::storage;
  const batch data(m * DP, b, t, 77);
  const double scale = 1.0 / data.valid;
  const reference_run<Prec, B, T> ref(data.in, data.tg, m * DP, b, t, scale);
  const auto ranks = parallel_run<Prec, TP, PP, B, T, DP>(data, m, b, t, scale);
  const double tol = tolerance<Prec>();
  for (const auto& r : ranks) {
    CHECK(r.loss == doctest::Approx(ref.loss).epsilon(tol));
    CHECK(r.norm == doctest::Approx(ref.norm).epsilon(tol));
  }
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    const auto want_p = ref.tensor(ref.params, k);
    const auto want_g = ref.tensor(ref.grads, k);
    const auto got_p = gather<model_t>(ranks, &rank_result<S>::params, k, want_p.size());
    const auto got_g = gather<model_t>(ranks, &rank_result<S>::grads, k, want_g.size());
    INFO(models::param_table<M, layout<1, 1>>()[std::size_t(k)].name);
    CHECK(std::equal(got_p.begin(), got_p.end(), want_p.begin()));  // initialisation: bitwise
    check_close<S>(got_g, want_g, tol, "gradient");
  }
}

}  // namespace

TEST_CASE("gpt_parallel: initialisation is the single-rank model's, sharded as io::shard_tensor shards it") {
  using P1 = policy<cpu, precision::fp32, layout<1, 1>>;
  context<cpu> ctx;
  nn::transformer<M, P1> whole(ctx, 99);
  auto check_layout = [&]<int TP, int PP>() {
    using model_t = nn::transformer<M, policy<cpu, precision::fp32, layout<TP, PP>>>;
    for (int s = 0; s < PP; ++s)
      for (int r = 0; r < TP; ++r) {
        model_t part(ctx, r, s, 99);
        for (int k = 0; k < int(models::num_params<M>); ++k) {
          CAPTURE(TP);
          CAPTURE(PP);
          CAPTURE(k);
          const auto w = whole.parameter(std::size_t(k));
          const auto mine = part.parameter(std::size_t(k));
          const auto want = io::shard_tensor(io::geometry_of<M>(k), sizeof(float),
                                             std::as_bytes(std::span<const float>(w.data(), w.size())), TP, PP, r, s);
          REQUIRE(want.size() == mine.bytes());
          CHECK(std::memcmp(want.data(), mine.data(), want.size()) == 0);
        }
      }
  };
  check_layout.template operator()<2, 1>();
  check_layout.template operator()<4, 1>();
  check_layout.template operator()<1, 2>();
  check_layout.template operator()<2, 2>();
  check_layout.template operator()<1, 4>();
  CHECK_THROWS_AS((nn::transformer<M, policy<cpu, precision::fp32, layout<2, 1>>>(ctx, 2, 0)), input_error);
}

TEST_CASE("gpt_parallel: layout<1,1> computes exactly what loom::nn::transformer computes") {
  equivalence_case<precision::fp32, 1, 1>(2);
}

TEST_CASE_TEMPLATE("gpt_parallel: tensor parallel TP=2 and 4 equals one rank (loss, gradients, norm)", Prec,
                   precision::fp32, precision::fp64) {
  equivalence_case<Prec, 2, 1>(1);
  equivalence_case<Prec, 4, 1>(1);
}

TEST_CASE_TEMPLATE("gpt_parallel: pipeline parallel with 1F1B equals one rank with gradient accumulation", Prec,
                   precision::fp32, precision::fp64) {
  equivalence_case<Prec, 1, 2>(3);
  equivalence_case<Prec, 1, 4>(5);
  equivalence_case<Prec, 1, 4>(2);  // fewer micro-batches than stages: still correct
}

TEST_CASE("gpt_parallel: tensor and pipeline parallel combined, layout<2,2>") {
  equivalence_case<precision::fp32, 2, 2>(4);
}

TEST_CASE("gpt_parallel: composed with data parallelism, (TP, PP, DP) = (2,1,2), (1,2,2), (2,2,2)") {
  equivalence_case<precision::fp32, 2, 1, 2>(1);
  equivalence_case<precision::fp32, 1, 2, 2>(2);
  equivalence_case<precision::fp32, 2, 2, 2>(2);
}

TEST_CASE("gpt_parallel: the global gradient norm counts replicated and tied tensors once") {
  constexpr int B = 2, T = 7;
  const batch data(1, 2, 6, 5);
  const double scale = 1.0 / data.valid;
  const reference_run<precision::fp64, B, T> ref(data.in, data.tg, 1, 2, 6, scale);
  const auto ranks = parallel_run<precision::fp64, 2, 1, B, T>(data, 1, 2, 6, scale);
  double naive = 0;
  for (const auto& r : ranks) {
    CHECK(r.norm == doctest::Approx(ref.norm).epsilon(1e-12));
    naive += r.naive_sq;
  }
  // Summing every rank's whole buffer counts the replicated LayerNorms, wpe and row biases twice:
  // measurably larger, so the check above would catch double counting.
  CHECK(std::sqrt(naive) > ref.norm * (1 + 1e-6));
  // With PP = 2 the tied embedding lives on both end stages: counted once.
  const auto pranks = parallel_run<precision::fp64, 1, 2, B, T>(data, 1, 2, 6, scale);
  for (const auto& r : pranks) CHECK(r.norm == doctest::Approx(ref.norm).epsilon(1e-12));
}

TEST_CASE("gpt_parallel: a non-finite gradient on one rank makes the global norm non-finite on every rank") {
  // The trainer's non-finite check is isfinite(grad norm): all-reduced, so every rank agrees and
  // every rank skips the step together. Inject a NaN into a sharded tensor of tp rank 1, stage 1,
  // and an inf into a per-layer tensor of stage 0 in a second run.
  using model_t = nn::transformer<M, policy<cpu, precision::fp32, layout<2, 2>>>;
  for (int which = 0; which < 2; ++which) {
    std::vector<double> norms(4);
    comm::run_threads(4, [&](comm::threads& world) {
      auto g = parallel::make_groups<layout<2, 2>>(world);
      context<cpu> ctx;
      model_t model(ctx, g.tp.rank(), g.pp.rank(), 1);
      model.zero_grad(ctx);
      auto gw = model.gradients();
      for (std::size_t i = 0; i < gw.size(); ++i) gw[i] = 1e-3f;
      if (which == 0 && g.tp.rank() == 1 && g.pp.rank() == 1) model.gradient(models::param::fc_w)[17] = std::nanf("");
      if (which == 1 && g.tp.rank() == 0 && g.pp.rank() == 0)
        model.gradient(models::param::ln2_b)[3] = std::numeric_limits<float>::infinity();
      norms[std::size_t(world.rank())] = model.grad_norm(ctx, g.tp, g.pp);
    });
    for (double n : norms) CHECK_FALSE(std::isfinite(n));
  }
}
