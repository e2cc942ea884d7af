#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include <loom/core/memory.hpp>
#include <loom/device/cpu.hpp>

using loom::memory_counter;
using loom::memory_kind;

TEST_CASE("memory_counter: current and high-water mark follow a hand-computed sequence") {
  memory_counter c;
  c.add(memory_kind::parameters, 1000);
  c.add(memory_kind::activations, 3333);
  CHECK(c.current() == 4333);
  c.remove(memory_kind::parameters, 1000);  // 3333
  c.add(memory_kind::activations, 7777);    // 11110 <- the peak
  c.add(memory_kind::gradients, 5);         // 11115 <- new peak
  c.remove(memory_kind::activations, 7777); // 3338
  c.add(memory_kind::optimizer, 8000);      // 11338 <- new peak
  c.remove(memory_kind::optimizer, 8000);   // 3338
  CHECK(c.current() == 3338);
  CHECK(c.peak() == 11338);
  CHECK(c.current(memory_kind::activations) == 3333);
  CHECK(c.peak(memory_kind::activations) == 11110);
  CHECK(c.peak(memory_kind::parameters) == 1000);
  CHECK(c.current(memory_kind::parameters) == 0);
  CHECK(c.peak(memory_kind::optimizer) == 8000);
  CHECK(c.live_allocations() == 2);
  const auto s = c.snapshot();
  CHECK(s[memory_kind::gradients] == 5);
  CHECK(s.total_peak == 11338);

  c.reset_peak();
  CHECK(c.peak() == 3338);
  CHECK(c.peak(memory_kind::optimizer) == 0);
  CHECK(c.peak(memory_kind::activations) == 3333);
}

TEST_CASE("memory_counter: concurrent add/remove keeps exact totals and a plausible peak") {
  memory_counter c;
  constexpr int iters = 20000;
  auto work = [&](std::size_t bytes) {
    for (int i = 0; i < iters; ++i) {
      c.add(memory_kind::workspace, bytes);
      c.remove(memory_kind::workspace, bytes);
    }
  };
  std::thread a(work, 123), b(work, 4567);
  a.join();
  b.join();
  CHECK(c.current() == 0);
  CHECK(c.live_allocations() == 0);
  CHECK(c.peak() >= 4567);        // each thread alone reached its size
  CHECK(c.peak() <= 123 + 4567);  // never more than both at once
}

TEST_CASE("tracked_buffer: bytes counted for exactly its lifetime, moves do not double count") {
  memory_counter c;
  {
    loom::tracked_buffer<loom::device::cpu, float> params(1001, c, memory_kind::parameters);
    loom::tracked_buffer<loom::device::cpu, double> acts(37, c, memory_kind::activations);
    CHECK(c.current() == 1001 * 4 + 37 * 8);
    CHECK(c.current(memory_kind::parameters) == 4004);
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(params[i] == 0.0f);  // zero-filled
    {
      loom::tracked_buffer<loom::device::cpu, std::int32_t> tmp(2500, c, memory_kind::activations);
      CHECK(c.peak() == 4004 + 296 + 10000);
    }
    CHECK(c.current() == 4004 + 296);
    auto moved = std::move(params);
    CHECK(c.current() == 4004 + 296);
    CHECK(moved.size() == 1001);
    CHECK(params.size() == 0);
    loom::view<loom::device::cpu, const float> v = moved;
    CHECK(v.size() == 1001);
  }
  CHECK(c.current() == 0);
  CHECK(c.peak() == 14300);
  CHECK(c.peak(memory_kind::activations) == 10296);
  CHECK(c.live_allocations() == 0);
}

TEST_CASE("tracked_allocator: counts through the device policy") {
  memory_counter c;
  loom::tracked_allocator<loom::device::cpu> alloc(c, memory_kind::workspace);
  void* p = alloc.allocate(777);
  CHECK(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % loom::device::cpu::alignment == 0);
  CHECK(c.current(memory_kind::workspace) == 777);
  alloc.deallocate(p, 777);
  CHECK(c.current() == 0);
  CHECK(c.peak() == 777);
}

TEST_CASE("process memory: VmHWM and VmRSS grow by what the tracked counter says") {
  const auto before = loom::read_process_memory();
  REQUIRE(before.available);
  CHECK(before.rss > 0);
  CHECK(before.peak_rss >= before.rss);

  memory_counter c;
  constexpr std::size_t n = std::size_t{160} << 20;  // 160 MiB, zero-filled => every page touched
  loom::tracked_buffer<loom::device::cpu, unsigned char> big(n, c, memory_kind::activations);
  for (std::size_t i = 0; i < n; i += 4096) big[i] = static_cast<unsigned char>(1 + (i >> 12) % 251);
  const auto during = loom::read_process_memory();
  unsigned sum = 0;  // read back so that nothing above can be optimised away
  for (std::size_t i = 0; i < n; i += 1 << 20) sum += big[i];
  CHECK(sum > 0);

  CHECK(c.peak() == n);
  const double grew = double(during.rss) - double(before.rss);
  MESSAGE("tracked " << c.peak() / 1048576.0 << " MiB; VmRSS grew " << grew / 1048576.0
                     << " MiB; VmHWM " << before.peak_rss / 1048576.0 << " -> "
                     << during.peak_rss / 1048576.0 << " MiB");
  // The OS also counts page tables and allocator metadata: allow 3 % + 4 MiB either way.
  const double tol = 0.03 * double(n) + 4.0 * 1048576.0;
  CHECK(grew == doctest::Approx(double(n)).epsilon(tol / double(n)));
  CHECK(double(during.peak_rss) >= double(before.rss) + double(n) - tol);
  CHECK(during.peak_rss >= during.rss);
}
