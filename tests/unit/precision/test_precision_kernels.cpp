// Every CPU kernel in bfloat16 and half storage against the float64 kernel on the same
// (already rounded) inputs.
//
// Tolerance, from the formats: with fp32 accumulation and one rounding to the storage type
// on store, the only error of a 16-bit output y against the exact value r of the same
// rounded inputs is that rounding, |y - r| <= u |r|, where u = 2^-p is the unit roundoff for
// p significand bits: bf16 has 8 (u = 2^-8 = 3.9e-3), fp16 has 11 (u = 2^-11 = 4.9e-4) —
// plus fp32's own accumulation error, which we bound by 2e-5 * max|r| (K <= 128 terms of
// fp32, unit roundoff 2^-24, and some cancellation), plus half the smallest fp16 subnormal
// (2^-25) for values fp16 stores in its subnormal range. Outputs kept in fp32 (LayerNorm
// statistics, losses, parameter gradients, master weights) get u = 0. A kernel that rounded
// an intermediate to 16 bits, or accumulated in 16 bits, exceeds this bound (up to 2u and
// more), so these tests fail on exactly the mistakes mixed precision invites.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/kernels/cpu/rmsnorm.hpp>
#include <loom/kernels/cpu/rope.hpp>
#include <loom/kernels/cpu/swiglu.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace loom::kernels::cpu;
using vec = std::vector<double>;

template <class T>
constexpr double unit_roundoff = std::is_same_v<T, Eigen::bfloat16> ? 0x1p-8 : 0x1p-11;

/// n values N(0, sd^2) rounded to T (returned as T) from a fixed seed.
template <class T>
std::vector<T> randn(std::size_t n, std::uint64_t seed, double sd = 1.0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(sd * loom::random_normal(seed, 7, i));
  return v;
}

template <class X>
vec widen(const std::vector<X>& x) {
  return vec(x.begin(), x.end());
}
template <class X>
vec widen(const X* x, std::size_t n) {
  vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = double(x[i]);
  return v;
}

/// Largest |got - ref| / (u |ref| + 2e-5 max|ref| + 2^-25): <= 1 when the only error is one
/// rounding to a format of unit roundoff u on top of fp32 accumulation.
double rounding_ratio(const vec& got, const vec& ref, double u) {
  REQUIRE(got.size() == ref.size());
  double mx = 0;
  for (double r : ref) mx = std::max(mx, std::abs(r));
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    worst = std::max(worst, std::abs(got[i] - ref[i]) / (u * std::abs(ref[i]) + 2e-5 * mx + 0x1p-25));
  }
  return worst;
}

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace

TEST_CASE_TEMPLATE("precision kernels: matmul forward and backward in 16-bit storage round once", T, Eigen::bfloat16,
                   Eigen::half) {
  const double u = unit_roundoff<T>;
  // OC = 131: several 64-column blocks of the bias gradient, with a tail
  for (const auto& shape : {std::array{37, 53, 29}, std::array{19, 23, 131}}) {
    const int N = shape[0], C = shape[1], OC = shape[2];
    CAPTURE(OC);
    const auto x = randn<T>(std::size_t(N) * C, 1), w = randn<T>(std::size_t(OC) * C, 2, 0.2), b = randn<T>(OC, 3);
    const auto dy = randn<T>(std::size_t(N) * OC, 4);
    vec xd = widen(x), wd = widen(w), bd = widen(b), dyd = widen(dy);
    std::vector<T> y(std::size_t(N) * OC);
    matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    vec yr(y.size());
    matmul_forward(yr.data(), xd.data(), wd.data(), bd.data(), N, C, OC);
    CHECK(rounding_ratio(widen(y), yr, u) <= 1.0);

    for (bool accumulate : {false, true}) {
      CAPTURE(accumulate);
      auto dx = randn<T>(std::size_t(N) * C, 5);  // prior content: kept only when accumulating
      std::vector<float> dw(std::size_t(OC) * C), db(OC);
      const auto dw0 = randn<float>(dw.size(), 6), db0 = randn<float>(OC, 7);
      dw = dw0;
      db = db0;
      vec dxr = widen(dx), dwr = widen(dw0), dbr = widen(db0);
      matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, accumulate);
      matmul_backward(dxr.data(), dwr.data(), dbr.data(), dyd.data(), xd.data(), wd.data(), N, C, OC, accumulate);
      CHECK(rounding_ratio(widen(dx), dxr, u) <= 1.0);
      CHECK(rounding_ratio(widen(dw), dwr, 0.0) <= 1.0);  // fp32 parameter gradients
      CHECK(rounding_ratio(widen(db), dbr, 0.0) <= 1.0);
    }
  }
}

TEST_CASE_TEMPLATE("precision kernels: layernorm forward and backward in 16-bit storage", T, Eigen::bfloat16,
                   Eigen::half) {
  const double u = unit_roundoff<T>;
  // C = 4101: rows longer than the kernels' fp32 stack piece (detail::convert_chunk)
  for (const int C : {67, 4101}) {
    CAPTURE(C);
    const int N = 23;
    // rows with a non-zero mean and a spread of scales, as on the residual stream
    std::vector<T> x(std::size_t(N) * C);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        x[std::size_t(n) * C + c] = T(0.3 * n - 2 + (1 + 0.1 * n) * loom::random_normal(11, 1, std::size_t(n) * C + c));
    const auto w = randn<T>(C, 12, 0.5), b = randn<T>(C, 13, 0.1), dy = randn<T>(x.size(), 14);
    const vec xd = widen(x), wd = widen(w), bd = widen(b), dyd = widen(dy);
    std::vector<T> y(x.size());
    std::vector<float> mean(N), rstd(N);
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    vec yr(x.size()), meanr(N), rstdr(N);
    layernorm_forward(yr.data(), meanr.data(), rstdr.data(), xd.data(), wd.data(), bd.data(), N, C);
    CHECK(rounding_ratio(widen(y), yr, u) <= 1.0);
    CHECK(rounding_ratio(widen(mean), meanr, 0.0) <= 1.0);  // fp32 statistics
    CHECK(rounding_ratio(widen(rstd), rstdr, 0.0) <= 1.0);

    auto dx = randn<T>(x.size(), 15);  // the residual stream's gradient: accumulated into
    std::vector<float> dw = randn<float>(C, 16), db = randn<float>(C, 17);
    vec dxr = widen(dx), dwr = widen(dw), dbr = widen(db);
    layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    layernorm_backward(dxr.data(), dwr.data(), dbr.data(), dyd.data(), xd.data(), wd.data(), meanr.data(), rstdr.data(),
                       N, C);
    CHECK(rounding_ratio(widen(dx), dxr, u) <= 1.0);
    CHECK(rounding_ratio(widen(dw), dwr, 0.0) <= 1.0);
    CHECK(rounding_ratio(widen(db), dbr, 0.0) <= 1.0);
  }
}

TEST_CASE_TEMPLATE("precision kernels: gelu, residual and encoder in 16-bit storage", T, Eigen::bfloat16, Eigen::half) {
  const double u = unit_roundoff<T>;
  // 9001: several parallel chunks (elementwise_chunk) and a tail
  for (const std::size_t n : {std::size_t(1001), std::size_t(9001)}) {
    CAPTURE(n);
    const auto x = randn<T>(n, 21, 2.0), d = randn<T>(n, 22);
    const vec xd = widen(x), dd = widen(d);
    std::vector<T> y(n), dx(n);
    vec yr(n), dxr(n);
    gelu_forward(y.data(), x.data(), n);
    gelu_forward(yr.data(), xd.data(), n);
    CHECK(rounding_ratio(widen(y), yr, u) <= 1.0);
    gelu_backward(dx.data(), x.data(), d.data(), n);
    gelu_backward(dxr.data(), xd.data(), dd.data(), n);
    CHECK(rounding_ratio(widen(dx), dxr, u) <= 1.0);
    residual_forward(y.data(), x.data(), d.data(), n);
    residual_forward(yr.data(), xd.data(), dd.data(), n);
    CHECK(rounding_ratio(widen(y), yr, u) <= 1.0);
  }

  const int B = 3, Tn = 7, C = 19, V = 29;
  std::vector<std::int32_t> tok(std::size_t(B) * Tn);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = std::int32_t(loom::random_below(V, 5, 0, i));
  tok[3] = tok[9];  // a repeated token: its gradient rows accumulate
  const auto wte = randn<T>(std::size_t(V) * C, 23), wpe = randn<T>(std::size_t(Tn) * C, 24);
  const auto dout = randn<T>(std::size_t(B) * Tn * C, 25);
  std::vector<T> out(dout.size());
  vec outr(dout.size());
  const vec wted = widen(wte), wped = widen(wpe), doutd = widen(dout);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, Tn, C);
  encoder_forward(outr.data(), tok.data(), wted.data(), wped.data(), B, Tn, C);
  CHECK(rounding_ratio(widen(out), outr, u) <= 1.0);
  std::vector<float> dwte(wte.size()), dwpe(wpe.size());
  vec dwter(wte.size()), dwper(wpe.size());
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, Tn, C);
  encoder_backward(dwter.data(), dwper.data(), doutd.data(), tok.data(), B, Tn, C);
  CHECK(rounding_ratio(widen(dwte), dwter, 0.0) <= 1.0);
  CHECK(rounding_ratio(widen(dwpe), dwper, 0.0) <= 1.0);
}

TEST_CASE_TEMPLATE("precision kernels: fused cross-entropy in 16-bit storage (fp32 losses, dlogits rounded once)", T,
                   Eigen::bfloat16, Eigen::half) {
  const double u = unit_roundoff<T>;
  // V = 5003: rows longer than the kernel's fp32 stack piece, targets in both pieces
  for (const auto& widths : {std::array{37, 40}, std::array{5003, 5008}}) {
    const int N = 13, V = widths[0], Vp = widths[1];
    CAPTURE(V);
    auto logits = randn<T>(std::size_t(N) * Vp, 31, 3.0);
    std::vector<std::int32_t> tg(N);
    for (int i = 0; i < N; ++i) tg[i] = std::int32_t(loom::random_below(V, 6, 0, std::size_t(i)));
    tg[4] = ignore_index;
    tg[5] = V - 1;  // the last column: the last piece's tail
    logits[std::size_t(2) * Vp + std::size_t(tg[2])] = T(12 + std::log(double(V)));  // confident: p(target) near 1
    vec ld = widen(logits);
    std::vector<float> losses(N);
    vec lossesr(N);
    const float gs = 1.0f / 12;
    const float sum = crossentropy_forward_backward(logits.data(), losses.data(), tg.data(), N, V, Vp, true, gs);
    const double sumr = crossentropy_forward_backward(ld.data(), lossesr.data(), tg.data(), N, V, Vp, true, double(gs));
    CHECK(sum == doctest::Approx(sumr).epsilon(1e-5));
    CHECK(rounding_ratio(widen(losses), lossesr, 0.0) <= 1.0);
    CHECK(rounding_ratio(widen(logits), ld, u) <= 1.0);  // dlogits, incl. the target's p - 1
  }
}

TEST_CASE_TEMPLATE("precision kernels: RMSNorm, SwiGLU and rotary embedding in 16-bit storage", T, Eigen::bfloat16,
                   Eigen::half) {
  const double u = unit_roundoff<T>;
  const int N = 23, C = 67, H = 37;
  const auto x = randn<T>(std::size_t(N) * C, 51, 1.5), w = randn<T>(C, 52, 0.5), dy = randn<T>(x.size(), 53);
  const vec xd = widen(x), wd = widen(w), dyd = widen(dy);
  std::vector<T> y(x.size());
  std::vector<float> rstd(N);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  vec yr(x.size()), rstdr(N);
  rmsnorm_forward(yr.data(), rstdr.data(), xd.data(), wd.data(), N, C, 1e-5);
  CHECK(rounding_ratio(widen(y), yr, u) <= 1.0);
  CHECK(rounding_ratio(widen(rstd), rstdr, 0.0) <= 1.0);  // fp32 statistics
  auto dx = randn<T>(x.size(), 54);                       // the residual stream's gradient: +=
  std::vector<float> dw = randn<float>(C, 55);
  vec dxr = widen(dx), dwr = widen(dw);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  rmsnorm_backward(dxr.data(), dwr.data(), dyd.data(), xd.data(), wd.data(), rstdr.data(), N, C);
  CHECK(rounding_ratio(widen(dx), dxr, u) <= 1.0);
  CHECK(rounding_ratio(widen(dw), dwr, 0.0) <= 1.0);  // fp32 parameter gradient

  const auto gu = randn<T>(std::size_t(N) * 2 * H, 56, 2.0), dh = randn<T>(std::size_t(N) * H, 57);
  const vec gud = widen(gu), dhd = widen(dh);
  std::vector<T> h(std::size_t(N) * H), dgu(gu.size());
  vec hr(h.size()), dgur(gu.size());
  swiglu_forward(h.data(), gu.data(), N, H);
  swiglu_forward(hr.data(), gud.data(), N, H);
  CHECK(rounding_ratio(widen(h), hr, u) <= 1.0);
  swiglu_backward(dgu.data(), dh.data(), gu.data(), N, H);
  swiglu_backward(dgur.data(), dhd.data(), gud.data(), N, H);
  CHECK(rounding_ratio(widen(dgu), dgur, u) <= 1.0);

  const int B = 3, Tn = 7, heads = 5, hd = 12, half = hd / 2;
  const std::size_t ld = std::size_t(heads) * hd + 3;
  std::vector<float> cs(std::size_t(Tn) * half), sn(cs.size());
  vec csd(cs.size()), snd(cs.size());
  rope_table(cs.data(), sn.data(), Tn, hd, 10000.0f);
  rope_table(csd.data(), snd.data(), Tn, hd, 10000.0);
  auto q = randn<T>(std::size_t(B) * Tn * ld, 58);
  vec qd = widen(q);
  rope_forward(q.data(), cs.data(), sn.data(), B, Tn, heads, hd, ld);
  rope_forward(qd.data(), csd.data(), snd.data(), B, Tn, heads, hd, ld);
  CHECK(rounding_ratio(widen(q), qd, u) <= 1.0);
  auto g = randn<T>(q.size(), 59);  // a gradient of the rotated values, rotated back
  vec gd = widen(g);
  rope_backward(g.data(), cs.data(), sn.data(), B, Tn, heads, hd, ld);
  rope_backward(gd.data(), csd.data(), snd.data(), B, Tn, heads, hd, ld);
  CHECK(rounding_ratio(widen(g), gd, u) <= 1.0);
}

namespace {

/// One attention problem in 16-bit storage against float64 (reference and fused kernels).
template <class T>
void check_attention(int B, int Tn, int C, int NH, bool fused) {
  CAPTURE(B);
  CAPTURE(Tn);
  CAPTURE(C);
  CAPTURE(NH);
  CAPTURE(fused);
  const double u = unit_roundoff<T>;
  const std::size_t nq = std::size_t(B) * Tn * 3 * C, no = std::size_t(B) * Tn * C;
  const auto qkv = randn<T>(nq, 41, 1.5), dout = randn<T>(no, 42);
  const vec qkvd = widen(qkv), doutd = widen(dout);
  // float64 reference (attention_reference.hpp; itself checked against finite differences)
  vec outr(no), attr(std::size_t(B) * NH * Tn * Tn), dqkvr(nq), scratchr(std::size_t(threads()) * Tn * Tn);
  attention_forward(outr.data(), attr.data(), qkvd.data(), B, Tn, C, NH);
  attention_backward(dqkvr.data(), doutd.data(), qkvd.data(), attr.data(), scratchr.data(), B, Tn, C, NH);

  std::vector<T> out(no), dqkv(nq);
  if (fused) {
    std::vector<float> lse(std::size_t(B) * NH * Tn);
    // the fp32 products (one rounding: the outputs); the bf16 products, which round P and dS
    // too, are checked against their own bound in tests/unit/kernels/test_attention_bf16.cpp
    constexpr auto fp32 = attention_products::fp32;
    attention_fused_forward_16(out.data(), lse.data(), qkv.data(), B, Tn, C, NH, nullptr, {}, 0, fp32);
    CHECK(rounding_ratio(widen(out), outr, u) <= 1.0);
    attention_fused_backward_16(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, Tn, C, NH, nullptr, {},
                                0, fp32);
    // Given O, D = rowsum(dO .* O) uses the rounded O (as FlashAttention-2 does in bf16): the
    // rounding of O is an input of this backward, so the reference is the float64 fused
    // backward given the same rounded O, and the kernel adds one rounding on top of it.
    vec lsed(lse.size()), outd(no), dqkvo(nq), scratchd(attention_fused_scratch_elems(threads(), Tn));
    attention_fused_forward(outd.data(), lsed.data(), qkvd.data(), B, Tn, C, NH);
    const vec out_rounded = widen(out);
    attention_fused_backward(dqkvo.data(), doutd.data(), qkvd.data(), out_rounded.data(), lsed.data(), scratchd.data(), B,
                             Tn, C, NH);
    CHECK(rounding_ratio(widen(dqkv), dqkvo, u) <= 1.0);
    std::vector<T> dqkv2(nq);
    attention_fused_backward_16(dqkv2.data(), dout.data(), qkv.data(), static_cast<const T*>(nullptr), lse.data(), B,
                                Tn, C, NH, nullptr, {}, 0, fp32);
    CHECK(rounding_ratio(widen(dqkv2), dqkvr, u) <= 1.0);  // D recomputed in fp32: one rounding
  } else {
    std::vector<float> att(attr.size()), scratch(scratchr.size());
    attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH);
    CHECK(rounding_ratio(widen(out), outr, u) <= 1.0);
    CHECK(rounding_ratio(widen(att), attr, 0.0) <= 1.0);  // fp32 probabilities
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), scratch.data(), B, Tn, C, NH);
    CHECK(rounding_ratio(widen(dqkv), dqkvr, u) <= 1.0);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("precision kernels: attention (reference and fused) in 16-bit storage", T, Eigen::bfloat16,
                   Eigen::half) {
  for (bool fused : {false, true}) {
    check_attention<T>(2, 77, 48, 3, fused);    // HD 16: generic tiles; T not a tile multiple
    check_attention<T>(1, 130, 128, 2, fused);  // HD 64: the tuned 64x128 tiles, a partial last tile
  }
}

TEST_CASE_TEMPLATE("precision kernels: AdamW on fp32 master weights, parameters are their rounding", T,
                   Eigen::bfloat16, Eigen::half) {
  const std::size_t n = 1000;
  std::vector<float> master = randn<float>(n, 51, 0.05f), m = randn<float>(n, 52, 1e-3f), v(n), g = randn<float>(n, 53);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(1e-6 * (1 + loom::random_uniform(54, 0, i)));
  std::vector<T> p(n);
  vec masterr = widen(master), mr = widen(m), vr = widen(v), gr = widen(g);
  adamw_update_master(p.data(), master.data(), m.data(), v.data(), g.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3L);
  adamw_update(masterr.data(), mr.data(), vr.data(), gr.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5, 3L);
  CHECK(rounding_ratio(widen(master), masterr, 0.0) <= 1.0);
  CHECK(rounding_ratio(widen(m), mr, 0.0) <= 1.0);
  CHECK(rounding_ratio(widen(v), vr, 0.0) <= 1.0);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(p[i] == T(master[i]));
}
