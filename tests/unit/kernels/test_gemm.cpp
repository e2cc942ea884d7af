// loom::kernels::cpu::gemm against a float64 reference computed from the same (already rounded)
// bf16 / fp16 / fp32 inputs, for every transpose combination, sizes that are not multiples of
// the 12x32 micro-tile, K above the kernel's K block, leading dimensions larger than the rows,
// and every implementation (the AVX512-BF16 kernel when this CPU has it, the fp32 fallbacks, and
// oneDNN's sgemm and matmul primitive when loom is built with oneDNN).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <typeinfo>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/random.hpp>
#include <loom/kernels/cpu/gemm.hpp>
#include <loom/kernels/cpu/matmul.hpp>

namespace {

using loom::kernels::cpu::detail::gemm_impl;
using loom::kernels::cpu::detail::onednn_matmul_cache;
using bf16 = Eigen::bfloat16;
using f16 = Eigen::half;

// Unit roundoff of each storage format: 2^-p for p significand bits (8 bf16, 11 fp16, 24 fp32).
template <class T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, bf16>) return std::ldexp(1.0, -8);
  else if constexpr (std::is_same_v<T, f16>) return std::ldexp(1.0, -11);
  else return std::ldexp(1.0, -24);
}

// A row-major (rows, cols) matrix stored with row stride ld > cols; the padding holds NaN so a
// kernel that reads past a row's end produces NaN and fails the comparison.
template <class T>
struct strided {
  int rows, cols, ld;
  std::vector<T> data;
  strided(int r, int c, int pad, std::uint64_t seed, double lo, double hi)
      : rows(r), cols(c), ld(c + pad), data(std::size_t(r) * std::size_t(c + pad) + 1, T(std::nanf(""))) {
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j)
        at(i, j) = T(float(lo + (hi - lo) * loom::random_uniform(seed, 0, std::uint64_t(i) * 100003u + j)));
  }
  T& at(int i, int j) { return data[std::size_t(i) * ld + j]; }
  double get(int i, int j) const { return double(float(data[std::size_t(i) * ld + j])); }
};

struct shape {
  int M, N, K;
};

// Sizes around the 12x32 micro-tile and the K block, and the degenerate 1s.
const shape shapes[] = {{1, 1, 1},     {1, 7, 63},     {7, 1, 65},     {63, 65, 7},     {65, 63, 257},
                        {257, 383, 65}, {383, 257, 383}, {13, 1, 383},   {1, 383, 257},   {100, 37, 2},
                        {37, 100, 1},  {257, 65, 1031}, {24, 64, 1100}, {37, 53, 29}};

// Runs one case and checks every element against the float64 reference within the bound
//   |c - ref| <= (K + 2) 2^-24 (|alpha| sum_k |a_ik b_kj| + |beta c_ij|)           (fp32 result)
//              + u_T |ref| + denorm_min_T / 2                                        (T result)
// The first term is the classical bound for K fp32 additions of exact products (products of two
// bf16 or fp16 values are exact in fp32: 2*8 and 2*11 significand bits <= 24), two more roundings
// for alpha and beta; VDPBF16PS adds two products per instruction with one rounding each, which
// is the same count. Rounding the result to T on store adds at most u_T relative (2^-8 bf16,
// 2^-11 fp16) in the normal range, and half the subnormal spacing below it (fp16 products of
// values in [-1, 1] do fall below 2^-14 = 6.1e-5, where the spacing is 2^-24). A wrong index, transpose or edge tile gives errors of the order of |ref| itself.
// With a cache, the product runs through detail::gemm(cache, ...) (gemm_impl::onednn_matmul),
// and with_bias adds a random bias of N values (one more fp32 addition: K + 3 in the bound).
template <class T, class OutT>
void check_case(gemm_impl impl, bool ta, bool tb, shape s, float alpha, float beta, std::uint64_t seed,
                onednn_matmul_cache* cache = nullptr, bool with_bias = false) {
  const int M = s.M, N = s.N, K = s.K;
  strided<T> a(ta ? K : M, ta ? M : K, 3, seed, -1.0, 1.0);
  strided<T> b(tb ? N : K, tb ? K : N, 5, seed + 1, -1.0, 1.0);
  strided<OutT> c(M, N, 2, seed + 2, -1.0, 1.0);
  if (beta == 0.0f)  // beta == 0: C must not be read, so NaN in it must not survive
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) c.at(i, j) = OutT(std::nanf(""));
  const strided<OutT> c0 = c;
  const strided<T> bias(1, N, 0, seed + 3, -1.0, 1.0);

  if (cache)
    loom::kernels::cpu::detail::gemm<T, OutT>(*cache, ta, tb, M, N, K, alpha, a.data.data(), a.ld, b.data.data(),
                                             b.ld, beta, c.data.data(), c.ld, with_bias ? bias.data.data() : nullptr);
  else
    loom::kernels::cpu::detail::gemm<T, OutT>(impl, ta, tb, M, N, K, alpha, a.data.data(), a.ld, b.data.data(),
                                             b.ld, beta, c.data.data(), c.ld);

  const double u_out = std::is_same_v<OutT, float> ? 0.0 : unit_roundoff<T>();
  const double eta_out = std::is_same_v<OutT, float> ? 0.0 : double(float(std::numeric_limits<T>::denorm_min())) / 2;
  const double gamma = (K + 2 + with_bias) * std::ldexp(1.0, -24);
  double worst = 0;  // largest error / bound seen
  int bad = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double p = (ta ? a.get(k, i) : a.get(i, k)) * (tb ? b.get(j, k) : b.get(k, j));
        ref += p;
        mag += std::abs(p);
      }
      if (with_bias) ref += bias.get(0, j), mag += std::abs(bias.get(0, j));
      const double old = beta == 0.0f ? 0.0 : c0.get(i, j);
      ref = double(alpha) * ref + double(beta) * old;
      mag = std::abs(double(alpha)) * mag + std::abs(double(beta) * old);
      const double bound = gamma * mag + u_out * std::abs(ref) + eta_out + 1e-30;
      const double err = std::abs(c.get(i, j) - ref);
      if (!(err <= bound)) ++bad;
      worst = std::max(worst, err / bound);
    }
  // the padding of C (columns N..ldc) is untouched
  int pad_changed = 0;
  for (int i = 0; i < M; ++i)
    for (int j = N; j < c.ld; ++j)
      if (!std::isnan(c.get(i, j))) ++pad_changed;
  INFO(std::string(typeid(T).name()) << "/" << std::string(typeid(OutT).name()) << " M=" << M << " N=" << N << " K=" << K << " trans_a=" << ta << " trans_b=" << tb << " alpha=" << alpha
            << " beta=" << beta << " bias=" << with_bias << " worst err/bound=" << worst);
  CHECK(bad == 0);
  CHECK(pad_changed == 0);
}

template <class T, class OutT>
void check_all(gemm_impl impl, onednn_matmul_cache* cache = nullptr) {
  std::uint64_t seed = 11;
  for (const shape& s : shapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      // (alpha, beta) cycles through general, overwrite (C not read) and accumulate
      const float ab[3][2] = {{0.75f, -0.5f}, {1.0f, 0.0f}, {-1.25f, 1.0f}};
      const int v = int(seed % 3);
      check_case<T, OutT>(impl, ta, tb, s, ab[v][0], ab[v][1], seed++, cache);
    }
}

}  // namespace

TEST_CASE("gemm fp32_convert: bf16, fp16, fp32 operands, fp32 and T results, all transposes, odd sizes") {
  check_all<bf16, float>(gemm_impl::fp32_convert);
  check_all<bf16, bf16>(gemm_impl::fp32_convert);
  check_all<f16, float>(gemm_impl::fp32_convert);
  check_all<f16, f16>(gemm_impl::fp32_convert);
  check_all<float, float>(gemm_impl::fp32_convert);
}

TEST_CASE("gemm avx512_bf16: bf16 operands, fp32 and bf16 results, all transposes, odd sizes") {
  if (!loom::kernels::cpu::detail::cpu_has_avx512_bf16()) {
    MESSAGE("this CPU lacks AVX512-BF16: the VDPBF16PS kernel is not tested here");
    return;
  }
  check_all<bf16, float>(gemm_impl::avx512_bf16);
  check_all<bf16, bf16>(gemm_impl::avx512_bf16);
}

TEST_CASE("gemm onednn: oneDNN sgemm behind bf16, fp16, fp32 operands, all transposes, odd sizes") {
  if (!loom::kernels::cpu::detail::gemm_has_onednn) {
    std::vector<float> a(4, 1.0f), c(4);
    CHECK_THROWS_WITH_AS((loom::kernels::cpu::detail::gemm<float, float>(gemm_impl::onednn, false, false, 2, 2, 2, 1.0f,
                                                                         a.data(), 2, a.data(), 2, 0.0f, c.data(), 2)),
                         doctest::Contains("without oneDNN"), loom::input_error);
    MESSAGE("built without oneDNN (LOOM_WITH_ONEDNN): only the refusal is tested here");
    return;
  }
  check_all<bf16, float>(gemm_impl::onednn);
  check_all<bf16, bf16>(gemm_impl::onednn);
  check_all<f16, float>(gemm_impl::onednn);
  check_all<f16, f16>(gemm_impl::onednn);
  check_all<float, float>(gemm_impl::onednn);
}

TEST_CASE("gemm onednn_matmul: matmul primitive, bf16, fp16, fp32 operands, all transposes, odd sizes") {
  namespace d = loom::kernels::cpu::detail;
  if (!d::gemm_has_onednn_matmul) {
    onednn_matmul_cache cache;
    std::vector<bf16> a(4, bf16(1.0f));
    std::vector<float> c(4);
    CHECK_THROWS_WITH_AS((d::gemm<bf16, float>(cache, false, false, 2, 2, 2, 1.0f, a.data(), 2, a.data(), 2, 0.0f,
                                               c.data(), 2)),
                         doctest::Contains("without oneDNN"), loom::input_error);
    MESSAGE("built without oneDNN (LOOM_WITH_ONEDNN): only the refusal is tested here");
    return;
  }
  onednn_matmul_cache cache;  // one cache for every case: primitives of many keys side by side
  check_all<bf16, float>(gemm_impl::onednn_matmul, &cache);
  check_all<bf16, bf16>(gemm_impl::onednn_matmul, &cache);
  check_all<f16, float>(gemm_impl::onednn_matmul, &cache);
  check_all<f16, f16>(gemm_impl::onednn_matmul, &cache);
  check_all<float, float>(gemm_impl::onednn_matmul, &cache);
  // beta 0 and 1 with every transpose at the odd shape, both result types
  std::uint64_t seed = 901;
  for (int t = 0; t < 4; ++t)
    for (float beta : {0.0f, 1.0f}) {
      check_case<bf16, float>(gemm_impl::onednn_matmul, t & 1, t & 2, {37, 53, 29}, 1.0f, beta, seed++, &cache);
      check_case<bf16, bf16>(gemm_impl::onednn_matmul, t & 1, t & 2, {37, 53, 29}, 1.0f, beta, seed++, &cache);
      check_case<f16, float>(gemm_impl::onednn_matmul, t & 1, t & 2, {37, 53, 29}, 1.0f, beta, seed++, &cache);
      check_case<f16, f16>(gemm_impl::onednn_matmul, t & 1, t & 2, {37, 53, 29}, 1.0f, beta, seed++, &cache);
    }
  const d::onednn_matmul_key k{37, 53, 29, 29 + 3, 53 + 5, 53 + 2, false, false, d::onednn_dtype::bf16,
                               d::onednn_dtype::bf16, 0x3f800000u, 0u};
  MESSAGE("oneDNN matmul primitives: " << cache.size() << ", workspace " << cache.workspace_bytes()
                                       << " bytes; bf16 37x53x29 -> bf16: " << cache.impl_name(k)
                                       << "; fp16: " << cache.impl_name({37, 53, 29, 32, 58, 55, false, false,
                                                                         d::onednn_dtype::f16, d::onednn_dtype::f16,
                                                                         0x3f800000u, 0u}));
}

TEST_CASE("gemm onednn_matmul: the bias argument, every type, transpose, alpha and beta; K == 0") {
  namespace d = loom::kernels::cpu::detail;
  if (!d::gemm_has_onednn_matmul) return;  // the refusal without oneDNN is tested above
  onednn_matmul_cache cache;
  std::uint64_t seed = 1201;
  const float ab[3][2] = {{0.75f, -0.5f}, {1.0f, 0.0f}, {-1.25f, 1.0f}};
  for (const shape s : {shape{37, 53, 29}, shape{257, 383, 65}, shape{1, 7, 63}, shape{13, 1, 383}, shape{5, 9, 0}})
    for (int t = 0; t < 4; ++t)
      for (const auto& [alpha, beta] : ab) {
        check_case<bf16, float>(gemm_impl::onednn_matmul, t & 1, t & 2, s, alpha, beta, seed++, &cache, true);
        check_case<bf16, bf16>(gemm_impl::onednn_matmul, t & 1, t & 2, s, alpha, beta, seed++, &cache, true);
        check_case<f16, f16>(gemm_impl::onednn_matmul, t & 1, t & 2, s, alpha, beta, seed++, &cache, true);
        check_case<float, float>(gemm_impl::onednn_matmul, t & 1, t & 2, s, alpha, beta, seed++, &cache, true);
      }
}

TEST_CASE("matmul_forward with a primitive cache: the bias argument gives bitwise the bias-then-accumulate result") {
  // y = x W^T + b written by the primitive's bias argument must equal y prefilled with b and
  // accumulated into (beta 1): the same two fp32 terms, one rounding, for every storage type.
  namespace d = loom::kernels::cpu::detail;
  if (!d::gemm_has_onednn_matmul) return;
  onednn_matmul_cache cache;
  auto check = [&]<class T>(T) {
    if (!d::linear_uses_onednn_matmul<T>()) return;  // bf16 on VDPBF16PS here: no primitive, no bias argument
    const int N = 67, C = 45, OC = 131;
    strided<T> x(N, C, 0, 71, -1.0, 1.0), w(OC, C, 0, 72, -1.0, 1.0), b(1, OC, 0, 73, -1.0, 1.0);
    std::vector<T> y(std::size_t(N) * OC, T(std::nanf(""))), ref(std::size_t(N) * OC);
    loom::kernels::cpu::matmul_forward(y.data(), x.data.data(), w.data.data(), b.data.data(), N, C, OC, &cache);
    for (int n = 0; n < N; ++n) std::copy(b.data.begin(), b.data.begin() + OC, ref.begin() + std::ptrdiff_t(n) * OC);
    d::gemm<T, T>(cache, false, true, N, OC, C, 1.0f, x.data.data(), C, w.data.data(), C, 1.0f, ref.data(), OC);
    int differ = 0;
    for (std::size_t i = 0; i < y.size(); ++i) differ += std::memcmp(&y[i], &ref[i], sizeof(T)) != 0;
    INFO(typeid(T).name());
    CHECK(differ == 0);
  };
  check(float{});
  check(bf16{});
  check(f16{});
}

TEST_CASE("gemm onednn_matmul cache: one primitive per shape, reused; the workspace grows") {
  namespace d = loom::kernels::cpu::detail;
  if (!d::gemm_has_onednn_matmul) return;
  onednn_matmul_cache cache;
  CHECK(cache.size() == 0);
  CHECK(cache.workspace_bytes() == 0);
  auto run = [&](int M, int N, int K, float beta) {  // y (M,N) = x (M,K) W (N,K)^T, bf16 result
    strided<bf16> x(M, K, 0, 31, -1.0, 1.0), w(N, K, 0, 32, -1.0, 1.0);
    std::vector<bf16> y(std::size_t(M) * N, bf16(0.0f));
    d::gemm<bf16, bf16>(cache, false, true, M, N, K, 1.0f, x.data.data(), K, w.data.data(), K, beta, y.data(), N);
    return float(y[0]);
  };
  const float first = run(37, 53, 29, 0.0f);
  CHECK(cache.size() == 1);
  CHECK(cache.created() == 1);
  const std::size_t small = cache.workspace_bytes();
  CHECK(run(37, 53, 29, 0.0f) == first);  // same key: the same primitive, the same result
  CHECK(cache.size() == 1);
  CHECK(cache.created() == 1);
  run(37, 53, 29, 1.0f);  // beta != 0 is another primitive (sum post-op)
  CHECK(cache.size() == 2);
  run(512, 384, 384, 0.0f);  // a larger shape needs a larger scratchpad
  CHECK(cache.size() == 3);
  CHECK(cache.created() == 3);
  CHECK(cache.workspace_bytes() > small);
  const std::size_t large = cache.workspace_bytes();
  run(37, 53, 29, 0.0f);  // back to the first shape: nothing created, nothing shrunk
  CHECK(cache.created() == 3);
  CHECK(cache.workspace_bytes() == large);
  MESSAGE("workspace: " << small << " bytes after 37x53x29, " << large << " after 512x384x384");
}

TEST_CASE("gemm onednn_matmul cache: per-key timing when on, one record per key; nothing when off") {
  namespace d = loom::kernels::cpu::detail;
  onednn_matmul_cache cache;
  CHECK_FALSE(cache.timing());
  if (!d::gemm_has_onednn_matmul) {
    CHECK(cache.timings().empty());
    return;
  }
  strided<bf16> x(37, 29, 0, 41, -1.0, 1.0), w(53, 29, 0, 42, -1.0, 1.0);
  std::vector<float> xf(std::size_t(37) * 29, 0.5f), wf(std::size_t(53) * 29, 0.25f);
  std::vector<bf16> y(std::size_t(37) * 53);
  std::vector<float> yf(std::size_t(37) * 53);
  auto fwd = [&](float beta) {  // y (37,53) = x (37,29) w (53,29)^T, bf16 result
    d::gemm<bf16, bf16>(cache, false, true, 37, 53, 29, 1.0f, x.data.data(), 29, w.data.data(), 29, beta, y.data(), 53);
  };
  auto fwd32 = [&] {  // the same product on fp32 operands
    d::gemm<float, float>(cache, false, true, 37, 53, 29, 1.0f, xf.data(), 29, wf.data(), 29, 0.0f, yf.data(), 53);
  };
  fwd(0.0f);  // timing off: primitives are made and run, nothing is recorded
  fwd32();
  CHECK(cache.size() == 2);
  CHECK(cache.timings().empty());

  cache.set_timing(true);
  CHECK(cache.timing());
  for (int i = 0; i < 3; ++i) fwd(0.0f);
  for (int i = 0; i < 2; ++i) fwd(1.0f);  // beta 1: another key
  fwd32();                                // fp32 operands: another key
  d::gemm<float, float>(cache, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, yf.data(), 2);  // K == 0: no product
  const auto t = cache.timings();
  REQUIRE(t.size() == 3);
  const d::onednn_matmul_key bf16_beta0{37, 53, 29, 29, 29, 53, false, true, d::onednn_dtype::bf16, d::onednn_dtype::bf16,
                                        0x3f800000u, 0u};
  std::size_t total = 0;
  for (const auto& r : t) {
    CHECK(r.seconds > 0.0);
    CHECK(r.impl == cache.impl_name(r.key));
    CHECK_FALSE(r.impl.empty());
    CHECK(r.key.M == 37);
    total += r.calls;
    if (r.key == bf16_beta0) CHECK(r.calls == 3);
    else if (r.key.ab == d::onednn_dtype::f32) CHECK(r.calls == 1);
    else CHECK(r.calls == 2);  // bf16, beta 1
  }
  CHECK(total == 6);
  CHECK(std::count_if(t.begin(), t.end(), [&](const auto& r) { return r.key == bf16_beta0; }) == 1);

  cache.set_timing(false);  // off again: the records stay, nothing is added
  fwd(0.0f);
  const auto kept = cache.timings();
  REQUIRE(kept.size() == 3);
  for (std::size_t i = 0; i < kept.size(); ++i) CHECK(kept[i].calls == t[i].calls);
  cache.reset_timings();    // dropped; primitives kept
  CHECK(cache.timings().empty());
  CHECK(cache.size() == 3);
  for (const auto& r : t)
    MESSAGE("37x53x29 NT, " << (r.key.ab == d::onednn_dtype::f32 ? "fp32" : "bf16") << " beta " << (r.key.beta_bits ? 1 : 0)
                            << ": " << r.calls << " calls, " << r.seconds * 1e6 << " us, " << r.impl);
}

TEST_CASE("gemm onednn_matmul: only through a cache; K == 0 and alpha == 0 scale C") {
  namespace d = loom::kernels::cpu::detail;
  std::vector<float> a(4, 1.0f), c = {1, 2, 3, 4};
  CHECK_THROWS_WITH_AS((d::gemm<float, float>(gemm_impl::onednn_matmul, false, false, 2, 2, 2, 1.0f, a.data(), 2,
                                              a.data(), 2, 0.0f, c.data(), 2)),
                       doctest::Contains("onednn_matmul_cache"), loom::input_error);
  if (!d::gemm_has_onednn_matmul) return;
  onednn_matmul_cache cache;
  d::gemm<float, float>(cache, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  CHECK(c == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
  CHECK(cache.size() == 0);
  CHECK_THROWS_AS((d::gemm<float, float>(cache, false, false, 2, 2, 4, 1.0f, a.data(), 3, a.data(), 2, 0.0f,
                                         c.data(), 2)),
                  loom::input_error);
}

TEST_CASE("gemm automatic: the VDPBF16PS kernel where the CPU has it, else oneDNN or Eigen") {
  namespace d = loom::kernels::cpu::detail;
  const gemm_impl fallback = d::gemm_has_onednn ? gemm_impl::onednn : gemm_impl::fp32_convert;
  CHECK(d::gemm_default_impl<float>() == fallback);
  CHECK(d::gemm_default_impl<f16>() == fallback);
  CHECK(d::gemm_default_impl<bf16>() == (d::cpu_has_avx512_bf16() ? gemm_impl::avx512_bf16 : fallback));
  if (!d::cpu_has_avx512_bf16()) CHECK_FALSE(d::bf16_unit_faster_than_fp32());
  MESSAGE("automatic on this CPU: bf16 -> " << std::string(d::gemm_impl_name(d::gemm_default_impl<bf16>()))
                                             << "; VDPBF16PS faster than fp32 FMA: " << d::bf16_unit_faster_than_fp32());
}

TEST_CASE("gemm T result is the fp32 result rounded once (round to nearest even)") {
  // Same implementation, same inputs, beta = 0: the bf16/fp16 store must equal T(fp32 store) bit for bit.
  auto run = [](auto tag, gemm_impl impl) {
    using T = decltype(tag);
    const int M = 65, N = 70, K = 600;
    strided<T> a(M, K, 0, 5, -2.0, 2.0), b(N, K, 0, 6, -2.0, 2.0);
    std::vector<float> c32(std::size_t(M) * N);
    std::vector<T> c16(std::size_t(M) * N);
    loom::kernels::cpu::detail::gemm<T, float>(impl, false, true, M, N, K, 0.5f, a.data.data(), a.ld, b.data.data(),
                                               b.ld, 0.0f, c32.data(), N);
    loom::kernels::cpu::detail::gemm<T, T>(impl, false, true, M, N, K, 0.5f, a.data.data(), a.ld, b.data.data(), b.ld,
                                           0.0f, c16.data(), N);
    int diff = 0;
    for (std::size_t i = 0; i < c32.size(); ++i) {
      const T r(c32[i]);
      if (std::memcmp(&r, &c16[i], sizeof(T)) != 0) ++diff;
    }
    CHECK(diff == 0);
  };
  run(bf16{}, gemm_impl::fp32_convert);
  run(f16{}, gemm_impl::fp32_convert);
  if (loom::kernels::cpu::detail::cpu_has_avx512_bf16()) run(bf16{}, gemm_impl::avx512_bf16);
  if (loom::kernels::cpu::detail::gemm_has_onednn) run(bf16{}, gemm_impl::onednn), run(f16{}, gemm_impl::onednn);
}

TEST_CASE("gemm public overloads pick the implementation and agree with the fallback") {
  const int M = 50, N = 45, K = 77;
  strided<bf16> x(M, K, 0, 21, -1.0, 1.0), w(N, K, 0, 22, -1.0, 1.0);
  std::vector<float> y(std::size_t(M) * N), y_ref(y.size());
  loom::kernels::cpu::gemm(false, true, M, N, K, 1.0f, x.data.data(), K, w.data.data(), K, 0.0f, y.data(), N);
  loom::kernels::cpu::detail::gemm<bf16, float>(gemm_impl::fp32_convert, false, true, M, N, K, 1.0f, x.data.data(),
                                                K, w.data.data(), K, 0.0f, y_ref.data(), N);
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, double(std::abs(y[i] - y_ref[i])));
  // both within (K+2) 2^-24 * sum|a b| <= 79 * 2^-24 * 77 of the exact value
  CHECK(worst <= 2 * 79 * 77 * std::ldexp(1.0, -24));
  std::vector<bf16> y16(y.size());
  loom::kernels::cpu::gemm(false, true, M, N, K, 1.0f, x.data.data(), K, w.data.data(), K, 0.0f, y16.data(), N);
  CHECK(float(y16[7]) == doctest::Approx(y[7]).epsilon(1.0 / 256));
}

TEST_CASE("gemm bad input: negative sizes, short leading dimensions, impossible forced kernel") {
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 0.0f);
  using loom::kernels::cpu::gemm;
  CHECK_THROWS_AS(gemm(false, false, -1, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2), loom::input_error);
  CHECK_THROWS_AS(gemm(false, false, 2, 2, 4, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2), loom::input_error);
  CHECK_THROWS_AS(gemm(false, true, 2, 2, 4, 1.0f, a.data(), 4, b.data(), 3, 0.0f, c.data(), 2), loom::input_error);
  CHECK_THROWS_AS(gemm(false, false, 2, 5, 4, 1.0f, a.data(), 4, b.data(), 5, 0.0f, c.data(), 4), loom::input_error);
  CHECK_THROWS_WITH_AS(gemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, (float*)nullptr, 2),
                       doctest::Contains("null"), loom::input_error);
  std::vector<f16> h(64, f16(1.0f));
  CHECK_THROWS_AS((loom::kernels::cpu::detail::gemm<f16, float>(gemm_impl::avx512_bf16, false, false, 2, 2, 2, 1.0f,
                                                               h.data(), 2, h.data(), 2, 0.0f, c.data(), 2)),
                  loom::input_error);
  // K = 0: C = beta * C, A and B not read
  std::vector<float> c2 = {1, 2, 3, 4};
  gemm(false, false, 2, 2, 0, 1.0f, (const float*)nullptr, 1, (const float*)nullptr, 2, 0.5f, c2.data(), 2);
  CHECK(c2 == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
}
