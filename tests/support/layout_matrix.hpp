#pragma once
// The layout-matrix equivalence check of the one trainer (train::trainer), shared by the
// comm::threads test (tests/unit/train/test_layout_matrix.cpp) and the comm::mpi test
// (tests/mpi/test_layout_matrix_mpi.cpp). One cell = (precision, layout<TP,PP>, dp, ZeRO-1):
//   - the loss of every step within a tolerance derived from the precision's unit roundoff
//     (fp32 u = 2^-24: 1e-5 relative; bf16 u = 2^-8: 2^-7; fp16 u = 2^-11: 2^-9) of one rank
//     (train::trainer) on the same global batch, with the same loss scale and skipped steps;
//   - a checkpoint saved after step save_at resumes on the same layout bit for bit (losses of
//     the remaining steps), and loads onto one rank (resharded) within the tolerance.
// The backends differ only in how the ranks of a layout run: a launcher
//   run(save, load) -> curve    world rank 0's curve (every rank's is the same)
// built from layout_rank(), which one rank of the layout executes over its world communicator.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

namespace loom_test::layout_matrix {

namespace fs = std::filesystem;
using M = loom::models::tiny_parallel;
using cpu = loom::device::cpu;
constexpr int B = 2, T = 8, steps = 4, save_at = 2;

/// Relative loss tolerance of a precision: a small multiple of its unit roundoff.
template <class Prec>
constexpr double tolerance() {
  if constexpr (std::is_same_v<Prec, loom::precision::bf16>) return 1.0 / 128;    // u = 2^-8
  else if constexpr (std::is_same_v<Prec, loom::precision::fp16>) return 1.0 / 512;  // u = 2^-11
  else return 1e-5;                                                                // u = 2^-24
}

template <class Prec>
using scaler_for =
    std::conditional_t<Prec::needs_loss_scaling, loom::precision::dynamic_loss_scaler, loom::precision::no_loss_scaler>;

/// Rows [first, first + count) of step s's global batch of windows of T+1 tokens (next token
/// = 7 t + 3 mod vocab, every 4th random), the same for every layout.
inline std::vector<std::int32_t> windows(long s, int first, int count) {
  std::vector<std::int32_t> out;
  for (int w = first; w < first + count; ++w)
    for (int i = 0; i <= T; ++i) {
      const auto noise = loom::random_below(4, 41, std::uint64_t(s), std::uint64_t(w * (T + 1) + i));
      out.push_back(i == 0 || noise == 0
                        ? std::int32_t(loom::random_below(M::vocab, 42, std::uint64_t(s), std::uint64_t(w * (T + 1) + i)))
                        : (7 * out.back() + 3) % M::vocab);
    }
  return out;
}

inline loom::train::trainer_config config(int accum, double dropout = 0) {
  loom::train::trainer_config c;
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
  /// Ranks whose trainer did not allocate, kind by kind, what Trainer::plan said (summed over
  /// the world; -1: not checked).
  double plan_mismatches = -1;
  void add(const loom::train::step_result& r) {
    loss.push_back(r.loss);
    scale.push_back(r.loss_scale);
    skipped.push_back(r.skipped);
  }
};

/// OpenMP threads of the calling thread set to 1 for the guard's lifetime (ranks are threads,
/// or processes sharing few cores).
struct one_thread {
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  one_thread() { omp_set_num_threads(1); }
  ~one_thread() { omp_set_num_threads(saved); }
#endif
};

inline loom::io::run_state state_at(long s) {
  loom::io::run_state st;
  st.data = {{"kind", "matrix"}, {"step", s}};
  return st;
}

/// One rank of `Model` (tiny_parallel, or another config of its vocabulary) on the whole global
/// batch of `global_windows` windows: steps [from, to), optionally loading `load` first (then
/// steps before `from` are not run); dropout probability `dropout` (0: off).
template <class Prec, class Model = M>
curve one_rank(int global_windows, long from, long to, const fs::path& load = {}, double dropout = 0) {
  const one_thread guard;
  loom::context<cpu> ctx;
  loom::train::trainer<Model, loom::policy<cpu, Prec>, B, T, loom::parallel::local_group, loom::kernels::fused, scaler_for<Prec>> tr(
      ctx, config(global_windows / B, dropout));
  if (!load.empty()) loom::io::load_checkpoint(ctx, load, tr);
  curve c;
  for (long s = load.empty() ? 0 : from; s < to; ++s) {
    const auto r = tr.step(ctx, windows(s, 0, global_windows));
    if (s >= from) c.add(r);
  }
  return c;
}

/// True when trainer `tr`'s allocation equals its type's memory plan kind by kind (the
/// optimizer as masters + moments; buckets when a data-parallel engine is attached).
template <class Trainer>
bool plan_matches(const Trainer& tr, bool zero1) {
  const loom::parallel::ddp_options ddp{.bucket_mb = 0.002, .zero1 = zero1};
  const auto p = Trainer::plan(tr.config(), tr.dp_size(), tr.dp_rank(), tr.stage(),
                               tr.dp_size() > 1 || zero1 ? &ddp : nullptr);
  const std::size_t buckets = tr.data_parallel() ? tr.data_parallel()->memory().buckets : 0;
  return p.parameters == tr.model().parameters().bytes() && p.gradients == tr.model().gradients().bytes() &&
         p.optimizer() == tr.optimizer_bytes() && p.host_optimizer == tr.host_optimizer_bytes() &&
         p.activations == tr.activation_bytes() && p.buckets == buckets;
}

/// One rank of layout<TP, PP> x dp (dp = world.size() / (TP*PP)), ZeRO-1 on the dp group if
/// zero1, over its world communicator (collective): steps [0, steps) with a collective save
/// after step save_at into `save` (if given), or steps [save_at, steps) after loading `load`.
/// Returns this rank's curve (the same on every rank).
template <class Prec, int TP, int PP, class Model = M, class Comm>
curve layout_rank(Comm& world, int global_windows, bool zero1, const fs::path& save, const fs::path& load = {},
                  double dropout = 0) {
  const one_thread guard;
  loom::context<cpu> ctx;
  const int dp = world.size() / (TP * PP);
  const int share = global_windows / dp;
  loom::train::trainer<Model, loom::policy<cpu, Prec, loom::layout<TP, PP>>, B, T, Comm, loom::kernels::fused,
                                scaler_for<Prec>>
      tr(ctx, config(share / B, dropout), world, loom::parallel::ddp_options{.bucket_mb = 0.002, .zero1 = zero1});
  const long from = load.empty() ? 0 : save_at;
  if (!load.empty()) loom::io::load_checkpoint(ctx, load, tr);
  curve c;
  c.plan_mismatches = loom::parallel::sum_over(ctx, world, plan_matches(tr, zero1) ? 0.0 : 1.0);
  for (long s = from; s < steps; ++s) {
    c.add(tr.step(ctx, windows(s, tr.dp_rank() * share, share)));
    if (s + 1 == save_at && !save.empty()) loom::io::save_checkpoint(ctx, save, tr, state_at(save_at), world);
  }
  return c;
}

/// The checks of one cell. `run(save, load)` runs the layout (see the file comment) and returns
/// world rank 0's curve; `dir` is a directory every rank can write and read; `report`: print the
/// deviations (one process of an MPI run does); `dropout`: the probability the run trains with;
/// `Model`: the config `run` trains (the one-rank reference trains it too).
template <class Prec, class Model = M, class Run>
void check_cell(const std::string& what, int global_windows, const fs::path& dir, Run&& run, bool report = true,
                double dropout = 0) {
  CAPTURE(what);
  const double tol = tolerance<Prec>();
  const curve ref = one_rank<Prec, Model>(global_windows, 0, steps, {}, dropout);
  const curve got = run(dir, fs::path());
  REQUIRE(got.loss.size() == std::size_t(steps));
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(got.skipped[std::size_t(s)] == ref.skipped[std::size_t(s)]);
    CHECK(got.scale[std::size_t(s)] == ref.scale[std::size_t(s)]);
    worst = std::max(worst, std::abs(got.loss[std::size_t(s)] / ref.loss[std::size_t(s)] - 1));
  }
  CHECK(worst <= tol);
  CHECK(ref.loss.back() < ref.loss.front());  // it trains
  CHECK(got.plan_mismatches == 0);            // every rank allocated what Trainer::plan said
  // resume on the same layout: steps save_at.. bit for bit
  const fs::path ckpt = dir / loom::io::checkpoint_dir_name(save_at);
  const curve resumed = run(fs::path(), ckpt);
  REQUIRE(resumed.loss.size() == std::size_t(steps - save_at));
  CHECK(std::memcmp(resumed.loss.data(), got.loss.data() + save_at, resumed.loss.size() * sizeof(double)) == 0);
  // reshard onto one rank: within the tolerance of the layout's own continuation
  const curve single = one_rank<Prec, Model>(global_windows, save_at, steps, ckpt, dropout);
  double worst_reshard = 0;
  for (std::size_t i = 0; i < single.loss.size(); ++i)
    worst_reshard = std::max(worst_reshard, std::abs(single.loss[i] / got.loss[save_at + i] - 1));
  CHECK(worst_reshard <= tol);
  if (report)
    MESSAGE(what << ": " << steps << " steps, worst relative loss deviation from one rank " << worst << " (bound "
                 << tol << "); resharded onto one rank " << worst_reshard);
}

/// "bf16 tp2pp1 dp2 ZeRO-1": the cell's name in messages.
template <class Prec>
std::string cell_name(int tp, int pp, int dp, bool zero1) {
  return std::string(Prec::name) + " tp" + std::to_string(tp) + "pp" + std::to_string(pp) + " dp" + std::to_string(dp) +
         (zero1 ? " ZeRO-1" : "");
}

}  // namespace loom_test::layout_matrix
