#pragma once
/// \file train::measure_link: the latency and bus bandwidth of a communicator's all-reduce,
/// measured on it (a short probe, as nccl-tests / hccl_test measure busbw), for the step
/// estimate of train/step_estimate.hpp.
///
///   const train::link l = train::measure_link(world);  // collective; the same on every rank
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include <loom/train/step_estimate.hpp>

namespace loom::train {

/// Measures `comm`'s fp32 all-reduce (collective over it): the latency of one ring step from a
/// 64-byte all-reduce (its time / (2 (p - 1))), the bus bandwidth from one of `bytes`
/// (algorithm bandwidth bytes / time, times 2 (p - 1)/p, nccl-tests' busbw), each the best of
/// `reps` after a warm-up. Returns rank 0's figures on every rank, so that decisions made from
/// them agree. A world of one rank returns {0, 0}: it never communicates.
/// Errors: what the communicator throws.
template <class C>
link measure_link(C& comm, std::size_t bytes = std::size_t(8) << 20, int reps = 3) {
  const int p = comm.size();
  if (p <= 1) return {};
  auto best_of = [&](std::size_t n) {
    std::vector<float> x(n, 1.0f);
    comm.all_reduce(std::span<float>(x));  // warm-up: buffers, pages, thread wake-up
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      comm.all_reduce(std::span<float>(x));
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double steps = 2.0 * (p - 1);
  const double small = best_of(16);
  const double large = best_of(std::max<std::size_t>(bytes / sizeof(float), 1024));
  double out[2] = {small / steps * 1e6,  // latency, us
                   double(bytes) * steps / p / std::max(large, 1e-9) / 1e9};  // busbw as nccl-tests: no latency taken off
  comm.broadcast(std::span<double>(out, 2), 0);
  return {.bus_gbytes = out[1], .latency_us = out[0]};
}

}  // namespace loom::train
