// The fused attention's bf16 tile products (VDPBF16PS; Note [bf16 attention products] in
// kernels/cpu/detail/attention_bf16.hpp) against a float64 reference written from the
// definition, element by element, within the error bound the note derives:
//   |x - x_ref| <= (u (1 + u) A + u |x_ref|) (1 + 2^-10) + 2^-16 M,   u = 2^-8 (one bf16 rounding)
// where A is the sum of the absolute terms the rounded operand multiplies: out_i: sum_j P_ij F_ij
// |v_j|; dv_j: sum_i P_ij F_ij |dO_i|; dq_i: sum_j |dS_ij| |k_j|; dk_j: sum_i |dS_ij| |q_i|
// (F the dropout factors, dS = P .* (F .* dP - D) / sqrt(HD)); u (|x_ref| + u A) is the rounding
// of the stored result; the factor 1 + 2^-10 covers fp32 accumulation and exp (~HD 2^-24) in A, and
// 2^-16 M the fp32 cancellation in dS = P .* (F .* dP - D) (M: the gradient's sum with every
// term taken absolute, |dP| and |D| as sums of |products|; e.g. dq of query 0 is exactly 0 in
// float64 and ~1e-7 in fp32, for both kernels). The
// inputs are bf16 values, exact in the reference. With the forward's output, D = rowsum(dO .* O)
// uses the rounded output, so the reference's D does too. Shapes: T not a multiple of the
// tiles (77, 130), HD 64 (tuned 64x128 tiles), 16 (generic tiles) and 128, grouped-query
// attention, a key-padding mask with rows that see no key, dropout, and fewer heads than
// threads. Where the CPU has no AVX512-BF16 the bf16 cases are skipped with a message and the
// fallback is checked alone.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <loom/core/dropout.hpp>
#include <loom/core/error.hpp>
#include <loom/core/random.hpp>
#include <loom/kernels/cpu.hpp>

#include "../../support/scoped.hpp"

namespace {

using namespace loom;
using namespace loom::kernels::cpu;
using bf16 = Eigen::bfloat16;
using vec = std::vector<double>;

struct shape {
  int B, T, NH, NKV, hd;
  bool padded = false;
  double drop_p = 0;
  int C() const { return NH * hd; }
  int ld() const { return (NH + 2 * NKV) * hd; }
};

/// Values and error bounds of one call: out (B,T,C), lse (B,NH,T), dqkv (B,T,ld).
struct result {
  vec out, lse, dqkv;
  vec out_abs, dqkv_abs, dqkv_mag;  // the sums A and M of the header comment (reference only)
};

std::vector<bf16> random_bf16(std::size_t n, std::uint64_t seed, double sd) {
  std::vector<bf16> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = bf16(float(sd * random_normal(seed, 3, i)));
  return v;
}

/// float64 attention from the definition; D from `out_for_D` (B,T,C) when given, else exact.
result reference(const shape& s, const std::vector<bf16>& qkv, const std::vector<bf16>& dout,
                 const std::vector<std::uint8_t>& pad, const attention_dropout& drop, const vec* out_for_D) {
  const int T = s.T, hd = s.hd, C = s.C(), ld = s.ld(), G = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(double(hd));
  const double fkeep = double(float(drop.mask.scale));  // the kernels' fp32 factor
  auto x = [&](int b, int t, int col) { return double(qkv[(std::size_t(b) * T + t) * ld + col]); };
  auto dy = [&](int b, int t, int d) { return double(dout[(std::size_t(b) * T + t) * C + d]); };
  result r;
  r.out.assign(std::size_t(s.B) * T * C, 0);
  r.out_abs = r.out;
  r.lse.assign(std::size_t(s.B) * s.NH * T, 0);
  r.dqkv.assign(std::size_t(s.B) * T * ld, 0);
  r.dqkv_abs = r.dqkv_mag = r.dqkv;
  vec P(T), F(T), dS(T), dSm(T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int qc = h * hd, kc = (s.NH + h / G) * hd, vc = (s.NH + s.NKV + h / G) * hd;
      for (int i = 0; i < T; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          P[j] = -std::numeric_limits<double>::infinity();
          if (!pad.empty() && pad[std::size_t(b) * T + j]) continue;
          double d = 0;
          for (int c = 0; c < hd; ++c) d += x(b, i, qc + c) * x(b, j, kc + c);
          P[j] = d * scale;
          mx = std::max(mx, P[j]);
        }
        const std::size_t row = (std::size_t(b) * s.NH + h) * T + i;
        if (mx == -std::numeric_limits<double>::infinity()) {  // no visible key: all zero
          r.lse[row] = std::numeric_limits<double>::infinity();
          continue;
        }
        double l = 0;
        for (int j = 0; j <= i; ++j) l += P[j] = std::exp(P[j] - mx);
        r.lse[row] = mx + std::log(l);
        for (int j = 0; j <= i; ++j) {
          P[j] /= l;
          F[j] = drop.mask.active() ? (attention_dropout_keep(drop, s.NH, T, b, h, i, j) ? fkeep : 0.0) : 1.0;
        }
        const std::size_t o = (std::size_t(b) * T + i) * C + qc;
        for (int j = 0; j <= i; ++j)
          for (int c = 0; c < hd; ++c) {
            r.out[o + c] += P[j] * F[j] * x(b, j, vc + c);
            r.out_abs[o + c] += P[j] * F[j] * std::abs(x(b, j, vc + c));
          }
        double D = 0, Dm = 0;
        for (int c = 0; c < hd; ++c) {
          const double t = dy(b, i, qc + c) * (out_for_D ? (*out_for_D)[o + c] : r.out[o + c]);
          D += t;
          Dm += std::abs(t);
        }
        for (int j = 0; j <= i; ++j) {
          double dP = 0, dPm = 0;
          for (int c = 0; c < hd; ++c) {
            dP += dy(b, i, qc + c) * x(b, j, vc + c);
            dPm += std::abs(dy(b, i, qc + c) * x(b, j, vc + c));
          }
          dS[j] = P[j] * (F[j] * dP - D) * scale;
          dSm[j] = P[j] * (F[j] * dPm + Dm) * scale;
        }
        const std::size_t qi = (std::size_t(b) * T + i) * ld;
        for (int j = 0; j <= i; ++j) {
          const std::size_t kj = (std::size_t(b) * T + j) * ld;
          for (int c = 0; c < hd; ++c) {
            r.dqkv[qi + qc + c] += dS[j] * x(b, j, kc + c);
            r.dqkv_abs[qi + qc + c] += std::abs(dS[j] * x(b, j, kc + c));
            r.dqkv_mag[qi + qc + c] += dSm[j] * std::abs(x(b, j, kc + c));
            r.dqkv_mag[kj + kc + c] += dSm[j] * std::abs(x(b, i, qc + c));
            r.dqkv[kj + kc + c] += dS[j] * x(b, i, qc + c);
            r.dqkv_abs[kj + kc + c] += std::abs(dS[j] * x(b, i, qc + c));
            r.dqkv[kj + vc + c] += P[j] * F[j] * dy(b, i, qc + c);
            r.dqkv_abs[kj + vc + c] += P[j] * F[j] * std::abs(dy(b, i, qc + c));
          }
        }
      }
    }
  return r;
}

/// Largest |got - want| / ((u (1 + u) A + u |want|) (1 + 2^-10) + 2^-16 M + tiny) over the elements
/// (M = 0 for out): <= 1 passes.
double bound_ratio(const vec& got, const vec& want, const vec& abs_terms, const vec* mag = nullptr) {
  const double u = 0x1p-8;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    const double bound = (u * (1 + u) * abs_terms[i] + u * std::abs(want[i])) * (1 + 0x1p-10) + (mag ? 0x1p-16 * (*mag)[i] : 0) + 1e-30;
    worst = std::max(worst, std::abs(got[i] - want[i]) / bound);
  }
  return worst;
}

template <class X>
vec widen(const std::vector<X>& v) {
  return vec(v.begin(), v.end());
}

/// The kernel's forward and backward (with and without the output) with `products`.
struct run {
  std::vector<bf16> out, dqkv, dqkv_no_out;
  std::vector<float> lse;
  run(const shape& s, const std::vector<bf16>& qkv, const std::vector<bf16>& dout, const std::vector<std::uint8_t>& pad,
      const attention_dropout& drop, attention_products products)
      : out(std::size_t(s.B) * s.T * s.C(), bf16(7.0f)), dqkv(qkv.size(), bf16(7.0f)), dqkv_no_out(qkv.size(), bf16(7.0f)),
        lse(std::size_t(s.B) * s.NH * s.T, 7.0f) {
    const std::uint8_t* kp = pad.empty() ? nullptr : pad.data();
    attention_fused_forward_16(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C(), s.NH, kp, drop, s.NKV, products);
    attention_fused_backward_16(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C(), s.NH, kp,
                                drop, s.NKV, products);
    attention_fused_backward_16(dqkv_no_out.data(), dout.data(), qkv.data(), static_cast<const bf16*>(nullptr),
                                lse.data(), s.B, s.T, s.C(), s.NH, kp, drop, s.NKV, products);
  }
};

/// Checks one shape: the bf16 products within the bound (forward, both backward overloads),
/// log-sum-exps to fp32 accuracy; the fp32 fallback within the same bound and different bits.
void check(const shape& s) {
  CAPTURE(s.B);
  CAPTURE(s.T);
  CAPTURE(s.NH);
  CAPTURE(s.NKV);
  CAPTURE(s.hd);
  CAPTURE(s.padded);
  CAPTURE(s.drop_p);
  const auto qkv = random_bf16(std::size_t(s.B) * s.T * s.ld(), 11, 1.5);
  const auto dout = random_bf16(std::size_t(s.B) * s.T * s.C(), 12, 1.0);
  std::vector<std::uint8_t> pad;
  if (s.padded) {  // batch 0: keys 0, 1 and every 5th padded (queries 0, 1 see nothing); last batch: none
    pad.assign(std::size_t(s.B) * s.T, 0);
    for (int t = 0; t < s.T; ++t) pad[t] = t < 2 || t % 5 == 3;
  }
  const attention_dropout drop{make_dropout_mask(s.drop_p, 99), 0, 0};
  const result exact = reference(s, qkv, dout, pad, drop, nullptr);
  const bool dot = attention_bf16_dot_available<bf16>(s.hd), amx = attention_amx_available<bf16>(s.hd);
  if (!dot) MESSAGE("no AVX512-BF16 on this CPU (or HD % 16 != 0): only the fp32 fallback is checked");
  if (!amx) MESSAGE("no AMX-BF16 on this CPU (or HD % 32 != 0): the AMX products are not checked");
  double worst_dot = 0, worst_amx = 0, worst_fp32 = 0;
  const run fallback(s, qkv, dout, pad, drop, attention_products::fp32);
  const run automatic(s, qkv, dout, pad, drop, attention_products::automatic);
  for (const auto products : {attention_products::fp32, attention_products::bf16_dot, attention_products::amx_bf16}) {
    if ((products == attention_products::bf16_dot && !dot) || (products == attention_products::amx_bf16 && !amx))
      continue;
    CAPTURE(int(products));
    const run k(s, qkv, dout, pad, drop, products);
    const vec out = widen(k.out);
    double worst = bound_ratio(out, exact.out, exact.out_abs);
    for (std::size_t i = 0; i < k.lse.size(); ++i) {
      if (std::isinf(exact.lse[i])) {
        CHECK(k.lse[i] == std::numeric_limits<float>::infinity());
        continue;
      }
      CHECK(std::abs(double(k.lse[i]) - exact.lse[i]) <= 1e-5 * (1 + std::abs(exact.lse[i])));
    }
    // D from the rounded output: the reference takes the same rounded output
    const result given = reference(s, qkv, dout, pad, drop, &out);
    worst = std::max(worst, bound_ratio(widen(k.dqkv), given.dqkv, given.dqkv_abs, &given.dqkv_mag));
    worst = std::max(worst, bound_ratio(widen(k.dqkv_no_out), exact.dqkv, exact.dqkv_abs, &exact.dqkv_mag));
    CHECK(worst <= 1.0);
    (products == attention_products::fp32 ? worst_fp32 : products == attention_products::amx_bf16 ? worst_amx : worst_dot) =
        worst;
    if (products != attention_products::fp32)  // P rounded to bf16: not the fallback's bits
      CHECK(std::memcmp(k.out.data(), fallback.out.data(), k.out.size() * sizeof(bf16)) != 0);
    if (products == attention_products_default<bf16>(s.hd)) {  // automatic runs this machine's default
      CHECK(std::memcmp(k.dqkv.data(), automatic.dqkv.data(), k.dqkv.size() * sizeof(bf16)) == 0);
      CHECK(std::memcmp(k.out.data(), automatic.out.data(), k.out.size() * sizeof(bf16)) == 0);
    }
  }
  MESSAGE("largest error / bound: VDPBF16PS products " << worst_dot << ", AMX products " << worst_amx
                                                         << ", fp32 fallback " << worst_fp32);
}

}  // namespace

TEST_CASE("attention bf16 products: outputs and gradients within the bf16 rounding bound of float64") {
  check({2, 77, 3, 3, 64});                   // tuned 64x128 tiles; T = 77: a partial tile, odd rows
  check({1, 130, 4, 2, 64});                  // grouped-query attention; T = 130: three key tiles
  check({2, 77, 3, 3, 16, false, 0.0});       // HD 16: the generic 64x64 tiles
  check({1, 130, 2, 2, 128});                 // HD 128
  check({1, 200, 2, 2, 96});                  // HD 96: AMX in three 16-word steps; four key tiles
  check({2, 45, 2, 1, 32, false, 0.1});       // HD 32: one AMX step; one partial tile; dropout
  check({2, 77, 3, 3, 64, true, 0.0});        // key padding, rows with no visible key
  check({2, 130, 2, 1, 64, true, 0.2});       // padding, dropout and multi-query attention
  const loom_test::thread_scope four(4);
  check({1, 77, 1, 1, 64, false, 0.1});       // one head, four threads; dropout
}

TEST_CASE("attention bf16 products: asking for them where they cannot run is an input error") {
  std::vector<bf16> qkv(3 * 2 * 24), out(2 * 24);
  std::vector<float> lse(2 * 2);
  // HD 12 is not a multiple of 16
  CHECK_THROWS_AS(attention_fused_forward_16(out.data(), lse.data(), qkv.data(), 1, 2, 24, 2, nullptr, {}, 0,
                                             attention_products::bf16_dot),
                  input_error);
  std::vector<Eigen::half> qh(3 * 2 * 32), oh(2 * 32);
  CHECK_THROWS_AS(attention_fused_forward_16(oh.data(), lse.data(), qh.data(), 1, 2, 32, 2, nullptr, {}, 0,
                                             attention_products::bf16_dot),
                  input_error);
  CHECK_FALSE(attention_bf16_dot_available<Eigen::half>(64));
  CHECK_FALSE(attention_bf16_dot_available<bf16>(12));
  // AMX products need HD % 32 == 0 (and bfloat16 storage): HD 16 is refused on every CPU
  std::vector<bf16> q16(3 * 2 * 32), o16(2 * 32);
  CHECK_THROWS_AS(attention_fused_forward_16(o16.data(), lse.data(), q16.data(), 1, 2, 32, 2, nullptr, {}, 0,
                                             attention_products::amx_bf16),
                  input_error);
  CHECK_THROWS_AS(attention_fused_forward_16(oh.data(), lse.data(), qh.data(), 1, 2, 32, 2, nullptr, {}, 0,
                                             attention_products::amx_bf16),
                  input_error);
  CHECK_FALSE(attention_amx_available<Eigen::half>(64));
  CHECK_FALSE(attention_amx_available<bf16>(16));
}
