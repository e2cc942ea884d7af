// Every kernels::ops<ascend, T> member and the fused attention, run through loom's host emulation
// of aclnn, against loom's CPU kernels (kernels/cpu/*.hpp) in fp32 on the same (T-rounded) inputs.
// Random non-zero inputs, sizes that are multiples of nothing; NMSE thresholds per precision.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <loom/kernels/ascend.hpp>
#include <loom/kernels/cpu.hpp>

#include "support.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace loom_test;
namespace cpu = loom::kernels::cpu;

#define LOOM_ASCEND_TYPES float, Eigen::half, Eigen::bfloat16

TEST_CASE_TEMPLATE("ascend ops: matmul forward with and without bias matches the CPU kernel", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int N = 37, C = 29, OC = 23;
  const auto x = quantize<T>(randn(std::size_t(N) * C, 1)), w = quantize<T>(randn(std::size_t(OC) * C, 2, 0.3f)),
             b = quantize<T>(randn(std::size_t(OC), 3));
  auto dx = upload<T>(ctx, x), dw = upload<T>(ctx, w), db = upload<T>(ctx, b);
  dbuf<T> out(std::size_t(N) * OC, ctx.stream);
  for (bool bias : {true, false}) {
    CAPTURE(bias);
    ops::matmul_forward(ctx, out.data(), dx.data(), dw.data(), bias ? db.data() : nullptr, N, C, OC);
    std::vector<float> ref(std::size_t(N) * OC);
    cpu::matmul_forward(ref.data(), x.data(), w.data(), bias ? b.data() : nullptr, N, C, OC);
    CHECK(nmse(download(ctx, out.data(), out.size()), ref) < tolerance<T>());
  }
}

TEST_CASE_TEMPLATE("ascend ops: matmul backward accumulates dw, dbias and (optionally) dinp", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int N = 31, C = 19, OC = 27;
  const auto x = quantize<T>(randn(std::size_t(N) * C, 4)), w = quantize<T>(randn(std::size_t(OC) * C, 5, 0.3f)),
             dy = quantize<T>(randn(std::size_t(N) * OC, 6));
  for (bool acc : {true, false}) {
    CAPTURE(acc);
    const auto din0 = quantize<T>(randn(std::size_t(N) * C, 7)), dw0 = quantize<T>(randn(std::size_t(OC) * C, 8)),
               db0 = quantize<T>(randn(std::size_t(OC), 9));
    auto dX = upload<T>(ctx, x), dW = upload<T>(ctx, w), dY = upload<T>(ctx, dy);
    auto gin = upload<T>(ctx, din0), gw = upload<T>(ctx, dw0), gb = upload<T>(ctx, db0);
    ops::matmul_backward(ctx, gin.data(), gw.data(), gb.data(), dY.data(), dX.data(), dW.data(), N, C, OC, acc);
    auto rin = din0, rw = dw0, rb = db0;
    cpu::matmul_backward(rin.data(), rw.data(), rb.data(), dy.data(), x.data(), w.data(), N, C, OC, acc);
    // compare the increments where the op accumulates, so the initial values do not dominate
    auto delta = [](std::vector<float> a, const std::vector<float>& b) {
      for (std::size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
      return a;
    };
    const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 5e-4;
    CHECK(nmse(delta(download(ctx, gw.data(), gw.size()), dw0), delta(rw, dw0)) < tol);
    CHECK(nmse(delta(download(ctx, gb.data(), gb.size()), db0), delta(rb, db0)) < tol);
    if (acc) CHECK(nmse(delta(download(ctx, gin.data(), gin.size()), din0), delta(rin, din0)) < tol);
    else CHECK(nmse(download(ctx, gin.data(), gin.size()), rin) < tolerance<T>());
  }
}

TEST_CASE_TEMPLATE("ascend ops: layernorm forward and backward match the CPU kernels", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int N = 13, C = 37;
  const std::size_t NC = std::size_t(N) * C;
  auto x = randn(NC, 10, 2.0f);
  for (auto& v : x) v += 0.5f;  // a non-zero mean
  x = quantize<T>(x);
  const auto w = quantize<T>(randn(std::size_t(C), 11)), b = quantize<T>(randn(std::size_t(C), 12));
  auto dx = upload<T>(ctx, x), dw = upload<T>(ctx, w), db = upload<T>(ctx, b);
  dbuf<T> out(NC, ctx.stream);
  dbuf<float> mean(std::size_t(N), ctx.stream), rstd(std::size_t(N), ctx.stream);
  ops::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N, C);
  std::vector<float> ref(NC), rmean(static_cast<std::size_t>(N)), rrstd(static_cast<std::size_t>(N));
  cpu::layernorm_forward(ref.data(), rmean.data(), rrstd.data(), x.data(), w.data(), b.data(), N, C);
  CHECK(nmse(download(ctx, out.data(), NC), ref) < tolerance<T>());
  CHECK(nmse(download(ctx, mean.data(), std::size_t(N)), rmean) < tolerance<T>());
  CHECK(nmse(download(ctx, rstd.data(), std::size_t(N)), rrstd) < tolerance<T>());

  // backward, from the CPU's fp32 statistics so both sides see the same saved state
  const auto dy = quantize<T>(randn(NC, 13)), din0 = quantize<T>(randn(NC, 14)),
             dw0 = quantize<T>(randn(std::size_t(C), 15)), db0 = quantize<T>(randn(std::size_t(C), 16));
  auto dY = upload<T>(ctx, dy), gin = upload<T>(ctx, din0), gw = upload<T>(ctx, dw0), gb = upload<T>(ctx, db0);
  auto m = upload<float>(ctx, rmean), r = upload<float>(ctx, rrstd);
  ops::layernorm_backward(ctx, gin.data(), gw.data(), gb.data(), dY.data(), dx.data(), dw.data(), m.data(), r.data(),
                          N, C);
  auto rin = din0, rw = dw0, rb = db0;
  cpu::layernorm_backward(rin.data(), rw.data(), rb.data(), dy.data(), x.data(), w.data(), rmean.data(), rrstd.data(),
                          N, C);
  const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 2e-4;
  CHECK(nmse(download(ctx, gin.data(), NC), rin) < tol);
  CHECK(nmse(download(ctx, gw.data(), std::size_t(C)), rw) < tol);
  CHECK(nmse(download(ctx, gb.data(), std::size_t(C)), rb) < tol);
}

TEST_CASE_TEMPLATE("ascend ops: RMSNorm and SwiGLU forward/backward match the CPU kernels", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int N = 13, C = 37, H = 48;  // the SwiGLU row (2H) is 64-byte aligned for every storage type
  const std::size_t NC = std::size_t(N) * C;
  const auto x = quantize<T>(randn(NC, 40, 2.0f)), w = quantize<T>(randn(std::size_t(C), 41));
  auto dx = upload<T>(ctx, x), dw = upload<T>(ctx, w);
  dbuf<T> out(NC, ctx.stream);
  dbuf<float> rstd(std::size_t(N), ctx.stream);
  ops::rmsnorm_forward(ctx, out.data(), rstd.data(), dx.data(), dw.data(), N, C, 1e-5f);
  std::vector<float> ref(NC), rrstd(static_cast<std::size_t>(N));
  cpu::rmsnorm_forward(ref.data(), rrstd.data(), x.data(), w.data(), N, C, 1e-5f);
  CHECK(nmse(download(ctx, out.data(), NC), ref) < tolerance<T>());
  CHECK(nmse(download(ctx, rstd.data(), std::size_t(N)), rrstd) < 1e-12);

  const auto dy = quantize<T>(randn(NC, 42)), din0 = quantize<T>(randn(NC, 43)), dw0 = quantize<T>(randn(std::size_t(C), 44));
  auto dY = upload<T>(ctx, dy), gin = upload<T>(ctx, din0), gw = upload<T>(ctx, dw0), r = upload<float>(ctx, rrstd);
  ops::rmsnorm_backward(ctx, gin.data(), gw.data(), dY.data(), dx.data(), dw.data(), r.data(), N, C);
  auto rin = din0, rw = dw0;
  cpu::rmsnorm_backward(rin.data(), rw.data(), dy.data(), x.data(), w.data(), rrstd.data(), N, C);
  const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 2e-4;
  CHECK(nmse(download(ctx, gin.data(), NC), rin) < tol);
  CHECK(nmse(download(ctx, gw.data(), std::size_t(C)), rw) < tol);

  const std::size_t N2H = std::size_t(N) * 2 * H, NH = std::size_t(N) * H;
  const auto u = quantize<T>(randn(N2H, 45, 2.0f)), gu = quantize<T>(randn(NH, 46));
  auto du = upload<T>(ctx, u), dgu = upload<T>(ctx, gu);
  dbuf<T> act(NH, ctx.stream), dact(N2H, ctx.stream);
  std::vector<float> ract(NH), rdact(N2H);
  ops::swiglu_forward(ctx, act.data(), du.data(), N, H);
  cpu::swiglu_forward(ract.data(), u.data(), N, H);
  CHECK(nmse(download(ctx, act.data(), NH), ract) < tolerance<T>());
  ops::swiglu_backward(ctx, dact.data(), dgu.data(), du.data(), N, H);
  cpu::swiglu_backward(rdact.data(), gu.data(), u.data(), N, H);
  CHECK(nmse(download(ctx, dact.data(), N2H), rdact) < tolerance<T>());
  // a row of 2 x 7 elements is not a multiple of 64 bytes: loom says so before the operator does
  CHECK_THROWS_WITH_AS(ops::swiglu_backward(ctx, dact.data(), dgu.data(), du.data(), N, 7),
                       doctest::Contains("multiples of 64 bytes"), loom::input_error);
}

TEST_CASE_TEMPLATE("ascend ops: rotary embedding forward/backward on heads inside fused rows match the CPU kernels", T,
                   LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int B = 2, Tn = 7, heads = 5, hd = 6, ld = 41;  // 5 heads of 6 at the start of 41-wide rows
  const std::size_t n = std::size_t(B) * Tn * ld;
  std::vector<float> cos(std::size_t(Tn) * hd / 2), sin(cos.size());
  loom::kernels::rope_table(cos.data(), sin.data(), Tn, hd, 10000.0f);
  auto dcos = upload<float>(ctx, cos), dsin = upload<float>(ctx, sin);
  const auto x = quantize<T>(randn(n, 50, 2.0f));
  auto dx = upload<T>(ctx, x);
  ops::rope_forward(ctx, dx.data(), dcos.data(), dsin.data(), B, Tn, heads, hd, std::size_t(ld));
  auto ref = x;
  cpu::rope_forward(ref.data(), cos.data(), sin.data(), B, Tn, heads, hd, std::size_t(ld));
  const auto got = download(ctx, dx.data(), n);
  CHECK(nmse(got, ref) < tolerance<T>());
  for (std::size_t r = 0; r < std::size_t(B) * Tn; ++r)  // the rest of each row is untouched
    for (int c = heads * hd; c < ld; ++c) CHECK(got[r * ld + std::size_t(c)] == x[r * ld + std::size_t(c)]);
  ops::rope_backward(ctx, dx.data(), dcos.data(), dsin.data(), B, Tn, heads, hd, std::size_t(ld));
  cpu::rope_backward(ref.data(), cos.data(), sin.data(), B, Tn, heads, hd, std::size_t(ld));
  CHECK(nmse(download(ctx, dx.data(), n), ref) < tolerance<T>());
}

TEST_CASE_TEMPLATE("ascend ops: gelu (tanh) forward/backward and the residual add", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const std::size_t n = 1001;
  const auto x = quantize<T>(randn(n, 20, 2.0f)), g = quantize<T>(randn(n, 21)), y = quantize<T>(randn(n, 22));
  auto dx = upload<T>(ctx, x), dg = upload<T>(ctx, g), dy = upload<T>(ctx, y);
  dbuf<T> out(n, ctx.stream);
  std::vector<float> ref(n);

  ops::gelu_forward(ctx, out.data(), dx.data(), n);
  cpu::gelu_forward(ref.data(), x.data(), n);
  CHECK(nmse(download(ctx, out.data(), n), ref) < tolerance<T>());

  ops::gelu_backward(ctx, out.data(), dx.data(), dg.data(), n);
  cpu::gelu_backward(ref.data(), x.data(), g.data(), n);
  CHECK(nmse(download(ctx, out.data(), n), ref) < tolerance<T>());

  ops::residual_forward(ctx, out.data(), dx.data(), dy.data(), n);
  cpu::residual_forward(ref.data(), x.data(), y.data(), n);
  CHECK(nmse(download(ctx, out.data(), n), ref) < tolerance<T>());
  ops::residual_forward(ctx, dx.data(), dx.data(), dy.data(), n);  // out aliases a
  CHECK(nmse(download(ctx, dx.data(), n), ref) < tolerance<T>());
}

TEST_CASE_TEMPLATE("ascend ops: token + position embedding forward and backward", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int B = 3, Tn = 7, C = 19, V = 53, maxT = 11;
  std::vector<std::int32_t> tok(std::size_t(B) * Tn);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = std::int32_t((i * 17 + 5) % V);
  tok[3] = tok[9];  // a repeated token: the backward must add both rows
  const auto wte = quantize<T>(randn(std::size_t(V) * C, 30)), wpe = quantize<T>(randn(std::size_t(maxT) * C, 31));
  auto dtok = upload<std::int32_t>(ctx, tok);
  auto dwte = upload<T>(ctx, wte), dwpe = upload<T>(ctx, wpe);
  const std::size_t BTC = std::size_t(B) * Tn * C;
  dbuf<T> out(BTC, ctx.stream);
  ops::encoder_forward(ctx, out.data(), dtok.data(), dwte.data(), dwpe.data(), B, Tn, C);
  std::vector<float> ref(BTC);
  cpu::encoder_forward(ref.data(), tok.data(), wte.data(), wpe.data(), B, Tn, C);
  CHECK(nmse(download(ctx, out.data(), BTC), ref) < tolerance<T>());

  const auto dout = quantize<T>(randn(BTC, 32));
  const auto g0 = quantize<T>(randn(std::size_t(V) * C, 33)), p0 = quantize<T>(randn(std::size_t(maxT) * C, 34));
  auto dd = upload<T>(ctx, dout), gte = upload<T>(ctx, g0), gpe = upload<T>(ctx, p0);
  ops::encoder_backward(ctx, gte.data(), gpe.data(), dd.data(), dtok.data(), B, Tn, C);
  auto rte = g0, rpe = p0;
  cpu::encoder_backward(rte.data(), rpe.data(), dout.data(), tok.data(), B, Tn, C);
  const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 2e-4;
  CHECK(nmse(download(ctx, gte.data(), gte.size()), rte) < tol);
  CHECK(nmse(download(ctx, gpe.data(), gpe.size()), rpe) < tol);
}

TEST_CASE_TEMPLATE("ascend ops: fused cross-entropy loss, dlogits, padding and ignore_index", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const int N = 9, V = 41;
  for (int Vp : {48, 41}) {
    CAPTURE(Vp);
    auto logits = quantize<T>(randn(std::size_t(N) * Vp, 40, 3.0f));
    std::vector<std::int32_t> tgt(static_cast<std::size_t>(N));
    for (int i = 0; i < N; ++i) tgt[std::size_t(i)] = (i * 13 + 2) % V;
    tgt[4] = cpu::ignore_index;
    auto dl = upload<T>(ctx, logits);
    auto dt = upload<std::int32_t>(ctx, tgt);
    dbuf<float> losses(std::size_t(N), ctx.stream);
    const float scale = 1.0f / 8;
    const float total = ops::crossentropy(ctx, dl.data(), losses.data(), dt.data(), N, V, Vp, true, scale);
    std::vector<float> rlosses(static_cast<std::size_t>(N));
    auto rl = logits;
    const float rtotal = cpu::crossentropy_forward_backward(rl.data(), rlosses.data(), tgt.data(), N, V, Vp, true, scale);
    CHECK(total == doctest::Approx(rtotal).epsilon(1e-5));
    CHECK(nmse(download(ctx, losses.data(), std::size_t(N)), rlosses) < 1e-10);
    const auto got = download(ctx, dl.data(), dl.size());
    CHECK(nmse(got, rl) < tolerance<T>());
    for (int v = V; v < Vp; ++v) CHECK(got[std::size_t(v)] == 0.0f);       // padding columns
    for (int v = 0; v < Vp; ++v) CHECK(got[std::size_t(4 * Vp + v)] == 0.0f);  // ignored row
  }
}

TEST_CASE("ascend ops: cross-entropy over N >= 200,000 rows splits into calls below the operator's limit") {
  // aclnnCrossEntropyLoss[Grad] refuse N >= 200000 (561002, test_rules.cpp); loom calls them on
  // row blocks of at most 199,999. Ignored rows sit on both sides of the block boundary.
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, float>;
  const int N = 200003, V = 3, Vp = 4;
  auto logits = randn(std::size_t(N) * Vp, 41, 2.0f);
  std::vector<std::int32_t> tgt(static_cast<std::size_t>(N));
  for (int i = 0; i < N; ++i) tgt[std::size_t(i)] = (i * 7 + 1) % V;
  for (int i : {0, 199998, 199999, 200002}) tgt[std::size_t(i)] = cpu::ignore_index;
  auto dl = upload<float>(ctx, logits);
  auto dt = upload<std::int32_t>(ctx, tgt);
  dbuf<float> losses(std::size_t(N), ctx.stream);
  const auto before = loomemu_get_counters().executors_run;
  const float total = ops::crossentropy(ctx, dl.data(), losses.data(), dt.data(), N, V, Vp, true, 1.0f / N);
  CHECK(loomemu_get_counters().executors_run > before);
  std::vector<float> rlosses(static_cast<std::size_t>(N));
  auto rl = logits;
  const float rtotal = cpu::crossentropy_forward_backward(rl.data(), rlosses.data(), tgt.data(), N, V, Vp, true, 1.0f / N);
  CHECK(total == doctest::Approx(rtotal).epsilon(1e-5));
  CHECK(nmse(download(ctx, losses.data(), std::size_t(N)), rlosses) < 1e-10);
  CHECK(nmse(download(ctx, dl.data(), dl.size()), rl) < 1e-10);
}

TEST_CASE_TEMPLATE("ascend ops: sum of squares and the non-finite check", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const std::size_t n = 100003;
  auto x = quantize<T>(randn(n, 50));
  auto dx = upload<T>(ctx, x);
  const double ref = cpu::sum_of_squares(x.data(), n);
  CHECK(ops::sum_of_squares(ctx, dx.data(), n) == doctest::Approx(ref).epsilon(1e-6));
  CHECK(ops::all_finite(ctx, dx.data(), n));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    x[n / 3] = bad;
    auto dbad = upload<T>(ctx, x);
    CHECK_FALSE(ops::all_finite(ctx, dbad.data(), n));
    CHECK_FALSE(std::isfinite(ops::sum_of_squares(ctx, dbad.data(), n)));
  }
}

TEST_CASE_TEMPLATE("ascend ops: AdamW step (aclnnApplyAdamWV2) matches the CPU update", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using ops = loom::kernels::ops<npu, T>;
  const std::size_t n = 1003;
  const auto p0 = quantize<T>(randn(n, 60)), g = quantize<T>(randn(n, 61));
  auto m0 = randn(n, 62, 0.1f), v0 = randn(n, 63, 0.1f);
  for (auto& v : v0) v = v * v;
  for (float gscale : {1.0f, 0.37f}) {
    CAPTURE(gscale);
    auto dp = upload<T>(ctx, p0), dg = upload<T>(ctx, g);
    auto dm = upload<float>(ctx, m0), dv = upload<float>(ctx, v0);
    const float lr = 0.05f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const long t = 3;
    ops::adamw(ctx, dp.data(), dm.data(), dv.data(), dg.data(), n, lr, b1, b2, eps, wd, gscale, t);
    auto rp = p0, rm = m0, rv = v0;
    cpu::adamw_update(rp.data(), rm.data(), rv.data(), g.data(), n, lr, b1, b2, eps, wd, gscale, t);
    CHECK(nmse(download(ctx, dm.data(), n), rm) < 1e-10);
    CHECK(nmse(download(ctx, dv.data(), n), rv) < 1e-10);
    auto got = download(ctx, dp.data(), n);
    for (std::size_t i = 0; i < n; ++i) {  // compare the update, not the parameter it is added to
      got[i] -= p0[i];
      rp[i] -= p0[i];
    }
    const double tol = std::is_same_v<T, float> ? 1e-8 : std::is_same_v<T, Eigen::half> ? 1e-3 : 2e-2;
    CHECK(nmse(got, rp) < tol);
  }
}

namespace {
/// Softmax row max and sum (of exp(s - max)) of causal attention, in double, [B, NH, T].
void softmax_stats(const std::vector<float>& qkv, int B, int Tn, int C, int NH, std::vector<double>& mx,
                   std::vector<double>& sm) {
  const int HD = C / NH;
  mx.assign(std::size_t(B) * NH * Tn, 0);
  sm.assign(mx.size(), 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < Tn; ++i) {
        std::vector<double> s(std::size_t(i) + 1);
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < HD; ++d)
            dot += double(qkv[(std::size_t(b) * Tn + i) * 3 * C + h * HD + d]) *
                   qkv[(std::size_t(b) * Tn + j) * 3 * C + C + h * HD + d];
          s[std::size_t(j)] = dot / std::sqrt(double(HD));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        mx[(std::size_t(b) * NH + h) * Tn + i] = m;
        sm[(std::size_t(b) * NH + h) * Tn + i] = sum;
      }
}
}  // namespace

TEST_CASE_TEMPLATE("ascend attention<fused>: flash attention forward, saved softmax stats and backward", T,
                   LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using attn = loom::kernels::attention<npu, T, loom::kernels::fused>;
  const int B = 2, Tn = 13, NH = 3, C = 15;
  const std::size_t BTC = std::size_t(B) * Tn * C;
  const auto qkv = quantize<T>(randn(3 * BTC, 70));
  auto dqkv_in = upload<T>(ctx, qkv);
  dbuf<T> out(BTC, ctx.stream);
  dbuf<float> saved(attn::saved_elems(B, NH, Tn), ctx.stream);
  attn::forward(ctx, out.data(), saved.data(), dqkv_in.data(), B, Tn, C, NH);

  std::vector<float> ref(BTC), att(std::size_t(B) * NH * Tn * Tn);
  cpu::attention_forward(ref.data(), att.data(), qkv.data(), B, Tn, C, NH);
  const auto got_out = download(ctx, out.data(), BTC);
  CHECK(nmse(got_out, ref) < tolerance<T>());

  // saved state: softmaxMax then softmaxSum, [B,NH,T,8], the statistic replicated 8 times
  std::vector<double> mx, sm;
  softmax_stats(qkv, B, Tn, C, NH, mx, sm);
  const auto st = download(ctx, saved.data(), saved.size());
  const std::size_t per = std::size_t(B) * NH * Tn * 8;
  for (std::size_t r = 0; r < mx.size(); ++r)
    for (int k = 0; k < 8; ++k) {
      CHECK(st[r * 8 + std::size_t(k)] == doctest::Approx(mx[r]).epsilon(1e-5));
      CHECK(st[per + r * 8 + std::size_t(k)] == doctest::Approx(sm[r]).epsilon(1e-5));
    }

  const auto dy = quantize<T>(randn(BTC, 71));
  auto ddy = upload<T>(ctx, dy);
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
#else
  const int threads = 1;
#endif
  std::vector<float> rdqkv(3 * BTC), scratch(std::size_t(threads) * Tn * Tn);
  cpu::attention_backward(rdqkv.data(), dy.data(), qkv.data(), att.data(), scratch.data(), B, Tn, C, NH);
  const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 5e-4;
  for (bool given_out : {false, true}) {
    CAPTURE(given_out);
    dbuf<T> dqkv(3 * BTC, ctx.stream);
    if (given_out)
      attn::backward(ctx, dqkv.data(), ddy.data(), dqkv_in.data(), out.data(), saved.data(), nullptr, B, Tn, C, NH);
    else
      attn::backward(ctx, dqkv.data(), ddy.data(), dqkv_in.data(), saved.data(), nullptr, B, Tn, C, NH);
    CHECK(nmse(download(ctx, dqkv.data(), 3 * BTC), rdqkv) < tol);
  }
}

TEST_CASE_TEMPLATE("ascend attention<fused>: grouped-query attention (6 query heads on 2 key/value heads) matches the "
                   "CPU's", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using attn = loom::kernels::attention<npu, T, loom::kernels::fused>;
  const int B = 2, Tn = 11, NH = 6, KV = 2, HD = 4, C = NH * HD, W = (NH + 2 * KV) * HD;
  const std::size_t BT = std::size_t(B) * Tn, BTC = BT * C, BTW = BT * W;
  const auto qkv = quantize<T>(randn(BTW, 75));
  auto dqkv_in = upload<T>(ctx, qkv);
  dbuf<T> out(BTC, ctx.stream);
  dbuf<float> saved(attn::saved_elems(B, NH, Tn), ctx.stream);
  attn::forward(ctx, out.data(), saved.data(), dqkv_in.data(), B, Tn, C, NH, nullptr, KV);
  std::vector<float> ref(BTC), lse(std::size_t(B) * NH * Tn);
  cpu::attention_fused_forward(ref.data(), lse.data(), qkv.data(), B, Tn, C, NH, nullptr, {}, KV);
  CHECK(nmse(download(ctx, out.data(), BTC), ref) < tolerance<T>());

  const auto dy = quantize<T>(randn(BTC, 76));
  auto ddy = upload<T>(ctx, dy);
  std::vector<float> rdqkv(BTW), scratch(cpu::attention_fused_scratch_elems(64, std::size_t(Tn)));
  cpu::attention_fused_backward(rdqkv.data(), dy.data(), qkv.data(), ref.data(), lse.data(), scratch.data(), B, Tn, C,
                                NH, nullptr, {}, KV);
  const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 5e-4;
  dbuf<T> dqkv(BTW, ctx.stream);
  attn::backward(ctx, dqkv.data(), ddy.data(), dqkv_in.data(), out.data(), saved.data(), nullptr, B, Tn, C, NH, nullptr, KV);
  const auto got = download(ctx, dqkv.data(), BTW);
  CHECK(nmse(got, rdqkv) < tol);
  // the key/value gradient is the sum over each group of 3 query heads: not zero, not one head's
  double kv_norm = 0;
  for (std::size_t r = 0; r < BT; ++r)
    for (int c = C; c < W; ++c) kv_norm += double(got[r * W + std::size_t(c)]) * got[r * W + std::size_t(c)];
  CHECK(kv_norm > 0);
  CHECK_THROWS_AS(attn::forward(ctx, out.data(), saved.data(), dqkv_in.data(), B, Tn, C, NH, nullptr, 4),
                  loom::input_error);  // 4 key/value heads do not divide 6 query heads
}

TEST_CASE_TEMPLATE("ascend attention<fused>: key padding matches attention<cpu, float, fused>", T, LOOM_ASCEND_TYPES) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  using attn = loom::kernels::attention<npu, T, loom::kernels::fused>;
  using cattn = loom::kernels::attention<loom::device::cpu, float, loom::kernels::fused>;
  const int B = 2, Tn = 11, NH = 2, C = 12;
  const std::size_t BTC = std::size_t(B) * Tn * C;
  const auto qkv = quantize<T>(randn(3 * BTC, 80));
  std::vector<std::uint8_t> pad(std::size_t(B) * Tn, 0);
  pad[0] = 1;  // batch 0: key 0 padded -> query 0 sees no key at all (output 0)
  pad[5] = 1;
  for (int t = 7; t < Tn; ++t) pad[std::size_t(Tn + t)] = 1;  // batch 1: a padded tail
  auto dqkv_in = upload<T>(ctx, qkv);
  auto dpad = upload<std::uint8_t>(ctx, pad);
  dbuf<T> out(BTC, ctx.stream);
  dbuf<float> saved(attn::saved_elems(B, NH, Tn), ctx.stream);
  attn::forward(ctx, out.data(), saved.data(), dqkv_in.data(), B, Tn, C, NH, dpad.data());

  loom::context<loom::device::cpu> cctx;
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
#else
  const int threads = 1;
#endif
  std::vector<float> ref(BTC), lse(cattn::saved_elems(B, NH, Tn)), scratch(cattn::scratch_elems(std::size_t(threads), Tn));
  cattn::forward(cctx, ref.data(), lse.data(), qkv.data(), B, Tn, C, NH, pad.data());
  const auto got = download(ctx, out.data(), BTC);
  CHECK(nmse(got, ref) < tolerance<T>());
  for (int c = 0; c < C; ++c) CHECK(got[std::size_t(c)] == 0.0f);  // the query with no visible key

  const auto dy = quantize<T>(randn(BTC, 81));
  auto ddy = upload<T>(ctx, dy);
  std::vector<float> rdqkv(3 * BTC);
  cattn::backward(cctx, rdqkv.data(), dy.data(), qkv.data(), ref.data(), lse.data(), scratch.data(), B, Tn, C, NH,
                  pad.data());
  dbuf<T> dqkv(3 * BTC, ctx.stream);
  attn::backward(ctx, dqkv.data(), ddy.data(), dqkv_in.data(), saved.data(), nullptr, B, Tn, C, NH, dpad.data());
  const double tol = std::is_same_v<T, float> ? 1e-10 : std::is_same_v<T, Eigen::half> ? 1e-5 : 5e-4;
  CHECK(nmse(download(ctx, dqkv.data(), 3 * BTC), rdqkv) < tol);
}
