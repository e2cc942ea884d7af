#pragma once
// Test support: random fixtures and central finite differences in float64.
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace loom::test {

/// n values uniform in [lo, hi), never exactly zero, from a fixed seed.
inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) {
    do x = u(rng); while (x == 0.0);
  }
  return v;
}

/// Largest |a-b| / max(|a|, |b|, 1e-3 * max|b|, 1e-12) over two equally long sequences:
/// elementwise relative error, with elements much smaller than the largest one judged
/// relative to a thousandth of it (so values that cross zero do not blow the ratio up).
template <class A, class B>
double max_rel_error(const A& a, const B& b) {
  double scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  const double floor = std::max(1e-3 * scale, 1e-12);
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    const double d = std::abs(x - y) / std::max({std::abs(x), std::abs(y), floor});
    worst = std::max(worst, d);
  }
  return worst;
}

/// Central differences of a scalar function f with respect to every element of x
/// (x is perturbed in place and restored). Step h; error O(h^2).
inline std::vector<double> numeric_gradient(std::vector<double>& x, const std::function<double()>& f, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    x[i] = old + h;
    const double fp = f();
    x[i] = old - h;
    const double fm = f();
    x[i] = old;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

/// sum_i out[i] * r[i]: the scalar whose gradient with respect to out is r.
inline double dot(const std::vector<double>& out, const std::vector<double>& r) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
  return s;
}

}  // namespace loom::test
