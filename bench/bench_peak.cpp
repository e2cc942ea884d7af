/// bench_peak: measures this machine's peak per arithmetic unit (the MFU denominators on the CPU).
///
/// Usage: bench_peak [--threads N] [--seconds S] [--trials K]
/// Prints, for every unit this CPU has (fp32 FMA; VDPBF16PS with AVX512-BF16; AMX-BF16 tiles),
/// one row per thread count 1..N and the all-thread figure MFU uses. Build with -march=native
/// (and -fopenmp) or the fp32 figure is that of the baseline ISA. Expect about 350-520 GFLOP/s
/// fp32 on the project's 2-core AVX-512 machines when nothing else is running.
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

  using loom::bench::peak_unit;
  // GFLOP/s: per CPU-second of each thread, summed (the hardware's peak, used for MFU);
  // wall: over the team's wall time (lower when other processes share the cores).
  fmt::print("{:>10} {:>8} {:>11} {:>10} {:>10} {:>14}\n", "unit", "threads", "isa", "GFLOP/s", "wall",
             "GFLOP/s/core");
  for (const peak_unit u : {peak_unit::fp32_fma, peak_unit::bf16_dot, peak_unit::amx_bf16}) {
    if (!loom::bench::peak_unit_available(u)) {
      fmt::print("{:>10} not on this CPU\n", loom::bench::unit_name(u));
      continue;
    }
    auto row = [u](const loom::bench::peak_result& r) {
      fmt::print("{:>10} {:>8} {:>11} {:>10.1f} {:>10.1f} {:>14.1f}\n", loom::bench::unit_name(u), r.threads, r.isa,
                 r.gflops, r.gflops_wall, r.gflops / r.threads);
    };
    const auto all = loom::bench::measure_peak(u, threads, seconds, trials);
    for (int t = 1; t < all.threads; ++t) row(loom::bench::measure_peak(u, t, seconds, trials));
    row(all);
  }
  return 0;
}
