// Data parallelism (parallel/data_parallel.hpp through train::trainer) on comm::threads: DP = 2
// and 4 give the loss and every gradient of one rank on the same global batch; 20 steps give the
// same loss curve; accumulation with padded targets; ZeRO-1 equals DDP; no-overlap equals
// overlap; a rank that never joins times out; a diverged replica is caught; the loader's
// per-epoch order changes and splits disjointly.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/data/loader.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/trainer.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../data/paths.hpp"

using namespace loom;
using M = models::tiny;
using P = policy<device::cpu, precision::fp32>;
namespace lp = loom::parallel;

namespace {

constexpr int T = 13;  // not a multiple of anything

train::trainer_config config(int micro_batch, int grad_accum) {
  train::trainer_config cfg;
  cfg.micro_batch = micro_batch;
  cfg.seq_len = T;
  cfg.grad_accum = grad_accum;
  cfg.schedule = {3e-3, 3e-4, 2, 30};
  return cfg;
}

/// Random inputs and targets for `rows` sequences; about `pad` of the targets of rows >= `first_padded` are -1.
struct batch {
  std::vector<std::int32_t> in, tg;
};
batch random_batch(int rows, std::uint64_t seed, double pad = 0, int first_padded = 0) {
  batch b;
  b.in.resize(std::size_t(rows) * T);
  b.tg.resize(b.in.size());
  for (std::size_t i = 0; i < b.in.size(); ++i) {
    b.in[i] = std::int32_t(random_below(M::vocab, seed, 1, i));
    b.tg[i] = std::int32_t(random_below(M::vocab, seed, 2, i));
    if (int(i / T) >= first_padded && double(random_below(1000, seed, 3, i)) < pad * 1000) b.tg[i] = -1;
  }
  return b;
}
std::span<const std::int32_t> rows_of(const std::vector<std::int32_t>& v, int first, int count) {
  return std::span<const std::int32_t>(v).subspan(std::size_t(first) * T, std::size_t(count) * T);
}

/// OpenMP threads of the calling thread set to 1 for the guard's lifetime, then restored (a
/// test must not leave its setting to the next test case of the same process).
class one_thread_per_rank {
 public:
#ifdef _OPENMP
  one_thread_per_rank() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }  // CI has 2 cores; ranks are threads already
  ~one_thread_per_rank() { omp_set_num_threads(saved_); }
#else
  one_thread_per_rank() = default;
#endif
  one_thread_per_rank(const one_thread_per_rank&) = delete;
  one_thread_per_rank& operator=(const one_thread_per_rank&) = delete;

 private:
  [[maybe_unused]] int saved_ = 0;
};

/// True for the key part of qkv_b. Its gradient is zero in exact arithmetic (softmax does not
/// change when every score of a row moves by q.b_k), so what backward computes is rounding
/// noise, and AdamW turns noise into steps of +-lr: parameters are compared without it (its
/// gradient is compared like every other).
template <class G>
bool is_key_bias(int k, std::size_t i) {
  constexpr std::size_t C = M::d_model;
  return k == int(models::param::qkv_b) && i % (3 * C) >= C && i % (3 * C) < 2 * C;
}

/// max |a - b| <= rel * max |b|, tensor by tensor; reports the worst tensor.
template <class G>
void check_close(const G& a, const G& b, bool grads, double rel) {
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    const auto x = grads ? a.gradient(std::size_t(k)) : a.parameter(std::size_t(k));
    const auto y = grads ? b.gradient(std::size_t(k)) : b.parameter(std::size_t(k));
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!grads && is_key_bias<G>(k, i)) continue;
      diff = std::max(diff, double(std::abs(x[i] - y[i])));
      scale = std::max(scale, double(std::abs(y[i])));
    }
    INFO(std::string(grads ? "gradient " : "parameter ") << G::table[k].name << ": max diff " << diff << ", max "
                                                        << scale);
    CHECK(diff <= rel * scale);
  }
}

using trainer_t = train::trainer<M, P, 8, T>;

/// Runs `steps` steps on dp ranks (rank r takes rows [r*rows/dp, (r+1)*rows/dp) of each global
/// batch) and returns rank 0's losses; `each` sees every rank's trainer at the end.
template <class Tr = trainer_t, class Each>
std::vector<double> run_dp(int dp, int grad_accum, const std::vector<batch>& batches, int rows, lp::ddp_options o,
                           Each&& each) {
  std::vector<double> losses;
  std::mutex mutex;
  comm::run_threads(dp, [&](comm::threads& world) {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    const int mine = rows / dp;
    Tr tr(ctx, config(mine / grad_accum, grad_accum), world, o);
    for (const auto& b : batches) {
      const auto r = tr.step(ctx, rows_of(b.in, world.rank() * mine, mine), rows_of(b.tg, world.rank() * mine, mine));
      if (world.rank() == 0) losses.push_back(r.loss);
    }
    std::lock_guard lock(mutex);
    each(world.rank(), tr);
  });
  return losses;
}

std::vector<double> run_single(const std::vector<batch>& batches, trainer_t& tr, context<device::cpu>& ctx) {
  std::vector<double> losses;
  for (const auto& b : batches) losses.push_back(tr.step(ctx, b.in, b.tg).loss);
  return losses;
}

}  // namespace

TEST_CASE("data parallel: DP=2 and DP=4 give the single-rank loss and every gradient on the same global batch") {
  const one_thread_per_rank one_thread;
  constexpr int rows = 8;
  const std::vector<batch> one{random_batch(rows, 11, 0.2, 5)};  // padding only in the last rows: uneven counts
  context<device::cpu> ctx;
  trainer_t single(ctx, config(rows, 1));
  const double want = run_single(one, single, ctx)[0];
  for (int dp : {2, 4}) {
    for (double mb : {1e-3, 1.0}) {  // one bucket per group, and several groups per bucket
      INFO("dp " << dp << ", bucket " << mb << " MiB");
      lp::ddp_options o;
      o.bucket_mb = mb;
      const auto got = run_dp(dp, 1, one, rows, o, [&](int rank, trainer_t& tr) {
        INFO("rank " << rank);
        // 2e-5 of each tensor's largest gradient: the ranks' GEMMs sum 2 or 4 rows' tokens and the
        // all-reduce adds the partial sums, in another order than one rank's GEMM over 8 rows; the
        // worst tensor is within 1e-5 at -O2 and measured 1.15e-5 at -O1 (ASan build; attproj_w, DP 4).
        check_close(tr.model(), single.model(), true, 2e-5);
        check_close(tr.model(), single.model(), false, 2e-5);
        if (mb < 1) CHECK(tr.data_parallel()->bucket_count() == std::size_t(M::n_layer + 2));
      });
      CHECK(got[0] == doctest::Approx(want).epsilon(1e-5));
    }
  }
}

TEST_CASE("data parallel: 20 steps on 2 ranks follow the single-rank loss curve") {
  const one_thread_per_rank one_thread;
  constexpr int rows = 8;
  std::vector<batch> batches;
  for (int s = 0; s < 20; ++s) batches.push_back(random_batch(rows, 100 + std::uint64_t(s) % 3));
  context<device::cpu> ctx;
  trainer_t single(ctx, config(rows, 1));
  const auto want = run_single(batches, single, ctx);
  const auto got = run_dp(2, 1, batches, rows, {}, [&](int, trainer_t& tr) {
    check_close(tr.model(), single.model(), false, 1e-4);
  });
  REQUIRE(got.size() == want.size());
  for (std::size_t s = 0; s < want.size(); ++s) {
    INFO("step " << s);
    CHECK(got[s] == doctest::Approx(want[s]).epsilon(1e-5));
  }
  CHECK(want.back() < want.front() - 0.1);  // it learns
}

TEST_CASE("data parallel: 4 micro-batches of B/4 per rank equal 1 batch of B, with padded targets") {
  const one_thread_per_rank one_thread;
  constexpr int rows = 8;  // 2 ranks x 4 micro-batches x 1 row
  // rows 3..7 lose ~60% of their targets: micro-batches have very different token counts, so a
  // mean of per-micro-batch means would differ from the per-token mean
  const std::vector<batch> one{random_batch(rows, 21, 0.6, 3), random_batch(rows, 22, 0.6, 3)};
  context<device::cpu> ctx;
  trainer_t single(ctx, config(rows, 1));
  const auto want = run_single(one, single, ctx);
  const auto got = run_dp(2, 4, one, rows, {}, [&](int, trainer_t& tr) {
    check_close(tr.model(), single.model(), true, 1e-5);
    check_close(tr.model(), single.model(), false, 1e-5);
  });
  for (std::size_t s = 0; s < want.size(); ++s) CHECK(got[s] == doctest::Approx(want[s]).epsilon(1e-5));
}

TEST_CASE("data parallel: ZeRO-1 gives DDP's parameters after 20 steps, no-overlap gives overlap's, memory saved") {
  const one_thread_per_rank one_thread;
  constexpr int rows = 8;
  std::vector<batch> batches;
  for (int s = 0; s < 20; ++s) batches.push_back(random_batch(rows, 300 + std::uint64_t(s), 0.1, 4));
  std::vector<std::vector<float>> ddp(2), zero(2), serial(2);
  auto keep = [](std::vector<std::vector<float>>& into) {
    return [&into](int rank, trainer_t& tr) {
      const auto p = tr.model().parameters();
      into[std::size_t(rank)].assign(p.data(), p.data() + p.size());
    };
  };
  lp::ddp_options o;
  o.bucket_mb = 0.01;
  const auto l_ddp = run_dp(2, 2, batches, rows, o, keep(ddp));
  lp::ddp_options z = o;
  z.zero1 = true;
  const auto l_zero = run_dp(2, 2, batches, rows, z, [&](int rank, trainer_t& tr) {
    keep(zero)(rank, tr);
    const auto* z1 = tr.zero1_optimizer();
    REQUIRE(z1 != nullptr);
    const std::size_t unsharded = 2 * trainer_t::model_t::num_parameters * sizeof(float);  // fp32: no masters
    CHECK(tr.optimizer_bytes() == z1->bytes());
    CHECK(z1->bytes() <= unsharded / 2 + 64 * 8 * sizeof(float));  // padding per bucket
    CHECK(unsharded - z1->bytes() > unsharded / 3);
    CHECK(tr.optimizer().first_moment().size() == 0);  // the trainer's full moments are gone
    CHECK(tr.optimizer().step() == 20);
    CHECK(z1->step() == 20);
  });
  lp::ddp_options s = o;
  s.overlap = false;
  const auto l_serial = run_dp(2, 2, batches, rows, s, keep(serial));
  CHECK(l_ddp == l_zero);
  CHECK(l_ddp == l_serial);
  for (int r = 0; r < 2; ++r) {
    CHECK(ddp[r] == zero[r]);     // bitwise: same reduction order, elementwise AdamW
    CHECK(ddp[r] == serial[r]);
    CHECK(ddp[r] == ddp[0]);      // replicas agree
  }
}

TEST_CASE("data parallel: a rank that never joins the step raises comm_timeout naming it") {
  const one_thread_per_rank one_thread;
  lp::comm_options o;
  o.timeout = std::chrono::milliseconds(300);
  const auto b = random_batch(4, 5);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(comm::run_threads(
                           2,
                           [&](comm::threads& world) {
                             context<device::cpu> ctx;
                             trainer_t tr(ctx, config(2, 1), world);
                             if (world.rank() == 1) return;  // never steps
                             tr.step(ctx, rows_of(b.in, 0, 2), rows_of(b.tg, 0, 2));
                           },
                           o),
                       doctest::Contains("missing ranks {1}"), lp::comm_timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("data parallel: the replica check names the first differing tensor and the ranks") {
  const one_thread_per_rank one_thread;
  const auto b = random_batch(4, 6);
  lp::ddp_options o;
  o.check_every = 2;
  std::atomic<int> steps_done{0};
  CHECK_THROWS_WITH_AS(comm::run_threads(2,
                                         [&](comm::threads& world) {
                                           context<device::cpu> ctx;
                                           trainer_t tr(ctx, config(2, 1), world, o);
                                           for (int s = 0; s < 3; ++s) {
                                             if (s == 1 && world.rank() == 1)
                                               tr.model().parameter(models::param::qkv_w)[7] += 1e-3f;
                                             tr.step(ctx, rows_of(b.in, 2 * world.rank(), 2),
                                                     rows_of(b.tg, 2 * world.rank(), 2));
                                             ++steps_done;
                                           }
                                         }),
                       doctest::Contains("first differing tensor 'qkv_w' differs between rank 0 and rank(s) {1}"),
                       lp::replica_mismatch);
  CHECK(steps_done.load() == 2);  // the first step passed on both ranks; the check after step 2 threw on both
}

TEST_CASE("data parallel: bad options are input errors") {
  comm::run_threads(1, [&](comm::threads& world) {
    context<device::cpu> ctx;
    lp::ddp_options o;
    o.bucket_mb = 0;
    CHECK_THROWS_AS(trainer_t(ctx, config(2, 1), world, o), input_error);
    o.bucket_mb = 1;
    o.check_every = -1;
    CHECK_THROWS_AS(trainer_t(ctx, config(2, 1), world, o), input_error);
  });
}

TEST_CASE("data parallel sampler: each rank a disjoint part of every global batch, the epoch covered, a new order per epoch") {
  loom_test::scratch_dir tmp("dp_sampler");
  const auto prefix = tmp.path / "pos";
  {  // token value = stream position, so a row's first token names its window
    data::indexed_dataset_writer w(prefix, data::dtype::int32);
    std::int32_t at = 0;
    for (int d = 0; d < 37; ++d) {
      std::vector<std::int32_t> doc(std::size_t(5 + (d * 7) % 23));
      for (auto& t : doc) t = at++;
      w.add_document(doc);
    }
    w.finalize();
  }
  constexpr std::size_t B = 3, T = 7;
  constexpr int dp = 2;
  data::loader_options o;
  o.batch = B;
  o.seq_len = T;
  o.seed = 5;
  o.workers = 0;
  o.dp_size = dp;
  data::loader_options whole = o;  // one rank taking the global batch
  whole.batch = B * dp;
  whole.dp_size = 1;
  data::loader<> one(prefix, whole);
  std::vector<std::unique_ptr<data::loader<>>> ranks;
  for (int r = 0; r < dp; ++r) {
    o.dp_rank = r;
    ranks.push_back(std::make_unique<data::loader<>>(prefix, o));
  }
  const std::uint64_t S = one.batches_per_epoch(), W = one.windows_per_epoch();
  REQUIRE(S >= 3);
  std::vector<std::vector<std::int32_t>> order(2);  // window starts, in global order, per epoch
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (std::uint64_t s = 0; s < S; ++s) {
      const auto g = one.next();
      std::vector<std::int32_t> joined;
      for (auto& l : ranks) {
        const auto b = l->next();
        joined.insert(joined.end(), b.begin(), b.end());
      }
      CHECK(std::equal(joined.begin(), joined.end(), g.begin(), g.end()));  // rank r = part r of the global batch
      for (std::size_t i = 0; i < B * dp; ++i) order[std::size_t(epoch)].push_back(g[i * (T + 1)]);
    }
    const std::set<std::int32_t> seen(order[std::size_t(epoch)].begin(), order[std::size_t(epoch)].end());
    CHECK(seen.size() == order[std::size_t(epoch)].size());  // no window twice in an epoch
    CHECK(seen.size() == S * B * dp);
    CHECK(W - seen.size() < B * dp);                         // only the tail that fills no global batch is left
    for (auto x : seen) CHECK(x % std::int32_t(T) == 0);     // windows start on multiples of T
  }
  CHECK(order[0] != order[1]);  // reshuffled
  CHECK(ranks[0]->state() == ranks[1]->state());  // one position for all ranks
}

TEST_CASE("data parallel: ZeRO-1 in bf16 shards the fp32 masters and gives DDP's parameters and masters bit for bit") {
  // Same reduction order and the same elementwise adamw_master on every element: a rank's master
  // shard equals DDP's full masters at its ranges, and the all-gathered bf16 parameters equal
  // DDP's. Each rank holds (2 + 1)/2 of one replica's fp32 state, up to padding.
  using bf = train::trainer<M, policy<device::cpu, precision::bf16>, 8, T>;
  using G = bf::model_t;
  const one_thread_per_rank one_thread;
  constexpr int rows = 8;
  std::vector<batch> batches;
  for (int s = 0; s < 6; ++s) batches.push_back(random_batch(rows, 700 + std::uint64_t(s), 0.1, 4));
  std::vector<std::vector<Eigen::bfloat16>> ddp_p(2), zero_p(2);
  std::vector<std::vector<float>> ddp_master(2);
  std::vector<std::size_t> bytes(2), ddp_bytes(2);
  lp::ddp_options o;
  o.bucket_mb = 0.01;
  const auto l_ddp = run_dp<bf>(2, 1, batches, rows, o, [&](int r, bf& tr) {
    const auto p = tr.model().parameters();
    ddp_p[std::size_t(r)].assign(p.data(), p.data() + p.size());
    const auto m = tr.optimizer().master_weights();
    ddp_master[std::size_t(r)].assign(m.data(), m.data() + m.size());
    ddp_bytes[std::size_t(r)] = tr.optimizer_bytes();
  });
  lp::ddp_options z = o;
  z.zero1 = true;
  const auto l_zero = run_dp<bf>(2, 1, batches, rows, z, [&](int r, bf& tr) {
    const auto p = tr.model().parameters();
    zero_p[std::size_t(r)].assign(p.data(), p.data() + p.size());
    const auto* z1 = tr.zero1_optimizer();
    REQUIRE(z1 != nullptr);
    CHECK(tr.optimizer().master_weights().size() == 0);  // no replicated masters
    bytes[std::size_t(r)] = tr.optimizer_bytes();
    std::size_t covered = 0, mismatched = 0;
    const auto mw = z1->master_weights();
    for (const auto& q : z1->ranges()) {
      covered += q.length;
      for (std::size_t i = 0; i < q.length; ++i)
        mismatched += std::memcmp(&mw[q.shard_offset + i], &ddp_master[0][q.param_offset + i], sizeof(float)) != 0;
    }
    CHECK(mismatched == 0);
    CHECK(covered == z1->shard_size());
  });
  CHECK(l_ddp == l_zero);
  const std::size_t unsharded = 3 * G::num_parameters * sizeof(float);
  for (int r = 0; r < 2; ++r) {
    CHECK(ddp_bytes[std::size_t(r)] == unsharded);
    CHECK(bytes[std::size_t(r)] <= unsharded / 2 + 64 * 8 * 3 * sizeof(float));
    CHECK(std::memcmp(ddp_p[std::size_t(r)].data(), zero_p[std::size_t(r)].data(), ddp_p[0].size() * 2) == 0);
  }
  CHECK(bytes[0] + bytes[1] >= unsharded);  // the shards cover the state once
  MESSAGE("bf16 optimizer bytes per rank: " << unsharded << " without ZeRO-1, " << bytes[0] << " and " << bytes[1]
                                            << " with ZeRO-1 on 2 ranks");
}
