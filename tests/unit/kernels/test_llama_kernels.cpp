// The Llama family's CPU kernels (RMSNorm, SwiGLU, rotary embedding): backward against central
// finite differences in float64 and forward against the defining formulas, on random non-zero
// inputs of odd sizes.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/kernels/cpu/rmsnorm.hpp>
#include <loom/kernels/cpu/rope.hpp>
#include <loom/kernels/cpu/swiglu.hpp>

#include "../../support/gradcheck.hpp"

using namespace loom::kernels::cpu;
using loom::test::dot;
using loom::test::max_rel_error;
using loom::test::numeric_gradient;
using loom::test::random_vector;
using vec = std::vector<double>;

TEST_CASE("rmsnorm forward equals x / rms(x) * w, backward matches central differences (N=5, C=19)") {
  const int N = 5, C = 19;
  const double eps = 1e-6;
  vec x = random_vector(N * C, 21, -2, 3), w = random_vector(C, 22), r = random_vector(N * C, 23);
  auto f = [&] { vec y(N * C), s(N); rmsnorm_forward(y.data(), s.data(), x.data(), w.data(), N, C, eps); return dot(y, r); };
  vec y(N * C), rstd(N);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  double worst = 0;
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    const double s = 1 / std::sqrt(ms / C + eps);
    worst = std::max(worst, std::abs(s - rstd[n]) / s);
    for (int c = 0; c < C; ++c) worst = std::max(worst, std::abs(x[n * C + c] * s * w[c] - y[n * C + c]));
  }
  CHECK(worst < 1e-13);
  vec dx(N * C, 0.5), dw(C, -0.25);  // non-zero: checks += semantics
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  const vec nx = numeric_gradient(x, f), nw = numeric_gradient(w, f);
  for (auto& v : dx) v -= 0.5;
  for (auto& v : dw) v += 0.25;
  CHECK(max_rel_error(dx, nx) < 1e-6);
  CHECK(max_rel_error(dw, nw) < 1e-6);
}

TEST_CASE("swiglu forward equals silu(gate) * up, backward matches central differences (N=7, H=11)") {
  const int N = 7, H = 11;
  vec in = random_vector(N * 2 * H, 31, -4, 4), r = random_vector(N * H, 32);
  auto f = [&] { vec y(N * H); swiglu_forward(y.data(), in.data(), N, H); return dot(y, r); };
  vec y(N * H);
  swiglu_forward(y.data(), in.data(), N, H);
  double worst = 0;
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const double g = in[n * 2 * H + h], u = in[n * 2 * H + H + h];
      worst = std::max(worst, std::abs(g / (1 + std::exp(-g)) * u - y[n * H + h]));
    }
  CHECK(worst < 1e-14);
  vec din(N * 2 * H, 123.0);  // overwritten
  swiglu_backward(din.data(), r.data(), in.data(), N, H);
  CHECK(max_rel_error(din, numeric_gradient(in, f)) < 1e-6);
}

TEST_CASE("rope: Hugging Face's rotate-half on q and k of a fused row, transpose as backward (B=2, T=5, hd=10)") {
  const int B = 2, Tn = 5, heads = 3, hd = 10, half = hd / 2;
  const std::size_t ld = std::size_t(heads) * hd + 7;  // a wider row: columns past the heads untouched
  const double theta = 10000;
  vec cs(std::size_t(Tn) * half), sn(cs.size());
  rope_table(cs.data(), sn.data(), Tn, hd, theta);
  for (int t = 0; t < Tn; ++t)
    for (int i = 0; i < half; ++i) {
      const double a = t * std::pow(theta, -2.0 * i / hd);
      CHECK(cs[t * half + i] == doctest::Approx(std::cos(a)).epsilon(1e-14));
      CHECK(sn[t * half + i] == doctest::Approx(std::sin(a)).epsilon(1e-14));
    }
  vec x = random_vector(B * Tn * ld, 41), r = random_vector(x.size(), 42);
  const vec x0 = x;
  vec y = x;
  rope_forward(y.data(), cs.data(), sn.data(), B, Tn, heads, hd, ld);
  double worst = 0;
  for (int row = 0; row < B * Tn; ++row) {
    const int t = row % Tn;
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < hd; ++j) {  // q * cos + rotate_half(q) * sin, rotate_half(q) = (-q2, q1)
        const double* q = &x0[row * ld + h * hd];
        const int i = j % half;
        const double rot = j < half ? -q[j + half] : q[j - half];
        const double a = t * std::pow(theta, -2.0 * i / hd);
        worst = std::max(worst, std::abs(q[j] * std::cos(a) + rot * std::sin(a) - y[row * ld + h * hd + j]));
      }
    for (std::size_t c = std::size_t(heads) * hd; c < ld; ++c) CHECK(y[row * ld + c] == x0[row * ld + c]);
  }
  CHECK(worst < 1e-14);
  auto f = [&] { vec z = x; rope_forward(z.data(), cs.data(), sn.data(), B, Tn, heads, hd, ld); return dot(z, r); };
  vec g = r;
  rope_backward(g.data(), cs.data(), sn.data(), B, Tn, heads, hd, ld);
  const vec ng = numeric_gradient(x, f);
  CHECK(max_rel_error(g, ng) < 1e-6);
  CHECK_THROWS_AS(rope_table(cs.data(), sn.data(), Tn, 9, theta), loom::input_error);
  CHECK_THROWS_AS(rope_table(cs.data(), sn.data(), Tn, hd, 1.0), loom::input_error);
}
