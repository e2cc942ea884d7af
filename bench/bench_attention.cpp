/// bench_attention: fused (flash-style) vs reference causal attention on the CPU, fp32, and the
/// fused kernel on bf16 storage beside it.
///
/// Usage: bench_attention [--T 128,256,512,1024] [--batch 2] [--heads 6] [--head-dim 64]
///                        [--reps 7] [--tiles | --fusions | --step | --bf16]
/// Default table: forward and backward milliseconds (best of --reps interleaved runs, all
/// variants in the same process and the same loop, so the ratios share one machine state),
/// the fwd+bwd speed-up of fused over reference, and the attention memory of one layer
/// (saved state + backward scratch, as the activation table allocates it):
///   reference          kernels::attention<cpu, float, reference>
///   fused              kernels::attention<cpu, float, fused>, backward given the output (D from O)
///   fused, D recomputed  the same, backward without the output (the 10-argument overload)
/// --tiles    fused fwd+bwd CPU time on one thread per (block_q, block_k) for each tuned head
///            size, at each --T (how attention_traits.hpp was chosen), on the path float
///            storage runs with B NH >= threads (heads gathered; FMA products on AVX-512).
/// --fusions  the other fusions beside attention, measured on bench_small's shapes (B·T = 2048,
///            C = 384): residual add + LayerNorm in one pass vs the two kernels, and GELU
///            applied per row block right after its GEMM vs GEMM then GELU over the whole.
/// --step     one whole training step (forward, backward, AdamW; train::trainer) of a 6-layer,
///            6-head, width-384 model (bench_small with 1024 positions) with fused vs
///            reference attention, at 8 x 256 and 2 x 1024 tokens.
/// --bf16     fused fp32 against fused bf16 storage with the bf16 tile products on each unit this
///            CPU has (AMX tiles, VDPBF16PS) and with the fp32 products (attention_products::fp32),
///            fwd and bwd given the output,
///            each variant's GFLOP/s (causal: fwd 2 B NH T^2 HD, bwd 2.5x fwd), and beside the fp32
///            attention the rate of a 2048^3 fp32 cpu::gemm timed in the same rounds (one call
///            per round, best of them) and the attention's percentage of it.
/// Every table starts with the load average: the project's machines are shared, and wall
/// times on a loaded machine mostly measure the share of the cores this process got.
/// Results and the machine they were measured on: docs/attention.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace loom;
using clk = std::chrono::steady_clock;

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// The 1-, 5- and 15-minute load averages (Linux), for the table headers.
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(f >> a >> b >> c)) return "load average unavailable";
  return fmt::format("load average {:.2f} {:.2f} {:.2f}", a, b, c);
}

double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

/// CPU time of the whole process (ms): immune to preemption by other processes, so the tile
/// table (run on one thread) compares tiles, not the machine's load.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/// Best of the runs: on a shared machine the other processes only ever add time.
double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.5f, float hi = 1.5f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * float(random_uniform(seed, 0, i));
  return v;
}

/// One attention problem in storage type T (float, or bf16 rounded from the same values).
template <class T = float>
struct problem {
  int B, Tn, C, NH;
  std::vector<T> qkv, dout;
  problem(int b, int t, int c, int nh)
      : B(b), Tn(t), C(c), NH(nh), qkv(rounded(random_floats(std::size_t(b) * t * 3 * c, 1))),
        dout(rounded(random_floats(std::size_t(b) * t * c, 2, -1.f, 1.f))) {}
  static std::vector<T> rounded(const std::vector<float>& v) { return std::vector<T>(v.begin(), v.end()); }
};

/// The buffers and timings of one implementation in storage type T.
template <class Impl, class T = float>
struct variant {
  using attn = kernels::attention<device::cpu, T, Impl>;
  std::vector<T> out, dqkv;
  std::vector<float> saved, scratch;
  std::vector<double> fwd_ms, bwd_ms;
  explicit variant(const problem<T>& p)
      : out(std::size_t(p.B) * p.Tn * p.C), dqkv(p.qkv.size()), saved(attn::saved_elems(p.B, p.NH, p.Tn)),
        scratch(attn::scratch_elems(threads(), p.Tn)) {}
  std::size_t bytes() const { return (saved.size() + scratch.size()) * sizeof(float); }
  /// backward_with_out: pass the forward's output (fused only; D = rowsum(dO .* O)).
  void run(context<device::cpu>& ctx, const problem<T>& p, bool backward_with_out) {
    auto t0 = clk::now();
    attn::forward(ctx, out.data(), saved.data(), p.qkv.data(), p.B, p.Tn, p.C, p.NH);
    fwd_ms.push_back(ms_since(t0));
    t0 = clk::now();
    if constexpr (std::is_same_v<Impl, kernels::fused>) {
      if (backward_with_out) {
        attn::backward(ctx, dqkv.data(), p.dout.data(), p.qkv.data(), out.data(), saved.data(), scratch.data(), p.B,
                       p.Tn, p.C, p.NH);
        bwd_ms.push_back(ms_since(t0));
        return;
      }
    }
    attn::backward(ctx, dqkv.data(), p.dout.data(), p.qkv.data(), saved.data(), scratch.data(), p.B, p.Tn, p.C, p.NH);
    bwd_ms.push_back(ms_since(t0));
  }
};

void attention_table(const std::vector<int>& lengths, int B, int NH, int HD, int reps) {
  using bf16 = Eigen::bfloat16;
  context<device::cpu> ctx;
  const int C = NH * HD;
  fmt::print("B={} NH={} HD={} (C={}), {} threads, best of {} interleaved runs, {}\n", B, NH, HD, C, threads(), reps,
             load_average());
  fmt::print("| {:>5} | {:>9} | {:>9} | {:>9} | {:>9} | {:>11} | {:>8} | {:>13} | {:>9} | {:>9} | {:>7} | {:>10} | "
             "{:>10} | {:>10} |\n",
             "T", "ref fwd", "ref bwd", "fused fwd", "fused bwd", "bwd no-out", "speed-up", "speed-up n-o", "ref MiB",
             "fused MiB", "GFLOP/s", "bf16 fwd", "bf16 bwd", "bf16/fp32");
  fmt::print("|------:|----------:|----------:|----------:|----------:|------------:|---------:|--------------:|----------:|"
             "----------:|--------:|-----------:|-----------:|-----------:|\n");
  for (int T : lengths) {
    const problem<> p(B, T, C, NH);
    const problem<bf16> p16(B, T, C, NH);
    variant<kernels::reference> ref(p);
    variant<kernels::fused> fused(p), fused_no_out(p);
    variant<kernels::fused, bf16> fused16(p16);
    auto round = [&] {
      ref.run(ctx, p, false);
      fused.run(ctx, p, true);
      fused_no_out.run(ctx, p, false);
      fused16.run(ctx, p16, true);
    };
    round();  // warm-up: first touch of every buffer, thread pool start
    for (auto* v : {&ref.fwd_ms, &ref.bwd_ms, &fused.fwd_ms, &fused.bwd_ms, &fused_no_out.fwd_ms, &fused_no_out.bwd_ms,
                    &fused16.fwd_ms, &fused16.bwd_ms})
      v->clear();
    for (int r = 0; r < reps; ++r) round();
    const double rf = best(ref.fwd_ms), rb = best(ref.bwd_ms), ff = best(fused.fwd_ms), fb = best(fused.bwd_ms);
    const double fb2 = best(fused_no_out.bwd_ms), ff2 = best(fused_no_out.fwd_ms);
    const double hf = best(fused16.fwd_ms), hb = best(fused16.bwd_ms);
    // causal attention's useful flops: fwd 2 GEMMs, bwd 5 GEMMs over the lower triangle
    const double flops = 7.0 * 2 * B * NH * (double(T) * (T + 1) / 2) * HD;
    fmt::print("| {:>5} | {:>9.2f} | {:>9.2f} | {:>9.2f} | {:>9.2f} | {:>11.2f} | {:>7.2f}x | {:>12.2f}x | {:>9.2f} | "
               "{:>9.2f} | {:>7.1f} | {:>10.2f} | {:>10.2f} | {:>9.2f}x |\n",
               T, rf, rb, ff, fb, fb2, (rf + rb) / (ff + fb), (rf + rb) / (ff2 + fb2), ref.bytes() / 1048576.0,
               fused.bytes() / 1048576.0, flops / ((ff + fb) * 1e-3) / 1e9, hf, hb, (ff + fb) / (hf + hb));
    std::fflush(stdout);
  }
  fmt::print("speed-up = (ref fwd + ref bwd) / (fused fwd + fused bwd); n-o: backward without the output.\n"
             "MiB = one layer's saved state + backward scratch ({} threads). GFLOP/s = fused fp32, causal flops.\n"
             "bf16: the fused kernel on bf16 storage (backward given the output); bf16/fp32 = fp32 fused fwd+bwd time\n"
             "over bf16's (above 1: bf16 is faster).\n",
             threads());
}

/// Fused attention on bf16 storage with the given products (forward, backward given the output).
struct bf16_variant {
  kernels::cpu::attention_products products;
  std::vector<Eigen::bfloat16> out, dqkv;
  std::vector<float> lse;
  std::vector<double> fwd_ms, bwd_ms;
  bf16_variant(const problem<Eigen::bfloat16>& p, kernels::cpu::attention_products pr)
      : products(pr), out(std::size_t(p.B) * p.Tn * p.C), dqkv(p.qkv.size()), lse(std::size_t(p.B) * p.NH * p.Tn) {}
  void run(const problem<Eigen::bfloat16>& p) {
    auto t0 = clk::now();
    kernels::cpu::attention_fused_forward_16(out.data(), lse.data(), p.qkv.data(), p.B, p.Tn, p.C, p.NH, nullptr, {}, 0,
                                             products);
    fwd_ms.push_back(ms_since(t0));
    t0 = clk::now();
    kernels::cpu::attention_fused_backward_16(dqkv.data(), p.dout.data(), p.qkv.data(), out.data(), lse.data(), p.B,
                                              p.Tn, p.C, p.NH, nullptr, {}, 0, products);
    bwd_ms.push_back(ms_since(t0));
  }
};

/// One fp32 n x n x n product of cpu::gemm on random operands, timed per call: the GEMM rate the
/// attention is compared with, measured in the same rounds as the attention variants.
struct gemm_probe {
  int n;
  std::vector<float> a = random_floats(std::size_t(n) * n, 5), b = random_floats(std::size_t(n) * n, 6);
  std::vector<float> c = std::vector<float>(std::size_t(n) * n);
  std::vector<double> ms;
  void run() {
    const auto t0 = clk::now();
    kernels::cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    ms.push_back(ms_since(t0));
  }
  /// GFLOP/s of the best call so far.
  double gflops() const { return 2.0 * n * n * double(n) / (best(ms) * 1e-3) / 1e9; }
};

void bf16_table(const std::vector<int>& lengths, int B, int NH, int HD, int reps) {
  using bf16 = Eigen::bfloat16;
  using kernels::cpu::attention_products;
  context<device::cpu> ctx;
  const int C = NH * HD;
  // the products bf16 storage can run on this machine, fastest unit first
  std::vector<std::pair<std::string, attention_products>> kinds;
  if (kernels::cpu::attention_amx_available<bf16>(HD)) kinds.emplace_back("AMX", attention_products::amx_bf16);
  if (kernels::cpu::attention_bf16_dot_available<bf16>(HD)) kinds.emplace_back("VDPBF16PS", attention_products::bf16_dot);
  kinds.emplace_back("fp32 prod", attention_products::fp32);
  const auto automatic = kernels::cpu::attention_products_default<bf16>(HD);
  std::string names;
  for (const auto& [name, pr] : kinds) names += (names.empty() ? "" : ", ") + name + (pr == automatic ? " (automatic)" : "");
  fmt::print("B={} NH={} HD={} (C={}), {} threads, best of {} interleaved runs; bf16 storage with the products on: {}; {}\n",
             B, NH, HD, C, threads(), reps, names, load_average());
  std::string head =
      fmt::format("| {:>5} | {:>9} | {:>9} | {:>8} | {:>8} | {:>6} |", "T", "fp32 fwd", "fp32 bwd", "GFLOP/s", "GEMM", "% GEMM");
  std::string rule = "|------:|----------:|----------:|---------:|---------:|-------:|";
  for (const auto& k : kinds) {
    head += fmt::format(" {:>9} | {:>9} | {:>8} | {:>7} |", k.first.substr(0, 9), "bwd", "GFLOP/s", "x fp32");
    rule += "----------:|----------:|---------:|--------:|";
  }
  fmt::print("{}\n{}\n", head, rule);
  for (int T : lengths) {
    const problem<> p(B, T, C, NH);
    const problem<bf16> p16(B, T, C, NH);
    variant<kernels::fused> f32(p);
    std::vector<bf16_variant> v16;
    for (const auto& k : kinds) v16.emplace_back(p16, k.second);
    gemm_probe gemm{2048};
    // The GEMM's 48 MB push the attention's buffers out of the caches; in a training step the
    // attention reads qkv right after the product that wrote it. So each variant runs once
    // untimed (its buffers back in the caches), then timed.
    auto warm_then_time = [](auto& v, auto&& run) {
      run();
      v.fwd_ms.pop_back(), v.bwd_ms.pop_back();
      run();
    };
    auto round = [&] {
      gemm.run();
      warm_then_time(f32, [&] { f32.run(ctx, p, true); });
      for (auto& v : v16) warm_then_time(v, [&] { v.run(p16); });
    };
    round();
    f32.fwd_ms.clear(), f32.bwd_ms.clear(), gemm.ms.clear();
    for (auto& v : v16) v.fwd_ms.clear(), v.bwd_ms.clear();
    for (int r = 0; r < reps; ++r) round();
    const double ff = best(f32.fwd_ms), fb = best(f32.bwd_ms);
    const double flops = 3.5 * 2.0 * B * NH * double(T) * T * HD;  // fwd 2 B NH T^2 HD, bwd 2.5x
    const double fused = flops / ((ff + fb) * 1e-3) / 1e9;
    std::string row = fmt::format("| {:>5} | {:>9.2f} | {:>9.2f} | {:>8.1f} | {:>8.1f} | {:>5.0f}% |", T, ff, fb, fused,
                                  gemm.gflops(), 100.0 * fused / gemm.gflops());
    for (const auto& v : v16) {
      const double hf = best(v.fwd_ms), hb = best(v.bwd_ms);
      row += fmt::format(" {:>9.2f} | {:>9.2f} | {:>8.1f} | {:>6.2f}x |", hf, hb, flops / ((hf + hb) * 1e-3) / 1e9,
                         (ff + fb) / (hf + hb));
    }
    fmt::print("{}\n", row);
    std::fflush(stdout);
  }
  fmt::print("fp32 = fused on float storage; the other column groups: fused on bf16 storage with the tile products\n"
             "on AMX tiles, on VDPBF16PS, or widened to fp32 (the fallback); forward, then backward given the output\n"
             "(ms). GFLOP/s: causal flops 3.5 x 2 B NH T^2 HD. x fp32 = fp32 fwd+bwd time over the variant's.\n"
             "GEMM = fp32 cpu::gemm 2048^3 (GFLOP/s), one call in every round, then each variant untimed and timed;\n"
             "% GEMM = the fp32 attention's rate over it, both best of the same rounds.\n");
}

/// Fused attention with explicit tiles (bypasses attention_traits).
template <int HD, int BQ, int BK>
struct fixed_tiles {
  static constexpr int head_dim = HD, block_q = BQ, block_k = BK;
};

template <int HD, int BQ, int BK>
double time_tiles(const problem<>& p, int reps) {
  using Tr = fixed_tiles<HD, BQ, BK>;
  std::vector<float> out(std::size_t(p.B) * p.Tn * p.C), dqkv(p.qkv.size()), lse(std::size_t(p.B) * p.NH * p.Tn);
  const kernels::cpu::detail::attention_shape<float> s{p.B, p.Tn, p.C, p.NH, HD, 1.f / std::sqrt(float(HD)), nullptr};
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = cpu_ms();
    kernels::cpu::detail::fused_forward_gathered<Tr>(out.data(), lse.data(), p.qkv.data(), s);
    kernels::cpu::detail::fused_backward_gathered<Tr>(dqkv.data(), p.dout.data(), p.qkv.data(), out.data(),
                                                      lse.data(), s);
    if (r > 0) ms.push_back(cpu_ms() - t0);  // run 0 is the warm-up
  }
  return best(ms);
}

template <int HD>
void tile_row(int B, int NH, int T, int reps) {
  const problem<> p(B, T, NH * HD, NH);
  fmt::print("| {:>4} | {:>8.2f} | {:>8.2f} | {:>8.2f} | {:>8.2f} | {:>8.2f} | {:>8.2f} | {:>8.2f} |\n", HD,
             time_tiles<HD, 32, 32>(p, reps), time_tiles<HD, 32, 64>(p, reps), time_tiles<HD, 64, 32>(p, reps),
             time_tiles<HD, 64, 64>(p, reps), time_tiles<HD, 64, 128>(p, reps), time_tiles<HD, 128, 64>(p, reps),
             time_tiles<HD, 128, 128>(p, reps));
  std::fflush(stdout);
}

void tile_table(int B, int NH, int T, int reps) {
#ifdef _OPENMP
  omp_set_num_threads(1);  // tiles are a per-core (cache) choice; CPU time needs one thread
#endif
  fmt::print("fused fwd+bwd CPU ms per (block_q x block_k), fp32, B={} NH={} T={}, one thread, best of {}, {}\n", B,
             NH, T, reps, load_average());
  fmt::print("| {:>4} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |\n", "HD", "32x32", "32x64", "64x32",
             "64x64", "64x128", "128x64", "128x128");
  fmt::print("|-----:|---------:|---------:|---------:|---------:|---------:|---------:|---------:|\n");
  tile_row<32>(B, NH, T, reps);
  tile_row<64>(B, NH, T, reps);
  tile_row<80>(B, NH, T, reps);
  tile_row<128>(B, NH, T, reps);
}

// ---- other fusions: measured here only; kept out of the library unless they win ----

/// res = a + b; out = LayerNorm(res) in one pass over each row (res written once, never re-read
/// from memory). Same math and outputs as residual_forward then layernorm_forward.
void residual_layernorm_fused(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                              const float* w, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = a + std::size_t(n) * C;
    const float* y = b + std::size_t(n) * C;
    float* r = res + std::size_t(n) * C;
    float s = 0;
    for (int c = 0; c < C; ++c) r[c] = x[c] + y[c], s += r[c];
    const float m = s / C;
    float v = 0;
    for (int c = 0; c < C; ++c) v += (r[c] - m) * (r[c] - m);
    const float rs = 1.f / std::sqrt(v / C + 1e-5f);
    float* o = out + std::size_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (r[c] - m) * rs * w[c] + bias[c];
    mean[n] = m, rstd[n] = rs;
  }
}

/// Best wall and best process-CPU milliseconds of f over reps runs (after one warm-up).
std::pair<double, double> time_ms(const std::function<void()>& f, int reps) {
  f();
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clk::now();
    const double c0 = cpu_ms();
    f();
    cpu.push_back(cpu_ms() - c0);
    wall.push_back(ms_since(t0));
  }
  return {best(wall), best(cpu)};
}

void fusion_row(const std::string& what, std::pair<double, double> sep, std::pair<double, double> fus) {
  fmt::print("| {:<46} | {:>8.3f} | {:>8.3f} | {:>7.2f}x | {:>8.3f} | {:>8.3f} | {:>7.2f}x |\n", what, sep.first,
             fus.first, sep.first / fus.first, sep.second, fus.second, sep.second / fus.second);
  std::fflush(stdout);
}

void fusion_table(int reps) {
  const int N = 8 * 256, C = 384;  // bench_small: B=8, T=256, d_model=384
  const auto a = random_floats(std::size_t(N) * C, 3), b = random_floats(std::size_t(N) * C, 4);
  const auto w = random_floats(C, 5), bias = random_floats(C, 6);
  std::vector<float> res(a.size()), out(a.size()), mean(N), rstd(N);
  namespace k = kernels::cpu;
  fmt::print("fp32, {} threads, best of {}; wall ms and process CPU ms; {}\n", threads(), reps, load_average());
  fmt::print("| {:<46} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |\n", "fusion (bench_small shapes)", "sep wall",
             "fus wall", "ratio", "sep CPU", "fus CPU", "ratio");
  fmt::print("|------------------------------------------------|---------:|---------:|---------:|---------:|---------:|---------:|\n");
  fusion_row("residual add + LayerNorm (N=2048, C=384)", time_ms([&] {
    k::residual_forward(res.data(), a.data(), b.data(), res.size());
    k::layernorm_forward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), N, C);
  }, reps), time_ms([&] {
    residual_layernorm_fused(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                             bias.data(), N, C);
  }, reps));
  // GELU in the GEMM epilogue: Eigen has no epilogue hook, so the fused form is a blocked
  // GEMM (row blocks spread over the threads, Eigen single-threaded inside) with GELU applied
  // to each block while it is in cache.
  const int OC = 4 * C;
  const auto x = random_floats(std::size_t(N) * C, 7), wf = random_floats(std::size_t(OC) * C, 8, -0.05f, 0.05f);
  const auto bf = random_floats(OC, 9);
  std::vector<float> pre(std::size_t(N) * OC), post(pre.size());
  const auto sep = time_ms([&] {
    k::matmul_forward(pre.data(), x.data(), wf.data(), bf.data(), N, C, OC);
    k::gelu_forward(post.data(), pre.data(), pre.size());
  }, reps);
  // Control: the same row-block GEMM without the fusion (GELU afterwards over the whole),
  // which separates the effect of partitioning the GEMM by rows from that of the fusion.
  // One block of rows [r0, r0+n) of the fc GEMM: the model's own matmul kernel on the block.
  auto gemm_rows = [&](int r0, int n) {
    k::matmul_forward(pre.data() + std::size_t(r0) * OC, x.data() + std::size_t(r0) * C, wf.data(), bf.data(), n, C, OC);
  };
  auto blocked_gemm = [&](int rows) {
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < N; r0 += rows) gemm_rows(r0, std::min(rows, N - r0));
  };
  fusion_row("control: 256-row-block GEMM, then GELU (unfused)", sep, time_ms([&] {
    blocked_gemm(256);
    k::gelu_forward(post.data(), pre.data(), pre.size());
  }, reps));
  for (int rows : {64, 256}) {
    fusion_row(fmt::format("fc GEMM + GELU, {}-row blocks (2048x384->1536)", rows), sep, time_ms([&] {
#pragma omp parallel for schedule(static)
      for (int r0 = 0; r0 < N; r0 += rows) {
        const int n = std::min(rows, N - r0);
        gemm_rows(r0, n);
        k::gelu_forward(post.data() + std::size_t(r0) * OC, pre.data() + std::size_t(r0) * OC, std::size_t(n) * OC);
      }
    }, reps));
  }
  fmt::print("ratio = separate / fused (> 1: the fusion wins).\n");
}

/// bench_small (6 layers, 6 heads, width 384, vocabulary 8192) with 1024 positions.
struct bench_small_1k {
  static constexpr std::string_view name = "bench_small_1k";
  static constexpr int n_layer = 6, n_head = 6, d_model = 384, max_seq = 1024;
  static constexpr int vocab = 8192, vocab_padded = 8192;
};

template <class M, int B, int T>
void step_row(int steps) {
  using P = policy<device::cpu, precision::fp32>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {1e-3, 1e-4, 10, 1000};
  train::trainer<M, P, B, T, parallel::local_group, kernels::reference> ref(ctx, cfg);
  train::trainer<M, P, B, T, parallel::local_group, kernels::fused> fused(ctx, cfg);
  std::vector<std::int32_t> w(ref.windows_per_step() * ref.window());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 1, 0, i));
  ref.step(ctx, w);  // warm-up
  fused.step(ctx, w);
  std::vector<double> rms, fms;
  for (int s = 0; s < steps; ++s) {
    auto t0 = clk::now();
    ref.step(ctx, w);
    rms.push_back(ms_since(t0));
    t0 = clk::now();
    fused.step(ctx, w);
    fms.push_back(ms_since(t0));
  }
  const double r = best(rms), f = best(fms);
  fmt::print("| {:>2} x {:>4} | {:>11.1f} | {:>13.1f} | {:>7.2f}x | {:>9.0f} | {:>11.0f} | {:>11.1f} | {:>13.1f} |\n", B, T, r,
             f, r / f, double(B) * T / r * 1e3, double(B) * T / f * 1e3, ref.activation_bytes() / 1048576.0,
             fused.activation_bytes() / 1048576.0);
  std::fflush(stdout);
}

void step_table(int steps) {
  fmt::print("train::trainer step (fwd, bwd, AdamW), fp32, {} (6 layers, 6 heads, width 384, vocab 8192), {} threads, "
             "best of {}, {}\n", bench_small_1k::name, threads(), steps, load_average());
  fmt::print("| {:>9} | {:>11} | {:>13} | {:>8} | {:>9} | {:>11} | {:>11} | {:>13} |\n", "B x T", "ref ms/step",
             "fused ms/step", "speed-up", "ref tok/s", "fused tok/s", "ref act MiB", "fused act MiB");
  fmt::print("|----------:|------------:|--------------:|---------:|----------:|------------:|------------:|--------------:|\n");
  step_row<bench_small_1k, 8, 256>(steps);
  step_row<bench_small_1k, 2, 1024>(steps);
  fmt::print("act MiB = the trainer's activation table (all layers' saved state and the backward scratch).\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fused vs reference causal attention on the CPU (fp32; the fused kernel also on bf16)"};
  std::vector<int> lengths{128, 256, 512, 1024};
  int B = 2, NH = 6, HD = 64, reps = 7;
  bool tiles = false, fusions = false, step = false, bf16 = false;
  app.add_option("--T", lengths, "sequence lengths")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--batch", B, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--heads", NH, "heads")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", HD, "head size")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed runs per variant (best reported)")->check(CLI::PositiveNumber);
  app.add_flag("--tiles", tiles, "time fused attention per tile size instead (one thread, CPU time)");
  app.add_flag("--fusions", fusions, "time the other fusions (residual+LayerNorm, GEMM+GELU) instead");
  app.add_flag("--step", step, "time whole training steps with fused vs reference attention instead");
  app.add_flag("--bf16", bf16, "fused fp32 vs fused bf16 (bf16 products and fp32 products) and the fp32 GEMM rate");
  CLI11_PARSE(app, argc, argv);
  if (tiles)
    for (int T : lengths) tile_table(B, NH, T, reps);
  else if (fusions)
    fusion_table(reps);
  else if (step)
    step_table(reps);
  else if (bf16)
    bf16_table(lengths, B, NH, HD, reps);
  else
    attention_table(lengths, B, NH, HD, reps);
  return 0;
}
