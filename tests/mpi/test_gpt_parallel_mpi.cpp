// gpt_parallel over comm::mpi (ctest runs this binary under mpirun -np 2 and -np 3). On 2
// processes: tensor parallel layout<2,1> and pipeline parallel layout<1,2> (1F1B, 3 micro-batches,
// MPI_Send/MPI_Recv in the rendezvous-safe order) give the single-rank loss and gradient norm, and
// every gradient element of this rank equals the single-rank element at its global index. On other
// process counts the test does nothing (the layouts need exactly 2).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/parallel/comm_mpi.hpp>

using namespace loom;

namespace {
using M = models::tiny_parallel;
constexpr int B = 2, T = 6, m = 3;

template <int TP, int PP>
void mpi_case(comm::mpi& world) {
  CAPTURE(TP);
  CAPTURE(PP);
  using P = policy<device::cpu, precision::fp32, layout<TP, PP>>;
  using model_t = nn::transformer<M, P>;
  using ref_t = nn::transformer<M, policy<device::cpu, precision::fp32>>;
  context<device::cpu> ctx;
  std::vector<std::int32_t> in(std::size_t(m) * B * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = std::int32_t(random_below(M::vocab, 3, 0, i));
    tg[i] = i == 4 ? kernels::ignore_index : std::int32_t(random_below(M::vocab, 3, 1, i));
  }
  const float scale = 1.0f / float(in.size() - 1);
  // single rank, on every process
  ref_t ref(ctx, 42);
  typename ref_t::template activations<B, T> ra(ctx);
  ref.zero_grad(ctx);
  double ref_loss = 0;
  for (int i = 0; i < m; ++i) {
    const std::size_t off = std::size_t(i) * B * T;
    ref_loss += ref.forward(ctx, ra, in.data() + off, tg.data() + off, B, T, scale);
    ref.backward(ctx, ra, in.data() + off, B, T);
  }
  const double ref_norm = std::sqrt(ref_t::ops::sum_of_squares(ctx, ref.gradients().data(), ref.gradients().size()));
  // parallel
  auto g = parallel::make_groups<layout<TP, PP>>(world);
  model_t model(ctx, g.tp.rank(), g.pp.rank(), 42);
  using acts_t = typename model_t::template activations<B, T>;
  std::vector<acts_t> ring;
  for (int i = 0; i < parallel::max_in_flight(PP, m, g.pp.rank()); ++i) ring.emplace_back(ctx);
  model.zero_grad(ctx);
  const double loss = parallel::pipeline_forward_backward<model_t, B, T>(ctx, model, std::span<acts_t>(ring), g.tp, g.pp, m,
                                                                   in.data(), tg.data(), B, T, scale);
  model.tie_embedding_gradients(ctx, g.pp);
  const double norm = model.grad_norm(ctx, g.tp, g.pp);
  CHECK(loss == doctest::Approx(ref_loss).epsilon(1e-5));
  CHECK(norm == doctest::Approx(ref_norm).epsilon(1e-5));
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    if (!models::stage_uses(models::param_table<M, parallel::layout<1, 1>>()[std::size_t(k)], g.pp.rank(), PP)) continue;
    const auto mine = model.gradient(std::size_t(k)), want = ref.gradient(std::size_t(k));
    double diff = 0, mx = 1e-30;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const float w = want[nn::global_index<M, layout<TP, PP>>(std::size_t(k), g.tp.rank(), g.pp.rank(), i)];
      diff = std::max(diff, double(std::abs(mine[i] - w)));
      mx = std::max(mx, double(std::abs(w)));
    }
    for (std::size_t i = 0; i < want.size(); ++i) mx = std::max(mx, double(std::abs(want[i])));
    INFO(model_t::table[std::size_t(k)].name);
    CHECK(diff <= 1e-5 * mx);
  }
}
}  // namespace

TEST_CASE("gpt_parallel over comm::mpi: TP=2 and PP=2 equal one rank") {
  comm::mpi world(MPI_COMM_WORLD);
  if (world.size() != 2) return;
  mpi_case<2, 1>(world);
  mpi_case<1, 2>(world);
}
