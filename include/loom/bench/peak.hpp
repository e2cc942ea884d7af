#pragma once
/// \file The machine's peak arithmetic rate, measured per unit: the denominator of MFU on the CPU.
///
/// MFU needs "the peak the hardware could do". On Ascend that comes from a per-SoC table; on a
/// CPU it depends on the core count, vector width, execution ports and the clock under all-core
/// load, which no table knows for a cloud VM. So we measure it: every thread runs a loop of
/// independent multiply-accumulates on one unit, enough independent chains to cover the latency,
/// nothing touching memory. That is the ceiling a GEMM kernel on that unit can approach. MFU is
/// reported against the unit the precision in use runs its GEMMs on (peak_unit).
///
/// Units (peak_unit):
///   fp32_fma  acc = acc * m + b on fp32 vectors; ISA chosen at compile time from the target
///             macros: __AVX512F__ 16 x 512-bit chains ("avx512f"), __AVX2__ && __FMA__ 12 x
///             256-bit ("avx2+fma"), else GCC vector extensions ("generic"). Build with
///             -march=native to measure what the machine can do.
///   bf16_dot  AVX512-BF16 VDPBF16PS (_mm512_dpbf16_ps: 16 lanes x 2 bf16 products added to
///             fp32, 64 flops an instruction), compiled with a target attribute and run only
///             when cpuid reports AVX512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and later).
///   amx_bf16  AMX TDPBF16PS on 16 x 16 fp32 tiles (16 x 32 bf16 times 32 x 16: 16,384 flops an
///             instruction), run only when cpuid reports AMX-BF16 and Linux grants the tile
///             state (arch_prctl ARCH_REQ_XCOMP_PERM); Intel Sapphire Rapids and later.
/// Flops count 2 per multiply-add (the convention of vendor peak figures and of MFU).
/// Threads: OpenMP when compiled with -fopenmp (omp_get_max_threads() unless given), otherwise
/// std::thread with std::thread::hardware_concurrency().
/// Expect (fp32_fma): about 350-520 GFLOP/s on the project's 2-core AVX-512 machines.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string_view>
#include <thread>
#include <vector>

#include <stdexcept>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define LOOM_PEAK_X86 1
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
  std::string_view isa;    ///< "avx512f", "avx2+fma" or "generic" (fp32_fma); "avx512bf16"; "amx-bf16"
  double seconds = 0;      ///< wall time of the best trial
  double flops_per_second() const noexcept { return gflops * 1e9; }
};

/// The arithmetic unit a peak is measured on (see the file comment).
enum class peak_unit {
  fp32_fma,  ///< fp32 vector FMA: fp32 GEMMs, and 16-bit ones that convert to fp32
  bf16_dot,  ///< AVX512-BF16 VDPBF16PS: loom's bf16 GEMM kernel where the CPU has it
  amx_bf16,  ///< AMX-BF16 tiles (oneDNN's bf16 matmul on CPUs that have them)
};

/// "fp32 FMA", "VDPBF16PS" or "AMX-BF16".
constexpr std::string_view unit_name(peak_unit u) noexcept {
  return u == peak_unit::fp32_fma ? "fp32 FMA" : u == peak_unit::bf16_dot ? "VDPBF16PS" : "AMX-BF16";
}

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

#if LOOM_PEAK_X86
/// `iters` rounds of 12 independent VDPBF16PS chains (64 flops each); the result depends on all.
__attribute__((target("avx512f,avx512bf16"))) inline float bf16_dot_chains(std::int64_t iters, float seed) noexcept {
  constexpr int chains = 12;
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(seed));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  __m512 acc[chains];
#pragma GCC unroll 12
  for (int k = 0; k < chains; ++k) acc[k] = _mm512_set1_ps(seed + 0.01f * float(k));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < chains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
#pragma GCC unroll 12
  for (int k = 1; k < chains; ++k) acc[0] = _mm512_add_ps(acc[0], acc[k]);
  alignas(64) float out[16];
  _mm512_store_ps(out, acc[0]);
  float s = 0;
  for (float v : out) s += v;
  return s;
}
inline constexpr double bf16_dot_flops_per_iter = 12.0 * 16 * 2 * 2;

/// AMX tile configuration (palette 1), the layout LDTILECFG reads (Intel SDM vol. 2, LDTILECFG).
struct alignas(64) amx_tile_config {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
/// `iters` rounds of 4 independent TDPBF16PS into tiles 0-3 from A tiles 4-5 and B tiles 6-7
/// (all 16 rows x 64 bytes); the result depends on every accumulator.
__attribute__((target("amx-tile,amx-bf16"))) inline float amx_bf16_chains(std::int64_t iters, float seed) noexcept {
  amx_tile_config cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  alignas(64) std::uint16_t src[16 * 32];
  const std::uint16_t one = 0x3f80, tiny = 0x3a83;  // bf16 1.0 and about 1e-3
  for (int i = 0; i < 16 * 32; ++i) src[i] = (i & 1) ? tiny : one;
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float s = seed;
  _tile_stored(0, out, 64);
  s += out[0];
  _tile_stored(1, out, 64);
  s += out[17];
  _tile_stored(2, out, 64);
  s += out[34];
  _tile_stored(3, out, 64);
  s += out[255];
  _tile_release();
  return s;
}
inline constexpr double amx_bf16_flops_per_iter = 4.0 * 16 * 16 * 32 * 2;

/// cpuid leaf 7: AMX-TILE (EDX bit 24) and AMX-BF16 (EDX bit 22).
inline bool cpu_has_amx_bf16() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 24 & 1u) && (d >> 22 & 1u);
}
/// Asks Linux for the AMX tile data state (needed once per process before any thread uses AMX).
inline bool amx_permitted() noexcept {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return ::syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
  return false;
#endif
}
#endif

/// The loop and its flops per iteration for one unit.
struct unit_kernel {
  float (*chains)(std::int64_t, float) noexcept;
  double flops_per_iter;
  std::string_view isa;
};
inline unit_kernel kernel_for(peak_unit u) noexcept {
#if LOOM_PEAK_X86
  if (u == peak_unit::bf16_dot) return {&bf16_dot_chains, bf16_dot_flops_per_iter, "avx512bf16"};
  if (u == peak_unit::amx_bf16) return {&amx_bf16_chains, amx_bf16_flops_per_iter, "amx-bf16"};
#endif
  (void)u;
  return {&fma_chains, flops_per_iter, peak_isa};
}

/// CPU time of the calling thread, in seconds (time it actually ran, not time it waited for a
/// core). Falls back to the steady clock where the POSIX thread clock is missing.
inline double thread_cpu_seconds() noexcept {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One trial: k.chains(iters) on `threads` threads at once.
struct trial {
  double wall = 0;        ///< seconds, whole team
  double cpu_rate = 0;    ///< sum over threads of flops / own CPU seconds
};
inline trial run_all_threads(const unit_kernel& k, int threads, std::int64_t iters, float& sink) {
  std::vector<double> cpu(static_cast<std::size_t>(threads), 0.0);
  std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
  auto body = [&](int t) {
    const double c0 = thread_cpu_seconds();
    part[t] = k.chains(iters, 1.0f + 0.001f * float(t));
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
    if (cpu[t] > 0) r.cpu_rate += k.flops_per_iter * double(iters) / cpu[t];
  }
  return r;
}

}  // namespace detail

/// True when this CPU (and OS) can run `u`'s loop: fp32_fma always; bf16_dot with AVX512-BF16;
/// amx_bf16 with AMX-BF16 and the Linux tile permission (requested here, once per process).
inline bool peak_unit_available(peak_unit u) noexcept {
#if LOOM_PEAK_X86
  if (u == peak_unit::bf16_dot) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  if (u == peak_unit::amx_bf16) return detail::cpu_has_amx_bf16() && detail::amx_permitted();
  return true;
#else
  return u == peak_unit::fp32_fma;
#endif
}

/// The unit a CPU training step's linear layers run on for `precision` ("fp32", "bf16" or
/// "fp16") on this CPU, for MFU: bf16 on AMX-BF16 tiles where the CPU has them (oneDNN's
/// matmul), else on VDPBF16PS where it has AVX512-BF16 (loom's kernel), else fp32 FMA; fp32 and
/// fp16 (computed in fp32) on fp32 FMA. Mirrors kernels::cpu's choice (docs/precision.md).
inline peak_unit step_peak_unit(std::string_view precision) noexcept {
  if (precision != "bf16") return peak_unit::fp32_fma;
  if (peak_unit_available(peak_unit::amx_bf16)) return peak_unit::amx_bf16;
  if (peak_unit_available(peak_unit::bf16_dot)) return peak_unit::bf16_dot;
  return peak_unit::fp32_fma;
}

/// Measures the peak of unit `u` on this machine (all threads), in GFLOP/s.
///
/// threads           0 = all (OpenMP's default team size, or hardware_concurrency)
/// seconds_per_trial target duration of one timed trial; the loop count is calibrated first
/// trials            timed trials after one warm-up; the best is reported
/// Two estimates per trial: each thread's flops over its own CPU time, summed (`gflops`: what
/// the cores can do, robust when other processes share the machine, as on a developer box
/// where builds run), and all flops over the team's wall time (`gflops_wall`: what this process
/// got). They agree on an idle machine.
/// Cost: about (trials + 1) * seconds_per_trial + 0.05 s of all cores.
/// Throws std::invalid_argument when !peak_unit_available(u) (the loop would fault with SIGILL);
/// std::bad_alloc / std::system_error from thread creation.
inline peak_result measure_peak(peak_unit u, int threads = 0, double seconds_per_trial = 0.25, int trials = 3) {
  if (!peak_unit_available(u))
    throw std::invalid_argument("loom::bench::measure_peak: this CPU cannot run " + std::string(unit_name(u)) +
                                "; check peak_unit_available() first");
  if (threads <= 0) {
#if defined(_OPENMP)
    threads = omp_get_max_threads();
#else
    threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#endif
  }
  const detail::unit_kernel k = detail::kernel_for(u);
  float sink = 0;
  // Calibrate the loop count on all threads (so the clock is at its all-core frequency).
  std::int64_t iters = 1 << 12;
  double t = detail::run_all_threads(k, threads, iters, sink).wall;
  while (t < 0.02) {
    iters *= 4;
    t = detail::run_all_threads(k, threads, iters, sink).wall;
  }
  iters = std::max<std::int64_t>(1, static_cast<std::int64_t>(double(iters) * seconds_per_trial / t));
  detail::run_all_threads(k, threads, iters, sink);  // warm-up at the final size

  peak_result r;
  r.threads = threads;
  r.isa = k.isa;
  r.seconds = 1e300;
  for (int i = 0; i < std::max(1, trials); ++i) {
    const auto tr = detail::run_all_threads(k, threads, iters, sink);
    r.seconds = std::min(r.seconds, tr.wall);
    r.gflops = std::max(r.gflops, tr.cpu_rate / 1e9);
  }
  r.gflops_wall = k.flops_per_iter * double(iters) * double(threads) / r.seconds / 1e9;
  // `sink` depends on every chain, so no loop can be removed; keep it observable.
  volatile float keep = sink;
  (void)keep;
  return r;
}

/// The fp32 FMA peak: measure_peak(peak_unit::fp32_fma, ...). Never throws except
/// std::bad_alloc / std::system_error from thread creation.
inline peak_result measure_fp32_peak(int threads = 0, double seconds_per_trial = 0.25, int trials = 3) {
  return measure_peak(peak_unit::fp32_fma, threads, seconds_per_trial, trials);
}

}  // namespace loom::bench
