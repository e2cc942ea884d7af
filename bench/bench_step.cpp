// bench_step — one whole training step (forward, backward, AdamW) on the CPU, for the
// quickstart config and the comparison config bench_small (vocab 8192, seq 256, width 384, 6 layers,
// 6 heads, micro-batch 8) in fp32, and that config again in bf16 (PyTorch 1.13 bf16
// autocast runs it at about 4,400 tokens/s on these machines), with the bf16/fp32 ratio. Prints ms/step, tokens/s, MFU against the measured fp32 FMA peak,
// and memory (loom's buffers and the process's peak RSS).
//
//   build/bench/bench_step [--steps N] [--peak-gflops G]
//
// MFU = (6 N + 12 L T d) * tokens/s / peak (N: parameters without position embeddings).
// Reference figures on these 2-core machines: PyTorch 1.13 fp32, tuned, about
// 2,900 tokens/s on the comparison config; llm.c's CPU trainer about 580 tokens/s.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/bench/peak.hpp>
#include <loom/core/memory.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

namespace {

template <class M, int B, int T, class Prec = loom::precision::fp32>
double run(int steps, double peak_flops) {
  using namespace loom;
  using P = policy<device::cpu, Prec>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {1e-3, 1e-4, 10, 1000};
  using scaler = std::conditional_t<Prec::needs_loss_scaling, train::dynamic_loss_scaler, train::no_loss_scaler>;
  train::trainer<M, P, B, T, kernels::fused, scaler> tr(ctx, cfg);
  std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 1, 0, i));
  tr.step(ctx, w);  // warm-up: first touch of every buffer, thread pool start
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    tr.step(ctx, w);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double tok_s = double(B) * T / med * 1e3;
  const double n = double(nn::parameter_count<M>(false));
  const double fpt = 6 * n + 12.0 * M::n_layer * T * M::d_model;
  const std::size_t param_bytes = tr.model().parameters().bytes() + tr.model().gradients().bytes();
  std::size_t opt_bytes = 2 * tr.optimizer().first_moment().bytes();  // moments (+ fp32 masters below fp32)
  if constexpr (std::remove_cvref_t<decltype(tr.optimizer())>::has_master) opt_bytes += tr.optimizer().master_weights().bytes();
  const std::size_t act_bytes = tr.activation_bytes();
  const auto mem = read_process_memory();
  std::printf("| %-11s | %-4s | %2d x %4d | %10.1f | %8.1f | %8.0f | %5.1f %% | %7.1f | %7.1f | %7.1f | %8.1f |\n",
              std::string(M::name).c_str(), std::string(Prec::name).c_str(), B, T, n / 1e6, med, tok_s, 100.0 * fpt * tok_s / peak_flops,
              param_bytes / 1048576.0, opt_bytes / 1048576.0, act_bytes / 1048576.0, mem.peak_rss / 1048576.0);
  std::fflush(stdout);
  return tok_s;
}

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  int steps = 10;
  double peak_gflops = 0;
  CLI::App app{"bench_step: one whole training step (forward, backward, AdamW) on the CPU: ms/step, tokens/s, MFU, memory"};
  app.add_option("--steps", steps, "timed steps per configuration")->check(CLI::Range(1, 1000000));
  app.add_option("--peak-gflops", peak_gflops, "fp32 peak for MFU (default: measured at start-up)");
  CLI11_PARSE(app, argc, argv);
  if (peak_gflops <= 0) peak_gflops = loom::bench::measure_fp32_peak().gflops;
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  std::printf("fp32 peak %.0f GFLOP/s (measured unless --peak-gflops); OPENBLAS_CORETYPE=%s (loom's GEMM is Eigen, unaffected)\n",
              peak_gflops, ct ? ct : "(unset)");
  std::printf("| config      | prec | B  x  T   | params (M) | ms/step  | tokens/s | MFU     | p+g MiB | opt MiB | act MiB | peak RSS |\n");
  std::printf("|-------------|------|-----------|------------|----------|----------|---------|---------|---------|---------|----------|\n");
  run<loom::models::quickstart, 16, 128>(steps, peak_gflops * 1e9);
  const double f32 = run<loom::models::bench_small, 8, 256>(steps, peak_gflops * 1e9);
  const double b16 = run<loom::models::bench_small, 8, 256, loom::precision::bf16>(steps, peak_gflops * 1e9);
  std::printf("peak RSS is cumulative over the rows (the process's high-water mark); MFU is against the fp32 peak.\n");
  std::printf("bench_small bf16/fp32 throughput ratio %.2f; bf16 vs PyTorch 1.13 bf16 autocast (about 4,400 tokens/s): %.2f\n",
              b16 / f32, b16 / 4400.0);
}
