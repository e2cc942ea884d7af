// Grouped-query attention in the fused CPU kernel against multi-head attention on keys and values
// repeated per group (what Hugging Face's repeat_kv does): the same outputs, log-sum-exps and dq,
// and each key/value head's dk, dv the sum of its group's. bf16 runs each head in an aligned fp32
// block laid out alike in both, so its outputs, log-sum-exps and dq agree bit for bit; float32
// and float64 read the keys at other addresses, and Eigen's small products sum in an order that
// depends on the operands' alignment, so those agree to rounding. A tuned head size (64) and a
// generic one (10); T not a multiple of the tiles; both backward paths (a key/value head per
// thread; heads split into tiles).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/kernels/cpu.hpp>

#include "../../support/gradcheck.hpp"
#include "../../support/scoped.hpp"

namespace {

using namespace loom::kernels::cpu;

template <class T>
void forward(T* out, float* lse16, T* lse, const T* qkv, int B, int Tn, int C, int NH, int kv_heads) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    (void)lse;
    attention_fused_forward_16(out, lse16, qkv, B, Tn, C, NH, nullptr, {}, kv_heads);
  } else {
    (void)lse16;
    attention_fused_forward(out, lse, qkv, B, Tn, C, NH, nullptr, {}, kv_heads);
  }
}

template <class T>
void backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse16, const T* lse, int B, int Tn,
              int C, int NH, int kv_heads) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    (void)lse;
    attention_fused_backward_16(dqkv, dout, qkv, out, lse16, B, Tn, C, NH, nullptr, {}, kv_heads);
  } else {
    (void)lse16;
    using A = acc_t<T>;
    std::vector<A> scratch(attention_fused_scratch_elems(std::size_t(loom_test::max_threads()), std::size_t(Tn)));
    attention_fused_backward(dqkv, dout, qkv, out, lse, scratch.data(), B, Tn, C, NH, nullptr, {}, kv_heads);
  }
}

/// Largest |a - b| over the largest |b|, element by element (T converted to double).
template <class X, class Y>
double rel_diff(const X& a, const Y& b) {
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    largest = std::max(largest, std::abs(double(b[i])));
  }
  return largest > 0 ? worst / largest : worst;
}

/// GQA with NKV key/value heads vs MHA on the repeated keys and values; `tol` bounds the
/// differences relative to the largest value (float64/float32: rounding; dk, dv: sums in another
/// order; bf16: one rounding of the sum against a sum of roundings).
template <class T>
void check_gqa(int B, int Tn, int NH, int NKV, int hd, double tol) {
  CAPTURE(B);
  CAPTURE(Tn);
  CAPTURE(NH);
  CAPTURE(NKV);
  CAPTURE(hd);
  const int C = NH * hd, G = NH / NKV, ldg = (NH + 2 * NKV) * hd, ldm = 3 * C;
  const std::size_t rows = std::size_t(B) * Tn;
  const auto raw = loom::test::random_vector(rows * ldg, 71, -1.5, 1.5);
  const auto draw = loom::test::random_vector(rows * C, 72);
  std::vector<T> qkv_g(raw.begin(), raw.end()), dout(draw.begin(), draw.end()), qkv_m(rows * ldm);
  for (std::size_t r = 0; r < rows; ++r)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < hd; ++i) {
        const std::size_t g = r * ldg, m = r * ldm + std::size_t(h) * hd + i;
        qkv_m[m] = qkv_g[g + std::size_t(h) * hd + i];
        qkv_m[m + C] = qkv_g[g + std::size_t(NH + h / G) * hd + i];
        qkv_m[m + 2 * C] = qkv_g[g + std::size_t(NH + NKV + h / G) * hd + i];
      }
  using L = std::conditional_t<std::is_same_v<T, Eigen::bfloat16>, float, T>;
  std::vector<T> out_g(rows * C), out_m(rows * C), dq_g(rows * ldg), dq_m(rows * ldm);
  std::vector<L> lse_g(std::size_t(B) * NH * Tn), lse_m(lse_g.size());
  forward<T>(out_g.data(), reinterpret_cast<float*>(lse_g.data()), reinterpret_cast<T*>(lse_g.data()), qkv_g.data(), B,
             Tn, C, NH, NKV);
  forward<T>(out_m.data(), reinterpret_cast<float*>(lse_m.data()), reinterpret_cast<T*>(lse_m.data()), qkv_m.data(), B,
             Tn, C, NH, 0);
  constexpr bool bitwise = std::is_same_v<T, Eigen::bfloat16>;
  if (bitwise) {
    CHECK(std::memcmp(out_g.data(), out_m.data(), out_g.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(lse_g.data(), lse_m.data(), lse_g.size() * sizeof(L)) == 0);
  } else {
    CHECK(rel_diff(out_g, out_m) <= tol);
    CHECK(rel_diff(lse_g, lse_m) <= tol);
  }
  backward<T>(dq_g.data(), dout.data(), qkv_g.data(), out_g.data(), reinterpret_cast<const float*>(lse_g.data()),
              reinterpret_cast<const T*>(lse_g.data()), B, Tn, C, NH, NKV);
  backward<T>(dq_m.data(), dout.data(), qkv_m.data(), out_m.data(), reinterpret_cast<const float*>(lse_m.data()),
              reinterpret_cast<const T*>(lse_m.data()), B, Tn, C, NH, 0);
  int dq_mismatches = 0;
  double worst = 0, largest = 0, dq_worst = 0, dq_largest = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    for (int c = 0; c < C; ++c) {
      dq_mismatches += std::memcmp(&dq_g[r * ldg + c], &dq_m[r * ldm + c], sizeof(T)) != 0;
      dq_worst = std::max(dq_worst, std::abs(double(dq_g[r * ldg + c]) - double(dq_m[r * ldm + c])));
      dq_largest = std::max(dq_largest, std::abs(double(dq_m[r * ldm + c])));
    }
    for (int part = 1; part <= 2; ++part)  // dk, dv: kv head k sums query heads k*G .. k*G+G-1
      for (int k = 0; k < NKV; ++k)
        for (int i = 0; i < hd; ++i) {
          double sum = 0;
          for (int h = k * G; h < (k + 1) * G; ++h) sum += double(dq_m[r * ldm + part * C + h * hd + i]);
          const double got = double(dq_g[r * ldg + std::size_t(NH + (part - 1) * NKV + k) * hd + i]);
          worst = std::max(worst, std::abs(got - sum));
          largest = std::max(largest, std::abs(sum));
        }
  }
  if (bitwise) CHECK(dq_mismatches == 0);
  CHECK(dq_worst <= tol * dq_largest);
  CHECK(largest > 0);
  CHECK(worst <= tol * largest);
}

}  // namespace

TEST_CASE_TEMPLATE("attention gqa: fused grouped-query attention equals multi-head attention on repeated keys and values",
                   T, double, float, Eigen::bfloat16) {
  const double tol = std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, float> ? 1e-5 : 3 * 0x1p-8;
  for (int hd : {64, 10}) {
    check_gqa<T>(2, 77, 6, 2, hd, tol);  // a key/value head per thread (4 items >= 2 threads)
    check_gqa<T>(1, 77, 4, 1, hd, tol);  // one key/value head for all four (multi-query)
    const loom_test::thread_scope four(4);
    check_gqa<T>(1, 45, 3, 1, hd, tol);  // fewer heads than threads: the tile-split passes
  }
}

TEST_CASE("attention gqa: key/value heads that do not divide the query heads are refused") {
  std::vector<float> qkv(2 * 3 * 6 * 4), out(2 * 3 * 4 * 4), lse(2 * 4 * 3);
  CHECK_THROWS_WITH_AS(attention_fused_forward(out.data(), lse.data(), qkv.data(), 2, 3, 16, 4, nullptr, {}, 3),
                       doctest::Contains("divides the query heads"), loom::input_error);
}
