#pragma once
// examples/layout_auto.hpp — --layout auto shared by plan and train_gpt: the per-rank peak and
// the links of this machine, and the choice printed with its runner-up. Not a library header.
#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/bench/peak.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/link_probe.hpp>
#include <loom/train/auto_layout.hpp>

namespace loom_examples {

/// This CPU's peak per rank in FLOP/s for `precision` with the calling thread's OpenMP team (the
/// unit its GEMMs run on: VDPBF16PS for 16-bit precisions where present, else fp32 FMA), and
/// the unit's description.
inline std::pair<double, std::string> cpu_peak(const std::string& precision) {
  using namespace loom;
  const bool dot = precision != "fp32" && bench::peak_unit_available(bench::peak_unit::bf16_dot);
  const double g = (dot ? bench::measure_peak(bench::peak_unit::bf16_dot) : bench::measure_fp32_peak()).gflops;
  return {g * 1e9, dot ? "this CPU's VDPBF16PS peak, measured" : "this CPU's fp32 FMA peak, measured"};
}

/// The all-reduce link of `ranks` threads of this process (train::measure_link on a
/// comm::threads world); {} for one rank.
inline loom::train::link threads_link(int ranks) {
  loom::train::link out;
  if (ranks <= 1) return out;
  loom::comm::run_threads(ranks, [&](loom::comm::threads& world) {
    const auto l = loom::train::measure_link(world);
    if (world.rank() == 0) out = l;
  });
  return out;
}

/// Ranks the candidates of `r` (train::rank_layouts), prints how many fit, the chosen one, the
/// runner-up and the next (show - 2) candidates, and returns the choice (train::choose_layout: throws loom::input_error when
/// nothing fits, naming the smallest footprint).
inline loom::train::layout_candidate choose_and_print(std::span<const loom::train::layout_option> all,
                                                      const loom::train::layout_request& r, const char* program,
                                                      std::size_t show = 2) {
  const auto mib = [](std::size_t b) { return double(b) / 1048576.0; };
  const auto ranked = loom::train::rank_layouts(all, r);
  const auto best = loom::train::choose_layout(all, r);
  const auto fit = std::count_if(ranked.begin(), ranked.end(), [](const auto& c) { return c.fits; });
  std::printf("%s: layout auto: %zu candidates for %s %s on %d rank%s (global batch %d), %ld within %.1f MiB per "
              "rank (plan + %.1f MiB overhead)\n",
              program, ranked.size(), std::string(r.model).c_str(), std::string(r.precision).c_str(), r.world_size,
              r.world_size == 1 ? "" : "s", r.global_batch, long(fit), mib(r.memory_limit), mib(r.overhead));
  for (std::size_t k = 0; k < ranked.size() && k < std::max<std::size_t>(show, 2) && (ranked[k].fits || k >= 2); ++k)
    std::printf("%s: %s %s: %.1f MiB per rank (stage %d), %.3g s per step estimated\n", program,
                k == 0 ? "chosen" : k == 1 ? "runner-up" : ranked[k].fits ? "candidate" : "does not fit",
                ranked[k].describe().c_str(), mib(ranked[k].footprint), ranked[k].largest_stage,
                ranked[k].time.seconds());
  return best;
}

}  // namespace loom_examples
