// Data parallelism over comm::mpi (ctest runs this binary under mpirun -np 2 and -np 3): each
// process trains its part of the global batch; loss and every gradient equal the single-rank run
// on the whole batch (which every process also computes, on its own), ZeRO-1 follows DDP, and the
// replicas agree bitwise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_mpi.hpp>
#include <loom/train/trainer.hpp>

using namespace loom;
using M = models::tiny;
using P = policy<device::cpu, precision::fp32>;
namespace lp = loom::parallel;

namespace {
constexpr int T = 11, per_rank = 2;
using trainer_t = train::trainer<M, P, 8, T>;

train::trainer_config config(int micro_batch) {
  train::trainer_config cfg;
  cfg.micro_batch = micro_batch;
  cfg.seq_len = T;
  cfg.schedule = {3e-3, 3e-4, 2, 30};
  return cfg;
}

struct batch {
  std::vector<std::int32_t> in, tg;
};
batch random_batch(int rows, std::uint64_t seed) {  // the last row is half padding
  batch b;
  b.in.resize(std::size_t(rows) * T);
  b.tg.resize(b.in.size());
  for (std::size_t i = 0; i < b.in.size(); ++i) {
    b.in[i] = std::int32_t(random_below(M::vocab, seed, 1, i));
    b.tg[i] = int(i / T) == rows - 1 && i % 2 ? -1 : std::int32_t(random_below(M::vocab, seed, 2, i));
  }
  return b;
}
std::span<const std::int32_t> rows_of(const std::vector<std::int32_t>& v, int first, int count) {
  return std::span<const std::int32_t>(v).subspan(std::size_t(first) * T, std::size_t(count) * T);
}

/// max |a - b| <= rel * max |b| for every gradient tensor.
void check_grads(const trainer_t::model_t& a, const trainer_t::model_t& b, double rel) {
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    const auto x = a.gradient(std::size_t(k)), y = b.gradient(std::size_t(k));
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, double(std::abs(x[i] - y[i])));
      scale = std::max(scale, double(std::abs(y[i])));
    }
    INFO("gradient " << std::string(trainer_t::model_t::table[k].name) << ": max diff " << diff << ", max " << scale);
    CHECK(diff <= rel * scale);
  }
}
}  // namespace

TEST_CASE("data parallel over comm::mpi: loss and gradients equal one rank on the global batch; ZeRO-1 follows DDP") {
  comm::mpi world(MPI_COMM_WORLD);
  const int n = world.size(), r = world.rank();
  if (n * per_rank > 8) return;  // the single-rank reference has capacity 8
  context<device::cpu> ctx;
  std::vector<batch> batches;
  for (int s = 0; s < 5; ++s) batches.push_back(random_batch(n * per_rank, 40 + std::uint64_t(s)));

  trainer_t single(ctx, config(n * per_rank));
  lp::ddp_options o;
  o.bucket_mb = 0.005;  // several buckets
  trainer_t ddp(ctx, config(per_rank), world, o);
  o.zero1 = true;
  o.check_every = 1;
  trainer_t zero(ctx, config(per_rank), world, o);
  for (std::size_t s = 0; s < batches.size(); ++s) {
    const auto& b = batches[s];
    const auto want = single.step(ctx, b.in, b.tg);
    const auto got = ddp.step(ctx, rows_of(b.in, r * per_rank, per_rank), rows_of(b.tg, r * per_rank, per_rank));
    const auto z = zero.step(ctx, rows_of(b.in, r * per_rank, per_rank), rows_of(b.tg, r * per_rank, per_rank));
    INFO("step " << s);
    CHECK(got.tokens == want.tokens);
    CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-5));
    CHECK(got.grad_norm == doctest::Approx(want.grad_norm).epsilon(1e-5));
    CHECK(z.loss == doctest::Approx(got.loss).epsilon(1e-6));
    if (s == 0) check_grads(ddp.model(), single.model(), 1e-5);
  }
  // replicas agree bitwise, and ZeRO-1 stays with DDP
  const auto p = ddp.model().parameters(), pz = zero.model().parameters();
  std::vector<float> root(p.data(), p.data() + p.size());
  world.broadcast(std::span<float>(root), 0);
  CHECK(std::memcmp(root.data(), p.data(), p.bytes()) == 0);
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    diff = std::max(diff, double(std::abs(p[i] - pz[i])));
    scale = std::max(scale, double(std::abs(p[i])));
  }
  CHECK(diff <= 1e-5 * scale);
}
