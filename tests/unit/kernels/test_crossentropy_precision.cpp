// The fused softmax cross-entropy on confident predictions: a loss of ~1e-6 must keep its
// relative precision in fp32 (not be rounded to a multiple of ulp(max logit)), single-rank and
// vocab-parallel, against a float64 reference. Random non-zero logits; N, V and the shard
// widths are not multiples of any SIMD width.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/parallel/tensor_parallel.hpp>

namespace {

namespace kc = loom::kernels::cpu;
namespace lp = loom::parallel;

constexpr std::size_t sz(long v) noexcept { return std::size_t(v); }

struct confident_case {
  int N = 7, V = 1003, Vp = 1008;
  std::vector<float> logits;     // (N, Vp), padded columns hold junk
  std::vector<std::int32_t> tgt;
  std::vector<double> ref_loss;  // float64 from the same fp32 logits
  std::vector<double> ref_dlogit_target;  // float64 p_target - 1 (grad_scale 1)

  explicit confident_case(std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    logits.resize(sz(N) * Vp);
    tgt.resize(sz(N));
    for (auto& x : logits) {
      double y = u(gen);
      if (std::abs(y) < 1e-3) y = 0.7;
      x = float(y);
    }
    for (auto& t : tgt) t = std::int32_t(gen() % unsigned(V));
    tgt[3] = V - 1;  // the last real column
    tgt[5] = loom::kernels::ignore_index;
    // confident rows: the target's logit 19..22 above the rest -> losses ~ V e^-20 ~ 1e-6..1e-5
    for (int n = 0; n < N; ++n)
      if (tgt[sz(n)] >= 0) logits[sz(n) * Vp + sz(tgt[sz(n)])] = float(19.0 + 0.5 * n);
    ref_loss.assign(sz(N), 0.0);
    ref_dlogit_target.assign(sz(N), 0.0);
    for (int n = 0; n < N; ++n) {
      if (tgt[sz(n)] < 0) continue;
      const float* row = logits.data() + sz(n) * Vp;
      double mx = -1e300;
      for (int v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      double s = 0;  // sum over the non-target columns of e^(x - mx); the target is the maximum here
      for (int v = 0; v < V; ++v)
        if (v != tgt[sz(n)]) s += std::exp(double(row[v]) - mx);
      ref_loss[sz(n)] = std::log1p(s);
      ref_dlogit_target[sz(n)] = std::expm1(-std::log1p(s));
    }
  }
};

}  // namespace

TEST_CASE("fused cross-entropy keeps the relative precision of a loss near 1e-6 (fp32 vs float64)") {
  const confident_case c(2024);
  std::vector<float> l = c.logits;
  std::vector<float> losses(sz(c.N));
  const float gs = 1.0f;
  const float total = kc::crossentropy_forward_backward(l.data(), losses.data(), c.tgt.data(), c.N, c.V, c.Vp, true, gs);
  double ref_total = 0;
  for (int n = 0; n < c.N; ++n) {
    CAPTURE(n);
    ref_total += c.ref_loss[sz(n)];
    if (c.tgt[sz(n)] < 0) {
      CHECK(losses[sz(n)] == 0.0f);
      continue;
    }
    REQUIRE(c.ref_loss[sz(n)] > 1e-7);
    REQUIRE(c.ref_loss[sz(n)] < 1e-4);
    CHECK(std::abs(losses[sz(n)] - c.ref_loss[sz(n)]) <= 1e-5 * c.ref_loss[sz(n)]);
    // the target's gradient p - 1 = -(1 - p): also a tiny number that must keep its digits
    const float d = l[sz(n) * c.Vp + sz(c.tgt[sz(n)])];
    CHECK(std::abs(d - c.ref_dlogit_target[sz(n)]) <= 1e-5 * std::abs(c.ref_dlogit_target[sz(n)]));
  }
  CHECK(std::abs(total - ref_total) <= 1e-5 * ref_total);
}

TEST_CASE("vocab-parallel cross-entropy keeps the relative precision of a loss near 1e-6 (TP = 2, 3)") {
  const confident_case c(77);
  for (int tp : {2, 3}) {
    CAPTURE(tp);
    const int Vp = 1008;  // divisible by 2 and 3: shards of 504 and 336 columns
    const int Vl = Vp / tp;
    std::vector<std::vector<float>> losses(sz(tp)), dlog(sz(tp));
    std::vector<float> totals(sz(tp));
    loom::comm::run_threads(tp, [&](loom::comm::threads& g) {
      const int r = g.rank();
      loom::context<loom::device::cpu> ctx;
      std::vector<float> lg(sz(c.N) * Vl);
      for (int n = 0; n < c.N; ++n)
        for (int v = 0; v < Vl; ++v) lg[sz(n) * Vl + sz(v)] = c.logits[sz(n) * Vp + sz(r * Vl + v)];
      std::vector<float> scratch(lp::vocab_parallel_crossentropy_scratch(c.N));
      losses[sz(r)].resize(sz(c.N));
      totals[sz(r)] = lp::vocab_parallel_crossentropy(ctx, lg.data(), losses[sz(r)].data(), c.tgt.data(), scratch.data(),
                                                      c.N, c.V, Vp, true, 1.0f, g);
      dlog[sz(r)] = lg;
    });
    for (int n = 0; n < c.N; ++n) {
      CAPTURE(n);
      if (c.tgt[sz(n)] < 0) continue;
      for (int r = 0; r < tp; ++r) CHECK(std::abs(losses[sz(r)][sz(n)] - c.ref_loss[sz(n)]) <= 1e-5 * c.ref_loss[sz(n)]);
      const int owner = c.tgt[sz(n)] / Vl, local = c.tgt[sz(n)] % Vl;
      const float d = dlog[sz(owner)][sz(n) * Vl + sz(local)];
      CHECK(std::abs(d - c.ref_dlogit_target[sz(n)]) <= 1e-5 * std::abs(c.ref_dlogit_target[sz(n)]));
    }
    for (int r = 1; r < tp; ++r) CHECK(totals[sz(r)] == totals[0]);
  }
}

TEST_CASE("fused and vocab-parallel cross-entropy: ties at the maximum and an unconfident target (float64 reference)") {
  // Two columns share the maximum (one is the target), a row whose target is not the maximum,
  // and a row where every logit is equal: the loss is log 2, ~11 and log V.
  const int N = 3, V = 29, Vp = 30;
  std::vector<float> logits(sz(N) * Vp);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  for (auto& x : logits) x = u(gen);
  std::vector<std::int32_t> tgt = {4, 7, 11};
  logits[0 * Vp + 4] = 30.0f;   // target at the maximum ...
  logits[0 * Vp + 20] = 30.0f;  // ... tied with another column (sum over the rest ~ 1)
  logits[1 * Vp + 2] = 12.0f;   // another column dominates row 1
  for (int v = 0; v < Vp; ++v) logits[2 * sz(Vp) + sz(v)] = 0.5f;
  std::vector<double> ref(sz(N));
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(logits[sz(n) * Vp + sz(v)]));
    for (int v = 0; v < V; ++v) s += std::exp(double(logits[sz(n) * Vp + sz(v)]) - mx);
    ref[sz(n)] = mx + std::log(s) - double(logits[sz(n) * Vp + sz(tgt[sz(n)])]);
  }
  CHECK(ref[2] == doctest::Approx(std::log(double(V))).epsilon(1e-12));
  std::vector<float> l = logits, losses(sz(N));
  kc::crossentropy_forward_backward(l.data(), losses.data(), tgt.data(), N, V, Vp, false, 0.0f);
  for (int n = 0; n < N; ++n) CHECK(std::abs(losses[sz(n)] - ref[sz(n)]) <= 2e-6 * ref[sz(n)]);
  for (int tp : {2, 3, 5}) {
    CAPTURE(tp);
    std::vector<std::vector<float>> ls(sz(tp));
    loom::comm::run_threads(tp, [&](loom::comm::threads& g) {
      const int r = g.rank(), Vl = Vp / tp;
      loom::context<loom::device::cpu> ctx;
      std::vector<float> lg(sz(N) * Vl), scratch(lp::vocab_parallel_crossentropy_scratch(N));
      for (int n = 0; n < N; ++n)
        for (int v = 0; v < Vl; ++v) lg[sz(n) * Vl + sz(v)] = logits[sz(n) * Vp + sz(r * Vl + v)];
      ls[sz(r)].resize(sz(N));
      lp::vocab_parallel_crossentropy(ctx, lg.data(), ls[sz(r)].data(), tgt.data(), scratch.data(), N, V, Vp, false,
                                      0.0f, g);
    });
    for (int n = 0; n < N; ++n) CHECK(std::abs(ls[0][sz(n)] - ref[sz(n)]) <= 2e-6 * ref[sz(n)]);
  }
}
