// Every CPU kernel's backward against central finite differences in float64, on random
// non-zero inputs with sizes that are not multiples of any block size (16, SIMD widths).
#include <doctest/doctest.h>

#include <loom/kernels/cpu.hpp>

#include "../../support/gradcheck.hpp"

using namespace loom::kernels::cpu;
using loom::test::dot;
using loom::test::max_rel_error;
using loom::test::numeric_gradient;
using loom::test::random_vector;
using vec = std::vector<double>;

TEST_CASE("matmul backward matches central differences (N=7, C=13, OC=11)") {
  const int N = 7, C = 13, OC = 11;
  vec x = random_vector(N * C, 1), w = random_vector(OC * C, 2), b = random_vector(OC, 3), r = random_vector(N * OC, 4);
  auto f = [&] { vec y(N * OC); matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC); return dot(y, r); };
  vec dx(N * C, 0.5), dw(OC * C, 0.25), db(OC, -0.5);  // non-zero: checks += semantics
  const vec dx0 = dx, dw0 = dw, db0 = db;
  matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C, OC);
  auto nx = numeric_gradient(x, f), nw = numeric_gradient(w, f), nb = numeric_gradient(b, f);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
  for (std::size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
  CHECK(max_rel_error(dx, nx) < 1e-6);
  CHECK(max_rel_error(dw, nw) < 1e-6);
  CHECK(max_rel_error(db, nb) < 1e-6);
  // forward value against a naive triple loop
  vec y(N * OC);
  matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  double worst = 0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      worst = std::max(worst, std::abs(s - y[n * OC + o]));
    }
  CHECK(worst < 1e-12);
  // overwrite mode
  vec dxo(N * C, 123.0);
  vec dwo(OC * C, 0.0);
  matmul_backward(dxo.data(), dwo.data(), static_cast<double*>(nullptr), r.data(), x.data(), w.data(), N, C, OC, false);
  CHECK(max_rel_error(dxo, nx) < 1e-6);
}

TEST_CASE("layernorm forward normalises and backward matches central differences (N=5, C=19)") {
  const int N = 5, C = 19;
  vec x = random_vector(N * C, 11, -2, 3), w = random_vector(C, 12), b = random_vector(C, 13), r = random_vector(N * C, 14);
  vec mean(N), rstd(N);
  auto f = [&] { vec y(N * C), m(N), s(N); layernorm_forward(y.data(), m.data(), s.data(), x.data(), w.data(), b.data(), N, C); return dot(y, r); };
  vec y(N * C);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) {  // (y - b)/w must have mean 0 and variance 1/(1+eps*rstd^2)
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += (y[n * C + c] - b[c]) / w[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += std::pow((y[n * C + c] - b[c]) / w[c] - m, 2);
    v /= C;
    CHECK(std::abs(m) < 1e-12);
    CHECK(v == doctest::Approx(1.0 - 1e-5 * rstd[n] * rstd[n]).epsilon(1e-9));
  }
  vec dx(N * C, 0.3), dw(C, 0.0), db(C, 0.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  for (auto& v : dx) v -= 0.3;
  CHECK(max_rel_error(dx, numeric_gradient(x, f)) < 1e-6);
  CHECK(max_rel_error(dw, numeric_gradient(w, f)) < 1e-6);
  CHECK(max_rel_error(db, numeric_gradient(b, f)) < 1e-6);
}

TEST_CASE("gelu (tanh) forward value and backward matches central differences (n=37)") {
  const std::size_t n = 37;
  vec x = random_vector(n, 21, -4, 4), r = random_vector(n, 22);
  vec y(n);
  gelu_forward(y.data(), x.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const double ref = 0.5 * x[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
    CHECK(y[i] == doctest::Approx(ref).epsilon(1e-14));
  }
  auto f = [&] { vec z(n); gelu_forward(z.data(), x.data(), n); return dot(z, r); };
  vec dx(n, 99.0);
  gelu_backward(dx.data(), x.data(), r.data(), n);
  CHECK(max_rel_error(dx, numeric_gradient(x, f)) < 1e-6);
}

TEST_CASE("encoder backward scatters into the embedding rows (B=2, T=5, C=9)") {
  const int B = 2, T = 5, C = 9, V = 7, maxT = 6;
  std::vector<std::int32_t> tok = {3, 1, 3, 6, 0, 2, 2, 5, 3, 1};
  vec wte = random_vector(V * C, 31), wpe = random_vector(maxT * C, 32), r = random_vector(B * T * C, 33);
  auto f = [&] { vec y(B * T * C); encoder_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C); return dot(y, r); };
  vec dwte(V * C, 0.0), dwpe(maxT * C, 0.0);
  encoder_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C);
  CHECK(max_rel_error(dwte, numeric_gradient(wte, f)) < 1e-6);
  CHECK(max_rel_error(dwpe, numeric_gradient(wpe, f)) < 1e-6);
  CHECK(dwte[4 * C] == 0.0);   // token 4 never occurs
  CHECK(dwpe[5 * C] == 0.0);   // position 5 >= T
}

TEST_CASE("reference attention is causal and its backward matches central differences (B=2, T=7, C=15, NH=3)") {
  const int B = 2, T = 7, C = 15, NH = 3;
  vec qkv = random_vector(B * T * 3 * C, 41, -2, 2), r = random_vector(B * T * C, 42);
  vec att(B * NH * T * T), scratch(4 * T * T);
  auto f = [&] { vec y(B * T * C), a(B * NH * T * T); attention_forward(y.data(), a.data(), qkv.data(), B, T, C, NH); return dot(y, r); };
  vec y(B * T * C);
  attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int u = 0; u < T; ++u) {
        const double p = att[(bh * T + t) * T + u];
        if (u > t) CHECK(p == 0.0);
        s += p;
      }
      CHECK(s == doctest::Approx(1.0).epsilon(1e-12));
    }
  // output at t=0 equals v at t=0 (only one visible key)
  for (int h = 0; h < NH; ++h)
    for (int d = 0; d < C / NH; ++d) CHECK(y[h * (C / NH) + d] == doctest::Approx(qkv[2 * C + h * (C / NH) + d]).epsilon(1e-12));
  vec dqkv(B * T * 3 * C, 7.0);
  attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), scratch.data(), B, T, C, NH);
  CHECK(max_rel_error(dqkv, numeric_gradient(qkv, f)) < 1e-6);
}

TEST_CASE("fused softmax cross-entropy: loss, dlogits, ignore_index, padded columns, large logits") {
  const int N = 6, V = 11, Vp = 16;
  vec logits = random_vector(N * Vp, 51, -3, 3);
  logits[2 * Vp + 4] = 1e4;  // stable for huge logits
  logits[3 * Vp + 1] = -1e4;
  std::vector<std::int32_t> tgt = {3, 10, 4, ignore_index, 0, 7};
  const double scale = 1.0 / 5;
  auto f = [&] {
    vec l = logits, losses(N);
    return crossentropy_forward_backward(l.data(), losses.data(), tgt.data(), N, V, Vp, false, 1.0) * scale;
  };
  vec l = logits, losses(N);
  const double total = crossentropy_forward_backward(l.data(), losses.data(), tgt.data(), N, V, Vp, true, scale);
  // reference loss from the definition
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    if (tgt[n] < 0) { CHECK(losses[n] == 0.0); continue; }
    double mx = -1e300;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * Vp + v]);
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(logits[n * Vp + v] - mx);
    const double ln = mx + std::log(s) - logits[n * Vp + tgt[n]];
    CHECK(losses[n] == doctest::Approx(ln).epsilon(1e-12));
    ref += ln;
  }
  CHECK(total == doctest::Approx(ref).epsilon(1e-12));
  CHECK(losses[2] == doctest::Approx(0.0).epsilon(1e-12));
  CHECK(std::isfinite(losses[3]));
  // gradient (skip the rows with huge logits: finite differences are meaningless there)
  vec num = numeric_gradient(logits, f);
  for (int n : {0, 1, 4, 5})
    for (int v = 0; v < Vp; ++v) CHECK(l[n * Vp + v] == doctest::Approx(num[n * Vp + v]).epsilon(1e-6));
  for (int v = 0; v < Vp; ++v) CHECK(l[3 * Vp + v] == 0.0);  // ignored row
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) CHECK(l[n * Vp + v] == 0.0);  // padded columns
}

TEST_CASE("AdamW update equals the torch.optim.AdamW formula, and sum_of_squares is exact") {
  const std::size_t n = 23;
  vec p = random_vector(n, 61), g = random_vector(n, 62), m = random_vector(n, 63, 0, 0.1), v = random_vector(n, 64, 0, 0.1);
  vec p0 = p, m0 = m, v0 = v;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.7;
  const long t = 5;
  adamw_update(p.data(), m.data(), v.data(), g.data(), n, lr, b1, b2, eps, wd, gs, t);
  for (std::size_t i = 0; i < n; ++i) {
    const double gi = g[i] * gs;
    const double mi = b1 * m0[i] + (1 - b1) * gi, vi = b2 * v0[i] + (1 - b2) * gi * gi;
    const double pi = p0[i] * (1 - lr * wd) - lr * (mi / (1 - std::pow(b1, t))) / (std::sqrt(vi / (1 - std::pow(b2, t))) + eps);
    CHECK(p[i] == doctest::Approx(pi).epsilon(1e-14));
    CHECK(m[i] == doctest::Approx(mi).epsilon(1e-14));
  }
  vec big = random_vector(100003, 65);
  double s = 0;
  for (double x : big) s += x * x;
  CHECK(sum_of_squares(big.data(), big.size()) == doctest::Approx(s).epsilon(1e-12));
}
