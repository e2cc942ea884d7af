// comm::threads: every collective against values computed independently on the main thread
// (float64 references, plus the exact rank-ordered fp32 sum the backend promises), at world sizes
// 1-4 and buffer sizes that are not multiples of the rank count; split groups, async overlap,
// failure (exception, timeout, mismatched calls) without deadlock, and make_groups.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <loom/parallel/comm_threads.hpp>

namespace {

using loom::parallel::reduce_op;
namespace lp = loom::parallel;
namespace comm = loom::comm;
using bf16 = Eigen::bfloat16;
using f16 = Eigen::half;

/// n buffers of `count` random non-zero values, one per rank, deterministic in seed.
template <class T>
std::vector<std::vector<T>> random_inputs(int n, std::size_t count, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<std::int64_t> small(-1000, 1000), large(-(1ll << 40), 1ll << 40);
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n), std::vector<T>(count));
  for (auto& v : in)
    for (auto& e : v) {
      if constexpr (std::is_same_v<T, std::int32_t>) e = static_cast<T>(small(gen));
      else if constexpr (std::is_same_v<T, std::int64_t>) e = large(gen);
      else {
        double d = real(gen);
        if (std::abs(d) < 1e-3) d = 0.5;  // never zero
        e = static_cast<T>(d);
      }
    }
  return in;
}

template <class T>
double to_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
double to_double(double v) {
  return v;
}
template <>
double to_double(std::int32_t v) {
  return v;
}
template <>
double to_double(std::int64_t v) {
  return static_cast<double>(v);
}

/// Unit roundoff of T's storage.
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, bf16>) return std::ldexp(1.0, -8);
  else if constexpr (std::is_same_v<T, f16>) return std::ldexp(1.0, -11);
  else if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  else if constexpr (std::is_same_v<T, double>) return std::ldexp(1.0, -53);
  else return 0.0;
}

/// Element i of op over ranks in exact float64 (inputs are exactly representable).
template <class T>
double reference(const std::vector<std::vector<T>>& in, std::size_t i, reduce_op op) {
  double acc = to_double(in[0][i]);
  for (std::size_t j = 1; j < in.size(); ++j) {
    const double v = to_double(in[j][i]);
    if (op == reduce_op::max) acc = std::max(acc, v);
    else if (op == reduce_op::min) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == reduce_op::avg) acc /= static_cast<double>(in.size());
  return acc;
}

/// Element i as the backend promises to compute it: accumulate in accum_t<T> in rank order,
/// divide once, round once. Must match bitwise.
template <class T>
T rank_ordered(const std::vector<std::vector<T>>& in, std::size_t i, reduce_op op) {
  using A = lp::detail::accum_t<T>;
  A acc = static_cast<A>(in[0][i]);
  for (std::size_t j = 1; j < in.size(); ++j) {
    const A v = static_cast<A>(in[j][i]);
    if (op == reduce_op::max) acc = v > acc ? v : acc;
    else if (op == reduce_op::min) acc = v < acc ? v : acc;
    else if constexpr (std::is_integral_v<A>)
      acc = static_cast<A>(static_cast<std::make_unsigned_t<A>>(acc) + static_cast<std::make_unsigned_t<A>>(v));
    else acc += v;
  }
  if constexpr (!std::is_integral_v<A>)
    if (op == reduce_op::avg) acc /= static_cast<A>(in.size());
  return static_cast<T>(acc);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Runs all_reduce on n ranks and checks: identical bytes on every rank, the rank-ordered value
/// bitwise, and the float64 reference within the rounding bound.
template <class T>
void check_all_reduce(int n, std::size_t count, reduce_op op, std::uint32_t seed = 1) {
  CAPTURE(n);
  CAPTURE(count);
  CAPTURE(lp::to_string(op));
  const auto in = random_inputs<T>(n, count, seed + static_cast<std::uint32_t>(n));
  std::vector<std::vector<T>> out(static_cast<std::size_t>(n));
  comm::run_threads(n, [&](comm::threads& c) {
    auto x = in[static_cast<std::size_t>(c.rank())];
    c.all_reduce(std::span{x}, op);
    out[static_cast<std::size_t>(c.rank())] = std::move(x);
  });
  for (int r = 1; r < n; ++r) CHECK(bitwise_equal(out[static_cast<std::size_t>(r)], out[0]));
  std::size_t exact_mismatch = 0, ref_mismatch = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const T want = rank_ordered(in, i, op);
    if (std::memcmp(&want, &out[0][i], sizeof(T)) != 0) ++exact_mismatch;
    const double ref = reference(in, i, op);
    double sum_abs = 0;
    for (const auto& v : in) sum_abs += std::abs(to_double(v[i]));
    const double tol = n * unit_roundoff<lp::detail::accum_t<T>>() * sum_abs + 2 * unit_roundoff<T>() * std::abs(ref);
    if (!(std::abs(to_double(out[0][i]) - ref) <= tol)) ++ref_mismatch;
  }
  CHECK(exact_mismatch == 0);
  CHECK(ref_mismatch == 0);
}

}  // namespace

TEST_CASE("comm::threads all_reduce fp32 sum/avg/max/min matches float64 and is identical on all ranks") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000003}})
      for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min}) {
        if (count == 1000003 && (op == reduce_op::max || op == reduce_op::min) && n != 3) continue;
        check_all_reduce<float>(n, count, op);
      }
}

TEST_CASE("comm::threads all_reduce of double, bf16, fp16, int32, int64") {
  for (int n : {2, 3, 4}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      check_all_reduce<double>(n, count, reduce_op::sum);
      check_all_reduce<double>(n, count, reduce_op::avg);
      check_all_reduce<bf16>(n, count, reduce_op::sum);
      check_all_reduce<bf16>(n, count, reduce_op::avg);
      check_all_reduce<bf16>(n, count, reduce_op::max);
      check_all_reduce<f16>(n, count, reduce_op::sum);
      check_all_reduce<f16>(n, count, reduce_op::min);
      check_all_reduce<std::int32_t>(n, count, reduce_op::sum);
      check_all_reduce<std::int32_t>(n, count, reduce_op::max);
      check_all_reduce<std::int64_t>(n, count, reduce_op::sum);
      check_all_reduce<std::int64_t>(n, count, reduce_op::min);
    }
  }
  check_all_reduce<bf16>(3, 1000003, reduce_op::sum);
}

TEST_CASE("comm::threads all_reduce is bitwise reproducible from run to run") {
  const auto in = random_inputs<float>(4, 100003, 99);
  std::vector<float> first, second;
  for (auto* result : {&first, &second})
    comm::run_threads(4, [&](comm::threads& c) {
      auto x = in[static_cast<std::size_t>(c.rank())];
      c.all_reduce(std::span{x}, reduce_op::avg);
      if (c.rank() == 2) *result = x;
    });
  CHECK(bitwise_equal(first, second));
}

TEST_CASE("comm::threads reduce_scatter gives rank r the reduced chunk r, also in place") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t m : {std::size_t{0}, std::size_t{7}, std::size_t{1001}})
      for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max})
        for (bool in_place : {false, true}) {
          CAPTURE(n);
          CAPTURE(m);
          CAPTURE(in_place);
          const auto in = random_inputs<float>(n, n * m, 7);
          std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
          comm::run_threads(n, [&](comm::threads& c) {
            const auto r = static_cast<std::size_t>(c.rank());
            if (in_place) {
              auto buf = in[r];
              std::span<float> whole(buf);
              c.reduce_scatter(whole, whole.subspan(r * m, m), op);
              out[r].assign(buf.begin() + static_cast<std::ptrdiff_t>(r * m),
                            buf.begin() + static_cast<std::ptrdiff_t>((r + 1) * m));
            } else {
              std::vector<float> o(m, -7.0f);
              c.reduce_scatter(std::span<const float>(in[r]), std::span{o}, op);
              out[r] = std::move(o);
            }
          });
          std::size_t bad = 0;
          for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < m; ++i) {
              const float want = rank_ordered(in, static_cast<std::size_t>(r) * m + i, op);
              if (out[static_cast<std::size_t>(r)][i] != want) ++bad;
            }
          CHECK(bad == 0);
        }
}

TEST_CASE("comm::threads all_gather concatenates in rank order, also in place and for raw structs") {
  struct pair16 {
    std::int16_t a, b;
  };
  for (int n = 1; n <= 4; ++n)
    for (std::size_t m : {std::size_t{0}, std::size_t{5}, std::size_t{3001}}) {
      CAPTURE(n);
      CAPTURE(m);
      const auto in = random_inputs<double>(n, m, 3);
      std::vector<std::vector<double>> out(static_cast<std::size_t>(n)), out_in_place(static_cast<std::size_t>(n));
      std::vector<std::vector<pair16>> out_raw(static_cast<std::size_t>(n));
      comm::run_threads(n, [&](comm::threads& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        std::vector<double> o(n * m);
        c.all_gather(std::span<const double>(in[r]), std::span{o});
        out[r] = o;
        std::vector<double> p(n * m, 0.0);  // in place: own chunk already filled
        std::copy(in[r].begin(), in[r].end(), p.begin() + static_cast<std::ptrdiff_t>(r * m));
        c.all_gather(std::span{p}.subspan(r * m, m), std::span{p});
        out_in_place[r] = p;
        std::vector<pair16> mine(m, pair16{static_cast<std::int16_t>(r), static_cast<std::int16_t>(-1)});
        std::vector<pair16> all(n * m);
        c.all_gather(std::span{mine}, std::span{all});
        out_raw[r] = all;
      });
      std::vector<double> want;
      for (const auto& v : in) want.insert(want.end(), v.begin(), v.end());
      for (int r = 0; r < n; ++r) {
        CHECK(out[static_cast<std::size_t>(r)] == want);
        CHECK(out_in_place[static_cast<std::size_t>(r)] == want);
        bool raw_ok = true;
        for (std::size_t i = 0; i < n * m; ++i)
          raw_ok = raw_ok && out_raw[static_cast<std::size_t>(r)][i].a == static_cast<std::int16_t>(i / m) &&
                   out_raw[static_cast<std::size_t>(r)][i].b == -1;
        CHECK(raw_ok);
      }
    }
}

TEST_CASE("comm::threads broadcast copies the root's buffer to every rank") {
  for (int n = 1; n <= 4; ++n)
    for (int root = 0; root < n; ++root) {
      const auto in = random_inputs<bf16>(n, 10007, 11);
      std::vector<std::vector<bf16>> out(static_cast<std::size_t>(n));
      comm::run_threads(n, [&](comm::threads& c) {
        auto x = in[static_cast<std::size_t>(c.rank())];
        c.broadcast(std::span{x}, root);
        out[static_cast<std::size_t>(c.rank())] = x;
      });
      for (int r = 0; r < n; ++r) CHECK(bitwise_equal(out[static_cast<std::size_t>(r)], in[static_cast<std::size_t>(root)]));
    }
}

TEST_CASE("comm::threads send/recv: ring exchange, per-tag matching, in-order delivery, size checks") {
  for (int n = 1; n <= 4; ++n) {
    const auto in = random_inputs<float>(n, 1003, 5);
    std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
    std::vector<int> order_ok(static_cast<std::size_t>(n), 0);
    comm::run_threads(n, [&](comm::threads& c) {
      const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      c.send(std::span<const float>(in[static_cast<std::size_t>(r)]), next, 3);
      // two more messages: tag 1 then tag 2, received in the opposite tag order, and two
      // messages with the same tag that must arrive in send order
      std::int64_t a = 100 + r, b = 200 + r, c1 = 300 + r, c2 = 400 + r;
      c.send(std::span<const std::int64_t>(&a, 1), next, 1);
      c.send(std::span<const std::int64_t>(&b, 1), next, 2);
      c.send(std::span<const std::int64_t>(&c1, 1), next, 9);
      c.send(std::span<const std::int64_t>(&c2, 1), next, 9);
      std::vector<float> x(1003);
      c.recv(std::span{x}, prev, 3);
      got[static_cast<std::size_t>(r)] = x;
      std::int64_t ra = 0, rb = 0, rc1 = 0, rc2 = 0;
      c.recv(std::span{&rb, 1}, prev, 2);
      c.recv(std::span{&ra, 1}, prev, 1);
      c.recv(std::span{&rc1, 1}, prev, 9);
      c.recv(std::span{&rc2, 1}, prev, 9);
      order_ok[static_cast<std::size_t>(r)] = ra == 100 + prev && rb == 200 + prev && rc1 == 300 + prev && rc2 == 400 + prev;
      // a size mismatch is an input_error on the receiver
      std::vector<float> three(3, 1.0f), four(4);
      c.send(std::span<const float>(three), next, 5);
      bool threw = false;
      try {
        c.recv(std::span{four}, prev, 5);
      } catch (const loom::input_error&) {
        threw = true;
      }
      if (!threw) throw std::runtime_error("recv of the wrong size did not throw");
    });
    for (int r = 0; r < n; ++r) {
      CHECK(got[static_cast<std::size_t>(r)] == in[static_cast<std::size_t>((r + n - 1) % n)]);
      CHECK(order_ok[static_cast<std::size_t>(r)] == 1);
    }
  }
}

TEST_CASE("comm::threads split: 4 ranks into two groups by color, ordered by key, reducing independently") {
  std::vector<int> new_rank(4), new_size(4);
  std::vector<float> sums(4), world_after(4);
  std::vector<std::string> names(4);
  comm::run_threads(4, [&](comm::threads& world) {
    const int r = world.rank();
    // color = r % 2 -> {0,2} and {1,3}; key = -r reverses the order inside each group
    comm::threads g = world.split(r % 2, -r);
    new_rank[static_cast<std::size_t>(r)] = g.rank();
    new_size[static_cast<std::size_t>(r)] = g.size();
    names[static_cast<std::size_t>(r)] = g.name();
    float v = static_cast<float>(r + 1);
    g.all_reduce(std::span{&v, 1});
    sums[static_cast<std::size_t>(r)] = v;
    // the parent still works after (and between) sub-group traffic
    float w = 1.0f;
    world.all_reduce(std::span{&w, 1});
    world_after[static_cast<std::size_t>(r)] = w;
  });
  CHECK(new_size == std::vector<int>{2, 2, 2, 2});
  CHECK(new_rank == std::vector<int>{1, 1, 0, 0});  // rank 2 (key -2) precedes rank 0 (key 0)
  CHECK(sums == std::vector<float>{4, 6, 4, 6});    // 1+3 and 2+4
  CHECK(world_after == std::vector<float>{4, 4, 4, 4});
  CHECK(names[0] == "world/0");
  CHECK(names[1] == "world/1");
}

TEST_CASE("comm::threads async: overlap with work, FIFO matching, blocking call after async") {
  const std::size_t count = 1 << 20;
  for (int n : {2, 4}) {
    const auto a = random_inputs<float>(n, count, 21), b = random_inputs<float>(n, 1000, 22);
    std::vector<std::vector<float>> out_a(static_cast<std::size_t>(n)), out_b(static_cast<std::size_t>(n));
    std::vector<std::vector<float>> out_rs(static_cast<std::size_t>(n)), out_ag(static_cast<std::size_t>(n));
    std::vector<double> work(static_cast<std::size_t>(n));
    std::vector<float> after(static_cast<std::size_t>(n));
    comm::run_threads(n, [&](comm::threads& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      auto x = a[r];
      auto y = b[r];
      std::vector<float> rs(1000 / static_cast<std::size_t>(n) + 1), full(rs.size() * static_cast<std::size_t>(n));
      std::copy(y.begin(), y.begin() + static_cast<std::ptrdiff_t>(std::min(y.size(), full.size())), full.begin());
      std::vector<float> ag(rs.size() * static_cast<std::size_t>(n));
      std::vector<float> mine(rs.size(), static_cast<float>(r));
      lp::request h1 = c.all_reduce_async(std::span{x}, reduce_op::sum);
      lp::request h2 = c.all_reduce_async(std::span{y}, reduce_op::avg);
      lp::request h3 = c.reduce_scatter_async(std::span<const float>(full), std::span{rs}, reduce_op::sum);
      lp::request h4 = c.all_gather_async(std::span<const float>(mine), std::span{ag});
      CHECK(h1.pending());
      double acc = 0;  // work while the collectives run
      for (int i = 1; i < 200000; ++i) acc += 1.0 / i;
      work[r] = acc;
      h1.wait();
      while (!h2.test()) std::this_thread::yield();
      lp::request hs[] = {std::move(h3), std::move(h4)};
      lp::wait_all(hs);
      CHECK_FALSE(h1.pending());
      out_a[r] = x;
      out_b[r] = y;
      out_rs[r] = rs;
      out_ag[r] = ag;
      float v = 1.0f;
      lp::request h5 = c.all_reduce_async(std::span{x}, reduce_op::max);
      c.all_reduce(std::span{&v, 1});  // blocking call after a pending async one: runs after it
      after[r] = v;
      h5.wait();
    });
    std::size_t bad = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (out_a[0][i] != rank_ordered(a, i, reduce_op::sum)) ++bad;
    for (std::size_t i = 0; i < 1000; ++i)
      if (out_b[0][i] != rank_ordered(b, i, reduce_op::avg)) ++bad;
    CHECK(bad == 0);
    for (int r = 0; r < n; ++r) {
      CHECK(bitwise_equal(out_a[static_cast<std::size_t>(r)], out_a[0]));
      CHECK(after[static_cast<std::size_t>(r)] == static_cast<float>(n));
      for (std::size_t i = 0; i < out_ag[0].size(); ++i)
        CHECK(out_ag[static_cast<std::size_t>(r)][i] == static_cast<float>(i / out_rs[0].size()));
    }
    // reduce_scatter: rank r chunk of the sum of everyone's `full` (y prefix, zero padded)
    const std::size_t m = out_rs[0].size();
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < m; ++i) {
        const std::size_t k = static_cast<std::size_t>(r) * m + i;
        float want = 0;
        for (int j = 0; j < n; ++j) want += k < 1000 ? b[static_cast<std::size_t>(j)][k] : 0.0f;
        CHECK(out_rs[static_cast<std::size_t>(r)][i] == doctest::Approx(want).epsilon(1e-6));
      }
    CHECK(work[0] > 12.0);
  }
}

TEST_CASE("comm::threads an exception in one rank releases the others instead of deadlocking") {
  std::vector<int> aborted(4, 0);
  auto body = [&](comm::threads& c) {
    std::vector<float> x(1000, 1.0f);
    comm::threads sub = c.split(c.rank() / 2, c.rank());
    if (c.rank() == 2) throw std::runtime_error("boom on rank 2");
    try {
      if (c.rank() == 3) {
        sub.all_reduce(std::span{x});  // waits for rank 2 in the sub-group
      } else if (c.rank() == 1) {
        float y = 0;
        c.recv(std::span{&y, 1}, 2, 0);  // waits for a message rank 2 never sends
      } else {
        auto h = c.all_reduce_async(std::span{x});  // pending on the progress thread
        h.wait();
      }
    } catch (const lp::comm_aborted& e) {
      aborted[static_cast<std::size_t>(c.rank())] = std::string(e.what()).find("boom on rank 2") != std::string::npos;
      throw;
    }
  };
  CHECK_THROWS_WITH_AS(comm::run_threads(4, body), "boom on rank 2", std::runtime_error);
  CHECK(aborted == std::vector<int>{1, 1, 0, 1});
}

TEST_CASE("comm::threads a rank that never joins produces a timeout naming the missing rank") {
  lp::comm_options opts;
  opts.timeout = std::chrono::milliseconds(300);
  std::string message;
  try {
    comm::run_threads(
        3,
        [&](comm::threads& c) {
          if (c.rank() == 1) return;  // never joins
          std::vector<float> x(10, 1.0f);
          c.all_reduce(std::span{x});
        },
        opts);
  } catch (const lp::comm_timeout& e) {
    message = e.what();
  }
  CHECK(message.find("all_reduce(f32 x 10, sum)") != std::string::npos);
  CHECK(message.find("group 'world'") != std::string::npos);
  CHECK(message.find("missing ranks {1}") != std::string::npos);
  CHECK(message.find("arrived ranks {0,2}") != std::string::npos);
}

TEST_CASE("comm::threads mismatched calls and bad arguments are input errors") {
  // different counts on different ranks: every rank throws, nobody hangs
  std::atomic<int> threw{0};
  CHECK_THROWS_AS(comm::run_threads(2,
                                    [&](comm::threads& c) {
                                      std::vector<float> x(5 + static_cast<std::size_t>(c.rank()), 1.0f);
                                      try {
                                        c.all_reduce(std::span{x});
                                      } catch (const loom::input_error& e) {
                                        if (std::string(e.what()).find("rank 1 all_reduce(f32 x 6, sum)") != std::string::npos)
                                          ++threw;
                                        throw;
                                      }
                                    }),
                  loom::input_error);
  CHECK(threw == 2);
  CHECK_THROWS_AS(comm::run_threads(2,
                                    [](comm::threads& c) {
                                      std::vector<std::int32_t> x(3, 1);
                                      c.all_reduce(std::span{x}, reduce_op::avg);
                                    }),
                  loom::input_error);
  CHECK_THROWS_AS(comm::run_threads(2,
                                    [](comm::threads& c) {
                                      std::vector<float> in(5), out(2);
                                      c.reduce_scatter(std::span<const float>(in), std::span{out});
                                    }),
                  loom::input_error);
  CHECK_THROWS_AS(comm::run_threads(2,
                                    [](comm::threads& c) {
                                      float v = 0;
                                      c.broadcast(std::span{&v, 1}, 2);
                                    }),
                  loom::input_error);
  CHECK_THROWS_AS(comm::run_threads(0, [](comm::threads&) {}), loom::input_error);
}

TEST_CASE("comm::threads make_groups<layout<2,1>> on 4 ranks: tp {0,1},{2,3}; dp {0,2},{1,3}") {
  struct seen {
    int tp_rank, tp_size, dp_rank, dp_size, pp_rank, pp_size;
    float tp_sum, dp_sum;
  };
  std::vector<seen> s(4);
  comm::run_threads(4, [&](comm::threads& world) {
    auto g = lp::make_groups<lp::layout<2, 1>>(world);
    float t = static_cast<float>(world.rank()), d = t;
    g.tp.all_reduce(std::span{&t, 1});
    g.dp.all_reduce(std::span{&d, 1});
    s[static_cast<std::size_t>(world.rank())] = {g.tp.rank(), g.tp.size(), g.dp.rank(), g.dp.size(),
                                                 g.pp.rank(), g.pp.size(), t, d};
    CHECK(g.dp.name() == "world/dp");
  });
  const float tp_sums[] = {1, 1, 5, 5}, dp_sums[] = {2, 4, 2, 4};
  for (int r = 0; r < 4; ++r) {
    const auto& x = s[static_cast<std::size_t>(r)];
    CHECK(x.tp_rank == r % 2);
    CHECK(x.tp_size == 2);
    CHECK(x.dp_rank == r / 2);
    CHECK(x.dp_size == 2);
    CHECK(x.pp_rank == 0);
    CHECK(x.pp_size == 1);
    CHECK(x.tp_sum == tp_sums[r]);
    CHECK(x.dp_sum == dp_sums[r]);
  }
}

TEST_CASE("comm::threads make_groups<layout<2,2>> on 8 ranks follows Megatron order; bad world size throws") {
  std::vector<std::array<int, 3>> ranks(8);
  comm::run_threads(8, [&](comm::threads& world) {
    auto g = lp::make_groups<lp::layout<2, 2>>(world);
    // a group's members are identified by summing their world ranks
    int sums[3] = {world.rank(), world.rank(), world.rank()};
    g.tp.all_reduce(std::span{&sums[0], 1});
    g.dp.all_reduce(std::span{&sums[1], 1});
    g.pp.all_reduce(std::span{&sums[2], 1});
    CHECK(g.tp.rank() == lp::layout<2, 2>::tp_rank(world.rank()));
    CHECK(g.dp.rank() == lp::layout<2, 2>::dp_rank(world.rank(), 2));
    CHECK(g.pp.rank() == lp::layout<2, 2>::pp_rank(world.rank(), 2));
    ranks[static_cast<std::size_t>(world.rank())] = {sums[0], sums[1], sums[2]};
  });
  // tp {0,1} {2,3} {4,5} {6,7}; dp {0,2} {1,3} {4,6} {5,7}; pp {0,4} {1,5} {2,6} {3,7}
  const int tp[] = {1, 1, 5, 5, 9, 9, 13, 13}, dp[] = {2, 4, 2, 4, 10, 12, 10, 12}, pp[] = {4, 6, 8, 10, 4, 6, 8, 10};
  for (int r = 0; r < 8; ++r) {
    CHECK(ranks[static_cast<std::size_t>(r)][0] == tp[r]);
    CHECK(ranks[static_cast<std::size_t>(r)][1] == dp[r]);
    CHECK(ranks[static_cast<std::size_t>(r)][2] == pp[r]);
  }
  CHECK_THROWS_WITH_AS(comm::run_threads(3, [](comm::threads& world) { lp::make_groups<lp::layout<2, 1>>(world); }),
                       doctest::Contains("world size 3 is not a multiple of TP*PP = 2"), loom::input_error);
}

TEST_CASE("request: empty handles are complete; destroying a pending handle waits") {
  lp::request empty;
  CHECK_FALSE(empty.pending());
  CHECK(empty.test());
  empty.wait();
  std::vector<float> result(2);
  comm::run_threads(2, [&](comm::threads& c) {
    float v = 2.0f;
    {
      auto h = c.all_reduce_async(std::span{&v, 1});
    }  // destructor waits
    result[static_cast<std::size_t>(c.rank())] = v;
  });
  CHECK(result == std::vector<float>{4.0f, 4.0f});
}

namespace {
/// Logs what a comm_observer sees: (op, bytes, group_size, group, peer), begin and end paired.
struct logging_observer final : lp::comm_observer {
  struct entry {
    std::string op;
    std::size_t bytes;
    int group_size;
    std::string group;
    int peer;
    bool ended;
  };
  std::vector<entry> log;
  double begin(const lp::comm_event& e) noexcept override {
    log.push_back({e.op, e.bytes, e.group_size, std::string(e.group), e.peer, false});
    return double(log.size() - 1);
  }
  void end(const lp::comm_event& e, double token) noexcept override {
    auto& x = log[std::size_t(token)];
    x.ended = x.op == e.op && x.bytes == e.bytes;
  }
};
}  // namespace

TEST_CASE("comm::threads observer: every operation with its bytes, group and peer; split children inherit it") {
  std::vector<std::vector<logging_observer::entry>> logs(4);
  comm::run_threads(4, [&](comm::threads& world) {
    logging_observer obs;
    CHECK(world.observer() == nullptr);
    world.set_observer(&obs);
    const int r = world.rank();
    auto g = lp::make_groups<lp::layout<2, 1>>(world);  // tp {0,1},{2,3}; dp {0,2},{1,3}
    std::vector<float> x(7, 1.0f), all(14);
    std::vector<double> d(2, 1.0);
    world.barrier();
    g.tp.all_reduce(std::span<float>(x));
    g.dp.reduce_scatter(std::span<const float>(all), std::span<float>(x));
    g.tp.all_gather(std::span<const float>(x), std::span<float>(all));
    world.broadcast(std::span<float>(x.data(), 3), 2);
    if (g.tp.rank() == 0) g.tp.send(std::span<const float>(x.data(), 5), 1, 3);
    else g.tp.recv(std::span<float>(x.data(), 5), 0, 3);
    auto req = g.dp.all_reduce_async(std::span<double>(d));
    req.wait();
    comm::threads unobserved = world.split(0, r);
    unobserved.set_observer(nullptr);
    unobserved.barrier();  // not logged
    logs[std::size_t(r)] = obs.log;
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const auto& l = logs[std::size_t(r)];
    REQUIRE(l.size() == 8);
    const bool tp0 = r % 2 == 0;
    const std::vector<std::tuple<std::string, std::size_t, int, std::string, int>> want = {
        {"barrier", 0, 4, "world", -1},
        {"all_reduce", 28, 2, "world/tp", -1},
        {"reduce_scatter", 56, 2, "world/dp", -1},
        {"all_gather", 56, 2, "world/tp", -1},
        {"broadcast", 12, 4, "world", 2},
        {tp0 ? "send" : "recv", 20, 2, "world/tp", tp0 ? 1 : 0},
        {"all_reduce_async", 16, 2, "world/dp", -1},
        {"all_reduce_wait", 16, 2, "world/dp", -1}};
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(l[i].op == std::get<0>(want[i]));
      CHECK(l[i].bytes == std::get<1>(want[i]));
      CHECK(l[i].group_size == std::get<2>(want[i]));
      CHECK(l[i].group == std::get<3>(want[i]));
      CHECK(l[i].peer == std::get<4>(want[i]));
      CHECK(l[i].ended);
    }
  }
}
