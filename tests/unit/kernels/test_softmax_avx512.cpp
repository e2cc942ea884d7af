// The fused attention's AVX-512 softmax row kernels (kernels/cpu/detail/softmax_avx512.hpp)
// against double precision: exp within 2 ulp over the range softmax uses and beyond, exact 0
// for -inf and far below the normal range, and the row reductions (shifted exp and its sum,
// maximum, dot product) at lengths that are not multiples of 16, the tail lanes masked.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/kernels/cpu/detail/attention_shape.hpp>
#include <loom/kernels/cpu/detail/softmax_avx512.hpp>

namespace d = loom::kernels::cpu::detail;

namespace {

// Units in the last place of float between x and the double y (0 when both are 0).
double ulps(float x, double y) {
  if (y == 0.0) return x == 0.0f ? 0.0 : std::numeric_limits<double>::infinity();
  const double spacing = std::ldexp(1.0, std::ilogb(float(y)) - 23);
  return std::abs(double(x) - y) / spacing;
}

std::vector<float> random_row(int n, std::uint64_t seed, double lo, double hi) {
  std::vector<float> v(std::size_t(n) + 16, std::nanf(""));  // NaN past n: must not be read or written
  for (int i = 0; i < n; ++i) v[std::size_t(i)] = float(lo + (hi - lo) * loom::random_uniform(seed, 0, std::uint64_t(i)));
  return v;
}

}  // namespace

#if LOOM_SOFTMAX_HAS_AVX512
TEST_CASE("softmax AVX-512: exp within 2 ulp of double exp on [-87, 88]; 0 for -inf and below -104") {
  if (!d::softmax_avx512_usable()) {
    MESSAGE("this CPU has no AVX-512F: the Eigen path runs instead (tested through the attention tests)");
    return;
  }
  double worst = 0;
  float worst_at = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = float(-87.0 + 175.0 * i / 200000.0);
    float row[1] = {x};
    d::exp_shift_sum_avx512(row, 1, 0.0f);
    const double u = ulps(row[0], std::exp(double(x)));
    if (u > worst) worst = u, worst_at = x;
  }
  INFO("worst " << worst << " ulp at x = " << worst_at);
  CHECK(worst <= 2.0);
  float special[4] = {-std::numeric_limits<float>::infinity(), -200.0f, -104.5f, 0.0f};
  const float sum = d::exp_shift_sum_avx512(special, 4, 0.0f);
  CHECK(special[0] == 0.0f);
  CHECK(special[1] == 0.0f);
  CHECK(special[2] == 0.0f);
  CHECK(special[3] == 1.0f);
  CHECK(sum == 1.0f);
}

TEST_CASE("softmax AVX-512: shifted exp and sum, maximum and dot over rows of 1..131 values") {
  if (!d::softmax_avx512_usable()) return;
  for (int n : {1, 7, 15, 16, 17, 33, 64, 100, 127, 128, 131}) {
    std::vector<float> row = random_row(n, 100 + std::uint64_t(n), -30.0, 5.0);
    const std::vector<float> a = random_row(n, 200 + std::uint64_t(n), -1.0, 1.0);
    const std::vector<float> b = random_row(n, 300 + std::uint64_t(n), -1.0, 1.0);
    const float mx = d::row_max_avx512(row.data(), n);
    CHECK(mx == *std::max_element(row.begin(), row.begin() + n));
    double dot = 0, mag = 0;
    for (int i = 0; i < n; ++i) dot += double(a[std::size_t(i)]) * b[std::size_t(i)], mag += std::abs(double(a[std::size_t(i)]) * b[std::size_t(i)]);
    CHECK(std::abs(d::dot_avx512(a.data(), b.data(), n) - dot) <= (n + 1) * std::ldexp(1.0, -24) * mag);

    const std::vector<float> x = row;
    const float sum = d::exp_shift_sum_avx512(row.data(), n, mx);
    double ref_sum = 0, worst = 0;
    for (int i = 0; i < n; ++i) {
      const double e = std::exp(double(x[std::size_t(i)] - mx));  // the kernel rounds x - mx to float first
      ref_sum += e;
      worst = std::max(worst, ulps(row[std::size_t(i)], e) * (e < 1e-30 ? 0.0 : 1.0));
    }
    INFO("n = " << n << ", worst " << worst << " ulp");
    CHECK(worst <= 2.0);
    CHECK(std::abs(sum - ref_sum) <= (n + 2) * std::ldexp(1.0, -23) * ref_sum);
    for (std::size_t i = std::size_t(n); i < row.size(); ++i) CHECK(std::isnan(row[i]));  // tail untouched
  }
}
#endif

TEST_CASE("softmax rows: exp_shift_sum zeroes padded keys, whichever path the CPU takes") {
  std::vector<float> row = random_row(37, 7, -3.0, 3.0);
  std::vector<std::uint8_t> pad(37, 0);
  pad[0] = pad[16] = pad[36] = 1;
  const std::vector<float> x = row;
  const float sum = d::exp_shift_sum(row.data(), 37, 3.0f, pad.data());
  double ref = 0;
  for (int i = 0; i < 37; ++i) {
    const double e = pad[std::size_t(i)] ? 0.0 : std::exp(double(x[std::size_t(i)]) - 3.0);
    ref += e;
    CHECK(std::abs(row[std::size_t(i)] - e) <= 4e-7 * e);
  }
  CHECK(row[0] == 0.0f);
  CHECK(row[16] == 0.0f);
  CHECK(row[36] == 0.0f);
  CHECK(std::abs(sum - ref) <= 1e-6 * ref);
  CHECK(d::row_max(x.data(), 37) == *std::max_element(x.begin(), x.begin() + 37));
}
