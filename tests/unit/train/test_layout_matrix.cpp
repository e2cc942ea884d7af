// The regular matrix of the one trainer (train::basic_trainer): {fp32, bf16, fp16 with the
// dynamic loss scaler} x {DP only, TP, PP, TP x PP, TP x PP with DP} x {ZeRO-1 off, on}, over
// comm::threads, each against one rank (train::trainer) on the same global batch:
//   - the loss of every step within a tolerance derived from the precision's unit roundoff
//     (fp32 u = 2^-24: 1e-5 relative; bf16 u = 2^-8: 2^-7; fp16 u = 2^-11: 2^-9), the same loss
//     scale and skipped steps as one rank;
//   - a checkpoint saved after step 2 resumes on the same layout bit for bit (losses of steps
//     3..4), and loads onto one rank (resharded) within the tolerance;
//   - the same with dropout 0.1 for fp32 TP, PP and TP x DP (the masks do not depend on the layout).
// CI runs a covering subset (every pair of precision, layout kind and ZeRO setting appears
// together at least once: TEST_CASE "layout matrix (covering subset)"); the whole product is the
// skipped TEST_CASE "layout matrix [full]" (run it with build/tests/loom_tests -tc='*full*'
// --no-skip). The MPI side of the matrix is tests/mpi/.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/trainer.hpp>

#include "../../support/temp_dir.hpp"

namespace {

using namespace loom;
namespace fs = std::filesystem;
using M = models::tiny_parallel;
using cpu = device::cpu;
constexpr int B = 2, T = 8, micro = 2, steps = 4, save_at = 2;
constexpr int global_windows = 8;  // per step: micro * micro_batch * dp for dp = 2; dp = 1 runs 4 micro-batches

/// Relative loss tolerance of a precision: a small multiple of its unit roundoff.
template <class Prec>
constexpr double tolerance() {
  if constexpr (std::is_same_v<Prec, precision::bf16>) return 1.0 / 128;    // u = 2^-8
  else if constexpr (std::is_same_v<Prec, precision::fp16>) return 1.0 / 512;  // u = 2^-11
  else return 1e-5;                                                          // u = 2^-24
}

template <class Prec>
using scaler_for = std::conditional_t<Prec::needs_loss_scaling, train::dynamic_loss_scaler, train::no_loss_scaler>;

/// Rows [first, first + count) of step s's global batch of windows of T+1 tokens (next token
/// = 7 t + 3 mod vocab, every 4th random), the same for every layout.
std::vector<std::int32_t> windows(long s, int first, int count) {
  std::vector<std::int32_t> out;
  for (int w = first; w < first + count; ++w)
    for (int i = 0; i <= T; ++i) {
      const auto noise = random_below(4, 41, std::uint64_t(s), std::uint64_t(w * (T + 1) + i));
      out.push_back(i == 0 || noise == 0 ? std::int32_t(random_below(M::vocab, 42, std::uint64_t(s), std::uint64_t(w * (T + 1) + i)))
                                         : (7 * out.back() + 3) % M::vocab);
    }
  return out;
}

train::trainer_config config(int accum, double dropout) {
  train::trainer_config c;
  c.dropout = dropout;
  c.micro_batch = B;
  c.seq_len = T;
  c.grad_accum = accum;
  c.schedule = {3e-3, 3e-4, 1, 8};
  c.seed = 31;
  c.loss_scaler.initial_scale = 65536;
  c.loss_scaler.growth_interval = 2;
  return c;
}

struct curve {
  std::vector<double> loss, scale;
  std::vector<bool> skipped;
};

/// OpenMP threads of the calling thread set to 1 for the guard's lifetime (ranks are threads).
struct one_thread {
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  one_thread() { omp_set_num_threads(1); }
  ~one_thread() { omp_set_num_threads(saved); }
#endif
};

using loom_test::temp_dir;

io::run_state state_at(long s) {
  io::run_state st;
  st.data = {{"kind", "matrix"}, {"step", s}};
  return st;
}

/// One rank on the whole global batch: steps [from, to), optionally loading `load` first.
template <class Prec>
curve one_rank(long from, long to, const fs::path& load = {}, double dropout = 0) {
  const one_thread guard;
  context<cpu> ctx;
  train::trainer<M, policy<cpu, Prec>, B, T, kernels::fused, scaler_for<Prec>> tr(ctx, config(global_windows / B, dropout));
  if (!load.empty()) io::load_checkpoint(ctx, load, tr);
  curve c;
  for (long s = load.empty() ? 0 : from; s < to; ++s) {
    const auto r = tr.step(ctx, windows(s, 0, global_windows));
    if (s < from) continue;
    c.loss.push_back(r.loss);
    c.scale.push_back(r.loss_scale);
    c.skipped.push_back(r.skipped);
  }
  return c;
}

/// layout<TP, PP> x dp ranks (threads), ZeRO-1 on the dp group if zero1: steps [0, steps), a
/// collective save after step save_at into `save` (if given), or steps [save_at, steps) after
/// loading `load`. Returns world rank 0's curve.
template <class Prec, int TP, int PP>
curve layout_run(int dp, bool zero1, const fs::path& save, const fs::path& load = {}, double dropout = 0) {
  curve out;
  comm::run_threads(TP * PP * dp, [&](comm::threads& world) {
    const one_thread guard;
    context<cpu> ctx;
    const int share = global_windows / dp;
    train::parallel_trainer<M, policy<cpu, Prec, layout<TP, PP>>, B, T, comm::threads, kernels::fused, scaler_for<Prec>> tr(
        ctx, config(share / B, dropout), world, parallel::ddp_options{.bucket_mb = 0.002, .zero1 = zero1});
    const long from = load.empty() ? 0 : save_at;
    if (!load.empty()) io::load_checkpoint(ctx, load, tr);
    curve c;
    for (long s = from; s < steps; ++s) {
      const auto r = tr.step(ctx, windows(s, tr.dp_rank() * share, share));
      c.loss.push_back(r.loss);
      c.scale.push_back(r.loss_scale);
      c.skipped.push_back(r.skipped);
      if (s + 1 == save_at && !save.empty()) io::save_checkpoint(ctx, save, tr, state_at(save_at), world);
    }
    if (world.rank() == 0) out = c;
  });
  return out;
}

/// One cell of the matrix: equivalence to one rank, bitwise resume on the layout, reshard to
/// one rank.
template <class Prec, int TP, int PP>
void matrix_case(int dp, bool zero1, double dropout = 0) {
  CAPTURE(Prec::name);
  CAPTURE(TP);
  CAPTURE(PP);
  CAPTURE(dp);
  CAPTURE(zero1);
  CAPTURE(dropout);
  const double tol = tolerance<Prec>();
  const curve ref = one_rank<Prec>(0, steps, {}, dropout);
  temp_dir dir;
  const curve run = layout_run<Prec, TP, PP>(dp, zero1, dir.path, {}, dropout);
  REQUIRE(run.loss.size() == std::size_t(steps));
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(run.skipped[std::size_t(s)] == ref.skipped[std::size_t(s)]);
    CHECK(run.scale[std::size_t(s)] == ref.scale[std::size_t(s)]);
    worst = std::max(worst, std::abs(run.loss[std::size_t(s)] / ref.loss[std::size_t(s)] - 1));
  }
  CHECK(worst <= tol);
  CHECK(ref.loss.back() < ref.loss.front());  // it trains
  // resume on the same layout: steps save_at.. bit for bit
  const fs::path ckpt = dir.path / io::checkpoint_dir_name(save_at);
  const curve resumed = layout_run<Prec, TP, PP>(dp, zero1, {}, ckpt, dropout);
  REQUIRE(resumed.loss.size() == std::size_t(steps - save_at));
  CHECK(std::memcmp(resumed.loss.data(), run.loss.data() + save_at, resumed.loss.size() * sizeof(double)) == 0);
  // reshard onto one rank: within the tolerance of the layout's own continuation
  const curve single = one_rank<Prec>(save_at, steps, ckpt, dropout);
  double worst_reshard = 0;
  for (std::size_t i = 0; i < single.loss.size(); ++i)
    worst_reshard = std::max(worst_reshard, std::abs(single.loss[i] / run.loss[save_at + i] - 1));
  CHECK(worst_reshard <= tol);
  MESSAGE(std::string(Prec::name) << " tp" << TP << "pp" << PP << " dp" << dp << std::string(zero1 ? " ZeRO-1" : "")
                     << std::string(dropout > 0 ? " dropout " : "") << (dropout > 0 ? doctest::toString(dropout) : doctest::String())
                     << ": " << steps
                     << " steps, worst relative loss deviation from one rank " << worst << " (bound " << tol
                     << "); resharded onto one rank " << worst_reshard);
}

}  // namespace

TEST_CASE("layout matrix (covering subset): every layout trains like one rank, resumes bit for bit, reshards") {
  // DP only (1,1,2), TP (2,1,1), PP (1,2,1), TP x PP (2,2,1), TP x PP with DP (2,2,2);
  // ZeRO-1 where there is a dp group. Every (precision, layout), (precision, ZeRO-1) and
  // (layout with dp, ZeRO-1) pair appears.
  matrix_case<precision::fp32, 1, 1>(2, true);
  matrix_case<precision::fp32, 2, 1>(1, false);
  matrix_case<precision::fp32, 1, 2>(1, false);
  matrix_case<precision::fp32, 2, 2>(1, false);
  matrix_case<precision::fp32, 2, 2>(2, false);
  matrix_case<precision::bf16, 1, 1>(2, false);
  matrix_case<precision::bf16, 2, 1>(1, false);
  matrix_case<precision::bf16, 1, 2>(1, false);
  matrix_case<precision::bf16, 2, 2>(1, false);
  matrix_case<precision::bf16, 2, 2>(2, true);
  matrix_case<precision::fp16, 1, 1>(2, true);
  matrix_case<precision::fp16, 2, 1>(1, false);
  matrix_case<precision::fp16, 1, 2>(1, false);
  matrix_case<precision::fp16, 2, 2>(1, false);
  matrix_case<precision::fp16, 2, 2>(2, false);
}

TEST_CASE("layout matrix with dropout 0.1: fp32 TP, PP, TP x DP equal one rank, resume bit for bit") {
  // Masks are keyed by (seed, step, global micro-batch, global layer, global head, position)
  // (nn/dropout.hpp), so a sharded or split run draws the single rank's masks: the same 1e-5
  // bound as without dropout, and a resumed run repeats the uninterrupted one bit for bit.
  const curve off = one_rank<precision::fp32>(0, steps), on = one_rank<precision::fp32>(0, steps, {}, 0.1);
  for (int s = 0; s < steps; ++s) CHECK(on.loss[std::size_t(s)] != off.loss[std::size_t(s)]);  // dropout is on
  matrix_case<precision::fp32, 2, 1>(1, false, 0.1);
  matrix_case<precision::fp32, 1, 2>(1, false, 0.1);
  matrix_case<precision::fp32, 2, 1>(2, true, 0.1);
}

TEST_CASE("layout matrix [full]: the whole product" * doctest::skip()) {
  auto all_layouts = []<class Prec>() {
    for (const bool z : {false, true}) {
      matrix_case<Prec, 1, 1>(2, z);
      matrix_case<Prec, 2, 1>(2, z);
      matrix_case<Prec, 1, 2>(2, z);
      matrix_case<Prec, 2, 2>(2, z);
    }
    matrix_case<Prec, 2, 1>(1, false);
    matrix_case<Prec, 1, 2>(1, false);
    matrix_case<Prec, 2, 2>(1, false);
  };
  all_layouts.template operator()<precision::fp32>();
  all_layouts.template operator()<precision::bf16>();
  all_layouts.template operator()<precision::fp16>();
}
