#pragma once
/// \file The machine's fp32 fused multiply-add peak, measured: the denominator of MFU on the CPU.
///
/// MFU needs "the peak the hardware could do". On Ascend that comes from a per-SoC table; on a
/// CPU it depends on the core count, vector width, FMA ports and the clock under all-core load,
/// which no table knows for a cloud VM. So we measure it once at start-up: every thread runs a
/// loop of independent vector FMAs (acc = acc * m + b), enough independent chains to cover the
/// FMA latency on two ports, nothing touching memory. That is the same ceiling a GEMM kernel
/// can approach, and what PyTorch/llm.c MFU figures on these machines were computed against.
///
/// ISA: chosen at compile time from the target macros, so building without AVX-512 works:
///   __AVX512F__          16 x 512-bit accumulators (_mm512_fmadd_ps)      -> "avx512f"
///   __AVX2__ && __FMA__  12 x 256-bit accumulators (_mm256_fmadd_ps)      -> "avx2+fma"
///   otherwise            GCC/Clang vector extension, mul then add (2 flops) -> "generic"
/// Build with -march=native to measure what the machine can do.
/// Threads: OpenMP when compiled with -fopenmp (omp_get_max_threads() unless given), otherwise
/// std::thread with std::thread::hardware_concurrency().
/// Expect: about 517 GFLOP/s on the project's 2-core AVX-512 machines (-march=native).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace loom::bench {

/// One peak measurement.
struct peak_result {
  double gflops = 0;       ///< peak, all threads, per CPU-second of each (1e9 flop/s); use this for MFU
  double gflops_wall = 0;  ///< the same flops over the best trial's wall time (lower if the machine is busy)
  int threads = 0;         ///< threads that ran the loop
  std::string_view isa;    ///< "avx512f", "avx2+fma" or "generic"
  double seconds = 0;      ///< wall time of the best trial
  double flops_per_second() const noexcept { return gflops * 1e9; }
};

namespace detail {

#if defined(__AVX512F__)
inline constexpr std::string_view peak_isa = "avx512f";
inline constexpr int peak_chains = 16, peak_lanes = 16;
/// `iters` rounds of `peak_chains` independent 16-lane FMAs; returns a value that depends on all.
inline float fma_chains(std::int64_t iters, float seed) noexcept {
  const __m512 m = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  __m512 a[peak_chains];
#pragma GCC unroll 16
  for (int k = 0; k < peak_chains; ++k) a[k] = _mm512_set1_ps(seed + 0.01f * float(k));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < peak_chains; ++k) a[k] = _mm512_fmadd_ps(a[k], m, b);
  }
#pragma GCC unroll 16
  for (int k = 1; k < peak_chains; ++k) a[0] = _mm512_add_ps(a[0], a[k]);
  alignas(64) float out[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (-Wuninitialized)
  _mm512_store_ps(out, a[0]);
  float s = 0;
  for (float v : out) s += v;
  return s;
}
inline constexpr double flops_per_iter = 2.0 * peak_chains * peak_lanes;
#elif defined(__AVX2__) && defined(__FMA__)
inline constexpr std::string_view peak_isa = "avx2+fma";
inline constexpr int peak_chains = 12, peak_lanes = 8;
inline float fma_chains(std::int64_t iters, float seed) noexcept {
  const __m256 m = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  __m256 a[peak_chains];
#pragma GCC unroll 12
  for (int k = 0; k < peak_chains; ++k) a[k] = _mm256_set1_ps(seed + 0.01f * float(k));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < peak_chains; ++k) a[k] = _mm256_fmadd_ps(a[k], m, b);
  }
#pragma GCC unroll 12
  for (int k = 1; k < peak_chains; ++k) a[0] = _mm256_add_ps(a[0], a[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, a[0]);
  float s = 0;
  for (float v : out) s += v;
  return s;
}
inline constexpr double flops_per_iter = 2.0 * peak_chains * peak_lanes;
#else
inline constexpr std::string_view peak_isa = "generic";
inline constexpr int peak_chains = 12, peak_lanes = 4;
typedef float peak_vec __attribute__((vector_size(16)));
inline float fma_chains(std::int64_t iters, float seed) noexcept {
  const peak_vec m = {0.9999999f, 0.9999999f, 0.9999999f, 0.9999999f};
  const peak_vec b = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
  peak_vec a[peak_chains];
#pragma GCC unroll 12
  for (int k = 0; k < peak_chains; ++k) a[k] = peak_vec{} + (seed + 0.01f * float(k));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < peak_chains; ++k) a[k] = a[k] * m + b;
  }
  float s = 0;
  for (int k = 0; k < peak_chains; ++k)
    for (int l = 0; l < 4; ++l) s += a[k][l];
  return s;
}
inline constexpr double flops_per_iter = 2.0 * peak_chains * peak_lanes;
#endif

/// CPU time of the calling thread, in seconds (time it actually ran, not time it waited for a
/// core). Falls back to the steady clock where the POSIX thread clock is missing.
inline double thread_cpu_seconds() noexcept {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One trial: fma_chains(iters) on `threads` threads at once.
struct trial {
  double wall = 0;        ///< seconds, whole team
  double cpu_rate = 0;    ///< sum over threads of flops / own CPU seconds
};
inline trial run_all_threads(int threads, std::int64_t iters, float& sink) {
  std::vector<double> cpu(static_cast<std::size_t>(threads), 0.0);
  std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
  auto body = [&](int t) {
    const double c0 = thread_cpu_seconds();
    part[t] = fma_chains(iters, 1.0f + 0.001f * float(t));
    cpu[t] = thread_cpu_seconds() - c0;
  };
  const auto t0 = std::chrono::steady_clock::now();
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    if (t < threads) body(t);
  }
#else
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (auto& th : pool) th.join();
#endif
  trial r;
  r.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int t = 0; t < threads; ++t) {
    sink += part[t];
    if (cpu[t] > 0) r.cpu_rate += flops_per_iter * double(iters) / cpu[t];
  }
  return r;
}

}  // namespace detail

/// Measures the fp32 FMA peak of this machine (all threads), in GFLOP/s.
///
/// threads           0 = all (OpenMP's default team size, or hardware_concurrency)
/// seconds_per_trial target duration of one timed trial; the loop count is calibrated first
/// trials            timed trials after one warm-up; the best is reported
/// Two estimates per trial: each thread's flops over its own CPU time, summed (`gflops`: what
/// the cores can do, robust when other processes share the machine, as on a developer box
/// where builds run), and all flops over the team's wall time (`gflops_wall`: what this process
/// got). They agree on an idle machine. Counts 2 flops per lane per FMA (the convention of
/// vendor peak figures and of MFU).
/// Cost: about (trials + 1) * seconds_per_trial + 0.05 s of all cores. Never throws except
/// std::bad_alloc / std::system_error from thread creation.
inline peak_result measure_fp32_peak(int threads = 0, double seconds_per_trial = 0.25, int trials = 3) {
  if (threads <= 0) {
#if defined(_OPENMP)
    threads = omp_get_max_threads();
#else
    threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#endif
  }
  float sink = 0;
  // Calibrate the loop count on all threads (so the clock is at its all-core frequency).
  std::int64_t iters = 1 << 16;
  double t = detail::run_all_threads(threads, iters, sink).wall;
  while (t < 0.02) {
    iters *= 4;
    t = detail::run_all_threads(threads, iters, sink).wall;
  }
  iters = std::max<std::int64_t>(1, static_cast<std::int64_t>(double(iters) * seconds_per_trial / t));
  detail::run_all_threads(threads, iters, sink);  // warm-up at the final size

  peak_result r;
  r.threads = threads;
  r.isa = detail::peak_isa;
  r.seconds = 1e300;
  for (int i = 0; i < std::max(1, trials); ++i) {
    const auto tr = detail::run_all_threads(threads, iters, sink);
    r.seconds = std::min(r.seconds, tr.wall);
    r.gflops = std::max(r.gflops, tr.cpu_rate / 1e9);
  }
  r.gflops_wall = detail::flops_per_iter * double(iters) * double(threads) / r.seconds / 1e9;
  // `sink` depends on every chain, so no loop can be removed; keep it observable.
  volatile float keep = sink;
  (void)keep;
  return r;
}

}  // namespace loom::bench
