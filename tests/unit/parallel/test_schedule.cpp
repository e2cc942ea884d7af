// The 1F1B schedule as a pure function: per-stage rules checked against the list itself, and the
// whole pipeline executed by the simulator (no deadlock, every dependency met, bounded memory,
// bubble = (p-1)/(m+p-1)) for every (stages, micro-batches) pair up to 8 x 24.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/parallel/schedule.hpp>

namespace {

namespace lp = loom::parallel;
using lp::pipe_op;

// Compile-time: the schedule is data you can static_assert (STYLE §3.10).
static_assert([] {
  const auto s = lp::compute_actions(lp::one_f_one_b(4, 8, 3));
  return s[0] == lp::pipe_action{pipe_op::forward, 0} && s[1] == lp::pipe_action{pipe_op::backward, 0};
}());  // last stage alternates at once
static_assert([] {
  const auto s = lp::compute_actions(lp::one_f_one_b(4, 8, 0));
  return s[2].op == pipe_op::forward && s[3] == lp::pipe_action{pipe_op::forward, 3} &&
         s[4] == lp::pipe_action{pipe_op::backward, 0};
}());  // first stage: 3 warm-up forwards, then the 4th forward, then B0
static_assert(lp::warmup_depth(4, 8, 0) == 3 && lp::warmup_depth(4, 2, 0) == 2 && lp::max_in_flight(4, 2, 0) == 2);
static_assert(lp::pipeline_fills<2, 2>() && lp::pipeline_fills<1, 1>() && lp::pipeline_fills<4, 16>());

/// Forward/backward order of the compute actions, as "F0 F1 B0 ...".
std::string compute_string(int p, int m, int s) {
  std::string out;
  for (const auto& a : lp::compute_actions(lp::one_f_one_b(p, m, s))) {
    if (!out.empty()) out += ' ';  // piece by piece: "" + string&& trips GCC 12's -Wrestrict
    out += a.op == pipe_op::forward ? 'F' : 'B';
    out += std::to_string(a.micro);
  }
  return out;
}

}  // namespace

TEST_CASE("one_f_one_b: the worked example of the file comment, 4 stages x 6 micro-batches") {
  CHECK(compute_string(4, 6, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(compute_string(4, 6, 1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  CHECK(compute_string(4, 6, 2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(compute_string(4, 6, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  CHECK(compute_string(1, 3, 0) == "F0 B0 F1 B1 F2 B2");  // no pipeline: gradient accumulation
  CHECK(compute_string(4, 2, 0) == "F0 F1 B0 B1");        // m < p: warm-up cut to m
  CHECK(compute_string(4, 2, 2) == "F0 F1 B0 B1");
}

TEST_CASE("one_f_one_b: transfers sit around the compute actions, none at the pipeline ends") {
  using A = lp::pipe_action;
  const auto mid = lp::one_f_one_b(3, 2, 1, lp::p2p_order::plain);  // warm-up 1
  const std::vector<A> expect{{pipe_op::recv_forward, 0},  {pipe_op::forward, 0},       {pipe_op::send_forward, 0},
                              {pipe_op::recv_forward, 1},  {pipe_op::forward, 1},       {pipe_op::send_forward, 1},
                              {pipe_op::recv_backward, 0}, {pipe_op::backward, 0},      {pipe_op::send_backward, 0},
                              {pipe_op::recv_backward, 1}, {pipe_op::backward, 1},      {pipe_op::send_backward, 1}};
  CHECK(mid == expect);
  // rendezvous-safe: odd stage 1 receives the gradient from stage 2 before sending it the activation
  auto safe = expect;
  std::swap(safe[5], safe[6]);  // send_forward 1 <-> recv_backward 0 (same link, 1 <-> 2)
  CHECK(lp::one_f_one_b(3, 2, 1) == safe);
  CHECK(lp::one_f_one_b(3, 2, 0) == lp::one_f_one_b(3, 2, 0, lp::p2p_order::plain));  // even stages unchanged
  for (const auto& a : lp::one_f_one_b(3, 5, 0))
    CHECK((a.op != pipe_op::recv_forward && a.op != pipe_op::send_backward));
  for (const auto& a : lp::one_f_one_b(3, 5, 2))
    CHECK((a.op != pipe_op::send_forward && a.op != pipe_op::recv_backward));
  CHECK(lp::one_f_one_b(1, 4, 0).size() == 8u);
}

TEST_CASE("one_f_one_b: per-stage rules for every (stages <= 8, micro-batches <= 24) pair") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 24; ++m)
      for (int s = 0; s < p; ++s) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(s);
        const auto list = lp::one_f_one_b(p, m, s);
        const auto comp = lp::compute_actions(list);
        REQUIRE(comp.size() == std::size_t(2 * m));
        const int w = std::min(p - s - 1, m);
        CHECK(lp::warmup_depth(p, m, s) == w);
        // warm-up: exactly w forwards (0..w-1) before the first backward
        int lead = 0;
        while (lead < int(comp.size()) && comp[std::size_t(lead)].op == pipe_op::forward) ++lead;
        CHECK(lead == std::min(w + 1, m));  // w warm-up forwards, then the first steady forward (if any)
        // forwards and backwards each run 0..m-1 in order, each forward before its backward
        std::vector<int> fpos(std::size_t(m), -1), bpos(std::size_t(m), -1);
        int nf = 0, nb = 0, live = 0, peak = 0;
        for (int i = 0; i < int(comp.size()); ++i) {
          const auto& a = comp[std::size_t(i)];
          if (a.op == pipe_op::forward) {
            CHECK(a.micro == nf++);
            fpos[std::size_t(a.micro)] = i;
            peak = std::max(peak, ++live);
          } else {
            CHECK(a.micro == nb++);
            bpos[std::size_t(a.micro)] = i;
            --live;
          }
        }
        for (int i = 0; i < m; ++i) CHECK(fpos[std::size_t(i)] < bpos[std::size_t(i)]);
        CHECK(peak == std::min(w + 1, m));
        CHECK(peak == lp::max_in_flight(p, m, s));
        CHECK(peak <= p - s);  // the first stage holds the most: p micro-batches
        // steady state strictly alternates forward, backward
        for (int i = w; i + 1 < 2 * m - w; i += 2) {
          CHECK(comp[std::size_t(i)].op == pipe_op::forward);
          CHECK(comp[std::size_t(i + 1)].op == pipe_op::backward);
        }
        // transfers: one per existing neighbour per micro-batch and direction
        const auto count = [&](pipe_op op) {
          return std::count_if(list.begin(), list.end(), [op](const lp::pipe_action& a) { return a.op == op; });
        };
        CHECK(count(pipe_op::recv_forward) == (s > 0 ? m : 0));
        CHECK(count(pipe_op::send_backward) == (s > 0 ? m : 0));
        CHECK(count(pipe_op::send_forward) == (s < p - 1 ? m : 0));
        CHECK(count(pipe_op::recv_backward) == (s < p - 1 ? m : 0));
      }
}

TEST_CASE("one_f_one_b: the whole pipeline runs without deadlock, dependencies met, for every (p <= 8, m <= 24)") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 24; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const auto tr = lp::simulate_one_f_one_b(p, m, 1.0, 2.0);
      INFO(tr.problem);
      REQUIRE(tr.ok);
      for (int s = 0; s < p; ++s) CHECK(tr.peak_in_flight[std::size_t(s)] == lp::max_in_flight(p, m, s));
      // Every stage does m*(tf+tb) of work; the pipeline takes (m+p-1)(tf+tb) (fill + drain).
      CHECK(tr.makespan == doctest::Approx(3.0 * (m + p - 1)));
      for (int s = 0; s < p; ++s)
        CHECK(tr.idle_fraction[std::size_t(s)] == doctest::Approx(lp::bubble_fraction(p, m)).epsilon(1e-12));
    }
}

TEST_CASE("one_f_one_b: rendezvous sends deadlock the plain order, not the rendezvous-safe one") {
  int plain_deadlocks = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 24; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const auto safe = lp::simulate_one_f_one_b(p, m, 1.0, 2.0, lp::p2p_order::rendezvous_safe,
                                                 lp::send_semantics::rendezvous);
      INFO(safe.problem);
      REQUIRE(safe.ok);
      CHECK(safe.makespan >= 3.0 * (m + p - 1) - 1e-9);  // waiting sends can only add idle time
      const auto eager_plain = lp::simulate_one_f_one_b(p, m, 1.0, 2.0, lp::p2p_order::plain);
      CHECK(eager_plain.ok);
      const auto plain = lp::simulate_one_f_one_b(p, m, 1.0, 2.0, lp::p2p_order::plain, lp::send_semantics::rendezvous);
      if (!plain.ok) {
        ++plain_deadlocks;
        CHECK(plain.problem.find("deadlock") != std::string::npos);
      }
    }
  // the plain order deadlocks once a steady state exists (p >= 2 and m >= p)
  CHECK_FALSE(lp::simulate_one_f_one_b(2, 2, 1.0, 2.0, lp::p2p_order::plain, lp::send_semantics::rendezvous).ok);
  CHECK(plain_deadlocks > 100);
}

TEST_CASE("bubble_fraction: (p-1)/(m+p-1), also measured by the simulator with equal forward and backward") {
  CHECK(lp::bubble_fraction(1, 7) == 0.0);
  CHECK(lp::bubble_fraction(4, 4) == doctest::Approx(3.0 / 7.0));
  CHECK(lp::bubble_fraction(4, 16) == doctest::Approx(3.0 / 19.0));
  CHECK(lp::bubble_fraction(2, 1) == doctest::Approx(0.5));
  const auto tr = lp::simulate_one_f_one_b(4, 12, 1.0, 1.0);
  REQUIRE(tr.ok);
  CHECK(tr.makespan == doctest::Approx(2.0 * 15));
  CHECK(tr.idle_fraction[0] == doctest::Approx(3.0 / 15.0));
}

TEST_CASE("simulate_schedule: catches broken schedules (so the deadlock proof above can fail)") {
  using A = lp::pipe_action;
  // Every stage waits for its gradient before sending its activation: a cycle.
  auto deadlocking = [](int p, int m, int s) {
    std::vector<A> out;
    for (int i = 0; i < m; ++i) {
      if (s > 0) out.push_back({pipe_op::recv_forward, i});
      out.push_back({pipe_op::forward, i});
      if (s < p - 1) out.push_back({pipe_op::recv_backward, i});
      if (s < p - 1) out.push_back({pipe_op::send_forward, i});
      out.push_back({pipe_op::backward, i});
      if (s > 0) out.push_back({pipe_op::send_backward, i});
    }
    return out;
  };
  auto tr = lp::simulate_schedule(3, 2, 1.0, 2.0, deadlocking);
  CHECK_FALSE(tr.ok);
  CHECK(tr.problem.find("deadlock") != std::string::npos);
  // Backward before forward on one stage.
  auto swapped = [](int p, int m, int s) {
    auto l = lp::one_f_one_b(p, m, s);
    if (s == p - 1) std::swap(l[1], l[2]);  // recv_forward 0, backward 0, forward 0 ...
    return l;
  };
  tr = lp::simulate_schedule(2, 2, 1.0, 1.0, swapped);
  CHECK_FALSE(tr.ok);
  CHECK(tr.problem.find("backward before its forward") != std::string::npos);
  // Micro-batches received out of order.
  auto reordered = [](int p, int m, int s) {
    auto l = lp::one_f_one_b(p, m, s);
    if (s == 1)
      for (auto& a : l)
        if (a.op == pipe_op::recv_forward || a.op == pipe_op::forward) a.micro = a.micro == 0 ? 1 : a.micro == 1 ? 0 : a.micro;
    return l;
  };
  tr = lp::simulate_schedule(2, 3, 1.0, 1.0, reordered);
  CHECK_FALSE(tr.ok);
  CHECK(tr.problem.find("message is for micro-batch") != std::string::npos);
}

TEST_CASE("one_f_one_b: bad arguments are input errors") {
  CHECK_THROWS_AS(lp::one_f_one_b(0, 4, 0), loom::input_error);
  CHECK_THROWS_AS(lp::one_f_one_b(2, 0, 0), loom::input_error);
  CHECK_THROWS_AS(lp::one_f_one_b(2, 4, 2), loom::input_error);
  CHECK_THROWS_AS(lp::bubble_fraction(2, 0), loom::input_error);
}
