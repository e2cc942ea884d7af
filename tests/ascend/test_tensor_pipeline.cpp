// Tensor and pipeline parallelism on device::ascend with comm::hccl, through loom's host emulation
// (ranks are threads, each with its own emulated NPU and HCCL rank):
//  * the vocab-parallel embedding and cross-entropy (kernels/ascend/vocab_parallel.hpp under
//    parallel/tensor_parallel.hpp) at TP = 4 — shards with all, some and none of their columns
//    real, ignored targets — with fp32 and bf16 storage against the CPU's single-rank encoder and
//    fused cross-entropy;
//  * the one trainer at (TP, PP, DP) = (2,1,1), (1,2,1), (2,2,2) on models::tiny_parallel
//    against one ascend rank and one cpu rank on the same global batch (the loss curve).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/parallel/tensor_parallel.hpp>
#include <loom/train/trainer.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "support.hpp"
#include "../support/layout_matrix.hpp"

using namespace loom_test;

namespace {

/// OpenMP threads of the calling thread set to 1 for the guard's lifetime (ranks are threads;
/// CI has 2 cores).
struct one_thread {
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  one_thread() { omp_set_num_threads(1); }
  ~one_thread() { omp_set_num_threads(saved); }
#endif
};

/// max |a - b| / max |b|.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

}  // namespace

namespace {

/// The vocab-parallel embedding (forward, backward) and cross-entropy at TP = 4 with storage T on
/// ascend against the CPU's single-rank kernels in float on the same (T-rounded) inputs. T =
/// float: NMSE < 1e-12; 16-bit T: the device rounds its T outputs (embedding rows, dlogits, the
/// position gradient's per-call sum) once, NMSE < tolerance<T>().
template <class T>
void vocab_parallel_case() {
  const std::string type = type_name<T>();
  CAPTURE(type);
  constexpr bool exact = std::is_same_v<T, float>;
  const double tol = exact ? 1e-12 : tolerance<T>();
  // V = 40 of Vp = 64 over 4 ranks of 16 rows: rank 0, 1 all real, rank 2 half (8), rank 3 none
  constexpr int tp = 4, V = 40, Vp = 64, C = 6, B = 2, Tn = 5, N = B * Tn, rows = Vp / tp;
  constexpr float grad_scale = 0.125f;
  std::vector<std::int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; ++i) {
    tok[std::size_t(i)] = std::int32_t((i * 13 + 5) % V);
    tgt[std::size_t(i)] = i % 4 == 3 ? loom::kernels::ignore_index : std::int32_t((i * 7 + 2) % V);
  }
  tgt[1] = 35;  // a target in rank 2's half-real shard
  const auto wte = quantize<T>(randn(std::size_t(Vp) * C, 41, 0.5f)), wpe = quantize<T>(randn(std::size_t(Tn) * C, 42, 0.5f)),
             dout = quantize<T>(randn(std::size_t(N) * C, 43)), logits = quantize<T>(randn(std::size_t(N) * Vp, 44, 2.0f));
  // cpu, one rank
  std::vector<float> out_ref(std::size_t(N) * C), dwte_ref(wte.size(), 0.0f), dwpe_ref(wpe.size(), 0.0f),
      dlogits_ref = logits, losses_ref(static_cast<std::size_t>(N));
  loom::kernels::cpu::encoder_forward(out_ref.data(), tok.data(), wte.data(), wpe.data(), B, Tn, C);
  loom::kernels::cpu::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tok.data(), B, Tn, C);
  const float loss_ref = loom::kernels::cpu::crossentropy_forward_backward(dlogits_ref.data(), losses_ref.data(),
                                                                           tgt.data(), N, V, Vp, true, grad_scale);
  struct result {
    std::vector<float> out, dwte, dwpe, losses, dlogits;
    float loss = 0;
  };
  std::vector<result> got(tp);
  loom::comm::run_threads(tp, [&](loom::comm::threads& boot) {
    const one_thread guard;
    const int r = boot.rank(), begin = r * rows;
    loom::device::ascend_device dev(runtime(), r);
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create(boot, ctx);
    std::vector<float> wte_local(wte.begin() + std::ptrdiff_t(begin) * C, wte.begin() + std::ptrdiff_t(begin + rows) * C),
        logits_local(std::size_t(N) * rows);
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < rows; ++v) logits_local[std::size_t(n) * rows + v] = logits[std::size_t(n) * Vp + begin + v];
    auto tok_d = upload<std::int32_t>(ctx, tok), tgt_d = upload<std::int32_t>(ctx, tgt);
    auto wte_d = upload<T>(ctx, wte_local), wpe_d = upload<T>(ctx, wpe), dout_d = upload<T>(ctx, dout),
         lg_d = upload<T>(ctx, logits_local);
    auto out_d = upload<T>(ctx, std::vector<float>(std::size_t(N) * C, 7.0f));  // overwritten
    auto dwte_d = upload<float>(ctx, std::vector<float>(wte_local.size(), 0.0f)),
         dwpe_d = upload<float>(ctx, std::vector<float>(wpe.size(), 0.0f)),
         losses_d = upload<float>(ctx, std::vector<float>(static_cast<std::size_t>(N), 0.0f)),
         scratch_d = upload<float>(ctx, std::vector<float>(loom::parallel::vocab_parallel_crossentropy_scratch(N), 0.0f));
    namespace lp = loom::parallel;
    lp::vocab_parallel_embedding_forward(ctx, out_d.data(), tok_d.data(), wte_d.data(), wpe_d.data(), B, Tn, C, Vp, hc);
    lp::vocab_parallel_embedding_backward(ctx, dwte_d.data(), dwpe_d.data(), dout_d.data(), tok_d.data(), B, Tn, C, Vp,
                                          hc);
    const float loss = lp::vocab_parallel_crossentropy(ctx, lg_d.data(), losses_d.data(), tgt_d.data(), scratch_d.data(),
                                                       N, V, Vp, true, grad_scale, hc);
    result& g = got[std::size_t(r)];
    g.out = download(ctx, out_d.data(), out_d.size());
    g.dwte = download(ctx, dwte_d.data(), dwte_d.size());
    g.dwpe = download(ctx, dwpe_d.data(), dwpe_d.size());
    g.losses = download(ctx, losses_d.data(), losses_d.size());
    g.dlogits = download(ctx, lg_d.data(), lg_d.size());
    g.loss = loss;
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    const result& g = got[std::size_t(r)];
    const int begin = r * rows;
    CHECK(nmse(g.out, out_ref) < tol);
    CHECK(g.out == got[0].out);  // one all-reduce: replicated bit for bit
    CHECK(nmse(g.dwpe, dwpe_ref) < tol);
    const std::vector<float> dwte_want(dwte_ref.begin() + std::ptrdiff_t(begin) * C,
                                       dwte_ref.begin() + std::ptrdiff_t(begin + rows) * C);
    CHECK(nmse(g.dwte, dwte_want) < tol);
    CHECK(max_rel_diff(g.losses, losses_ref) < 1e-6);
    CHECK(g.losses == got[0].losses);
    CHECK(g.loss == got[0].loss);
    CHECK(double(g.loss) == doctest::Approx(double(loss_ref)).epsilon(1e-6));
    std::vector<float> dl_want(std::size_t(N) * rows);
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < rows; ++v) dl_want[std::size_t(n) * rows + v] = dlogits_ref[std::size_t(n) * Vp + begin + v];
    if (r < 3) CHECK(nmse(g.dlogits, dl_want) < tol);
    else CHECK(g.dlogits == dl_want);  // no real column: all zero, as the cpu's padding columns
  }
  MESSAGE("TP=4 vocab-parallel " << type << ": loss " << got[0].loss << " vs cpu " << loss_ref);
}

}  // namespace

TEST_CASE("vocab-parallel embedding and cross-entropy on ascend with comm::hccl (emulated): TP=4 equals cpu one rank") {
  vocab_parallel_case<float>();
  vocab_parallel_case<Eigen::bfloat16>();
}

namespace {

using MP = loom::models::tiny_parallel;
constexpr int LB = 2, LT = 8, lsteps = 3;
constexpr int global_windows = 8;  // per step: dp * grad_accum * LB

// The windows of the CPU layout matrix (tests/support/layout_matrix.hpp: next token = 7 t + 3
// mod vocab, every 4th random), so the emulated device trains on the same batches.
static_assert(LB == loom_test::layout_matrix::B && LT == loom_test::layout_matrix::T);
using loom_test::layout_matrix::windows;

loom::train::trainer_config layout_config(int accum) {
  loom::train::trainer_config c;
  c.micro_batch = LB;
  c.seq_len = LT;
  c.grad_accum = accum;
  c.schedule = {3e-3, 3e-4, 1, 8};
  c.seed = 31;
  return c;
}

/// The loss curve of one rank on the whole global batch, on device D.
template <class D, class Prec>
std::vector<double> one_rank_curve(loom::context<D>& ctx) {
  loom::train::trainer<MP, loom::policy<D, Prec>, LB, LT, loom::parallel::local_group, loom::kernels::fused> tr(ctx, layout_config(global_windows / LB));
  std::vector<double> loss;
  for (long s = 0; s < lsteps; ++s) loss.push_back(tr.step(ctx, windows(s, 0, global_windows)).loss);
  return loss;
}

/// layout<TP, PP> x dp ranks on device::ascend over comm::hccl (world rank 0's curve; every rank's
/// losses are checked equal).
template <int TP, int PP>
std::vector<double> ascend_layout_curve(int dp) {
  using policy = loom::policy<npu, loom::precision::fp32_ascend_matmul, loom::layout<TP, PP>>;
  using trainer_t = loom::train::trainer<MP, policy, LB, LT, loom::comm::hccl, loom::kernels::fused>;
  const int world = TP * PP * dp;
  std::vector<std::vector<double>> curves(static_cast<std::size_t>(world));
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    const one_thread guard;
    loom::device::ascend_device dev(runtime(), boot.rank());
    auto& ctx = dev.context();
    loom::comm::hccl_options o;
    o.timeout = std::chrono::seconds(120);  // a hang fails the test instead of waiting 10 minutes
    auto hc = loom::comm::hccl::create(boot, ctx, o);
    const int share = global_windows / dp;
    trainer_t tr(ctx, layout_config(share / LB), hc, loom::parallel::ddp_options{.bucket_mb = 0.002});
    std::vector<double> loss;
    for (long s = 0; s < lsteps; ++s) loss.push_back(tr.step(ctx, windows(s, tr.dp_rank() * share, share)).loss);
    curves[std::size_t(boot.rank())] = loss;
  });
  for (int r = 1; r < world; ++r) CHECK(curves[std::size_t(r)] == curves[0]);  // every rank reports the same
  return curves[0];
}

template <int TP, int PP>
void layout_case(int dp, const std::vector<double>& npu_one, const std::vector<double>& cpu_one) {
  CAPTURE(TP);
  CAPTURE(PP);
  CAPTURE(dp);
  const auto curve = ascend_layout_curve<TP, PP>(dp);
  REQUIRE(curve.size() == std::size_t(lsteps));
  double vs_npu = 0, vs_cpu = 0;
  for (int s = 0; s < lsteps; ++s) {
    vs_npu = std::max(vs_npu, std::abs(curve[std::size_t(s)] / npu_one[std::size_t(s)] - 1));
    vs_cpu = std::max(vs_cpu, std::abs(curve[std::size_t(s)] / cpu_one[std::size_t(s)] - 1));
  }
  MESSAGE("ascend (TP,PP,DP) = (" << TP << "," << PP << "," << dp << ") over hccl: losses " << curve[0] << " "
                                  << curve[1] << " " << curve[2] << "; worst relative deviation from one ascend rank "
                                  << vs_npu << ", from one cpu rank " << vs_cpu);
  // fp32 (u = 2^-24): the layouts add the same products in other orders (tp all-reduces, dp
  // bucket sums, the vocab-parallel softmax) — 1e-5 relative, as tests/unit/train/test_layout_matrix.cpp
  CHECK(vs_npu <= 1e-5);
  CHECK(vs_cpu <= 1e-5);
}

}  // namespace

TEST_CASE("tensor x pipeline x data parallel on ascend/fp32 with comm::hccl (emulated): layouts equal one rank") {
  std::vector<double> npu_one, cpu_one;
  {
    const one_thread guard;
    loom::device::ascend_device dev(runtime(), 0);
    npu_one = one_rank_curve<npu, loom::precision::fp32_ascend_matmul>(dev.context());
    loom::context<loom::device::cpu> cctx;
    cpu_one = one_rank_curve<loom::device::cpu, loom::precision::fp32>(cctx);
  }
  REQUIRE(npu_one.size() == std::size_t(lsteps));
  CHECK(npu_one.back() < npu_one.front());  // it trains
  layout_case<2, 1>(1, npu_one, cpu_one);
  layout_case<1, 2>(1, npu_one, cpu_one);
  layout_case<2, 2>(2, npu_one, cpu_one);
}
