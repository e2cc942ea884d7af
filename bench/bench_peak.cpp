/// bench_peak: measures this machine's fp32 FMA peak (the MFU denominator on the CPU).
///
/// Usage: bench_peak [--threads N] [--seconds S] [--trials K]
/// Prints one row per thread count 1..N and the all-thread figure the trainer uses. Build with
/// -march=native (and -fopenmp) or the figure is that of the baseline ISA. Expect about
/// 517 GFLOP/s on the project's 2-core AVX-512 machines when nothing else is running.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <loom/bench/peak.hpp>

int main(int argc, char** argv) {
  CLI::App app{"Measure the fp32 FMA peak of this machine (GFLOP/s)"};
  int threads = 0;
  double seconds = 0.25;
  int trials = 5;
  app.add_option("--threads", threads, "threads for the all-core figure (0 = all)");
  app.add_option("--seconds", seconds, "duration of one timed trial")->check(CLI::PositiveNumber);
  app.add_option("--trials", trials, "timed trials; the best is reported")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const auto all = loom::bench::measure_fp32_peak(threads, seconds, trials);
  // GFLOP/s: per CPU-second of each thread, summed (the hardware's peak, used for MFU);
  // wall: over the team's wall time (lower when other processes share the cores).
  fmt::print("{:>8} {:>10} {:>10} {:>10} {:>14}\n", "threads", "isa", "GFLOP/s", "wall", "GFLOP/s/core");
  auto row = [](const loom::bench::peak_result& r) {
    fmt::print("{:>8} {:>10} {:>10.1f} {:>10.1f} {:>14.1f}\n", r.threads, r.isa, r.gflops, r.gflops_wall,
               r.gflops / r.threads);
  };
  for (int t = 1; t < all.threads; ++t) row(loom::bench::measure_fp32_peak(t, seconds, trials));
  row(all);
  fmt::print("fp32 peak: {:.1f} GFLOP/s ({} threads, {}; wall-clock figure {:.1f})\n", all.gflops, all.threads,
             all.isa, all.gflops_wall);
  return 0;
}
