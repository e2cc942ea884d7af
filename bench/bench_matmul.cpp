// bench_matmul — the GEMMs of one training step: Eigen against oneDNN's sgemm (when loom is
// built with it) and OpenBLAS sgemm, at the shapes of the quickstart and of the comparison config
// bench_small, forward (N x C x OC) and the two backward products. Prints GFLOP/s, the
// oneDNN/Eigen and OpenBLAS/Eigen ratios, measured in one run, the implementation
// kernels::cpu::gemm's `automatic` picks on this machine, and the OPENBLAS_CORETYPE it ran under (Haswell on these machines: AVX2 kernels at
// half speed; run `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/bench/bench_matmul`
// for OpenBLAS's own choice).
//
// Second table: kernels::cpu::gemm with bf16 operands (AVX512-BF16 kernel when the CPU has it,
// bf16 results for y and dx, fp32 dW as the model stores them) against the same call with fp32
// operands (`automatic`: oneDNN or Eigen), at the model shapes N = 8*256 rows, (C, OC) in {(384,1152), (384,384),
// (384,1536), (1536,384), (384,8192)}, plus the bf16 fp32-convert paths (Eigen, and oneDNN's sgemm when built with
// it) and oneDNN's bf16 matmul primitive (gemm_impl::onednn_matmul, primitives created once
// through an onednn_matmul_cache before timing); ratios in one run, then the fastest per product.
//
//   build/bench/bench_matmul [--reps N] [--table eigen|bf16|all] [--clock wall|cpu]
// --clock cpu (bf16 table) times by process CPU time: with OMP_NUM_THREADS=1 it measures the
// kernels on a busy machine, where wall-clock ratios are mostly noise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu/gemm.hpp>
#include <loom/kernels/cpu/matmul.hpp>

#if LOOM_BENCH_CBLAS
#include <cblas.h>
#endif

namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Best per-call CPU time of the whole process (all its threads). With OMP_NUM_THREADS=1 this
// is the time the call actually ran, whatever else the machine runs: the figure to compare
// kernels on a busy machine (it still includes cache sharing and clock changes).
template <class F>
double best_cpu_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = process_cpu_seconds();
    f();
    best = std::min(best, process_cpu_seconds() - t0);
  }
  return best;
}

// bf16 vs fp32 through kernels::cpu::gemm at the model's linear-layer shapes.
void bf16_table(int reps, bool cpu_clock) {
  using bf16 = Eigen::bfloat16;
  namespace cpu = loom::kernels::cpu;
  using cpu::detail::gemm_impl;
  loom::device::configure_host_malloc_for_gemm();  // as train_gpt does: no mmap per GEMM buffer
  const bool fast = cpu::detail::cpu_has_avx512_bf16();
  const bool dnnl = cpu::detail::gemm_has_onednn;
  std::printf("\nkernels::cpu::gemm, bf16 vs fp32 operands | AVX512-BF16 kernel: %s | best of %d | %s\n",
              fast ? "yes" : "no (bf16 column = fp32-convert fallback)", reps,
              cpu_clock ? "GFLOP per process CPU-second" : "GFLOP/s (wall)");
  std::printf("| shape (N x C -> OC)      | product      | fp32 (auto)  | bf16 VDPBF16PS | bf16 / fp32 | bf16 via Eigen | bf16 via oneDNN | bf16 oneDNN matmul |\n");
  std::printf("|--------------------------|--------------|--------------|----------------|-------------|----------------|-----------------|--------------------|\n");
  cpu::detail::onednn_matmul_cache cache;  // primitives created on the first (untimed) call per product
  std::string fastest;
  const int N = 8 * 256;
  const int shapes[][2] = {{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}, {384, 8192}};
  double sum_ratio_log = 0;
  int n_ratio = 0;
  for (const auto& s : shapes) {
    const int C = s[0], OC = s[1];
    auto fill = [](std::vector<float>& v, std::uint64_t stream) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(loom::random_uniform(3, stream, i) - 0.5);
    };
    std::vector<float> x(std::size_t(N) * C), w(std::size_t(OC) * C), dy(std::size_t(N) * OC);
    fill(x, 0), fill(w, 1), fill(dy, 2);
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size(), 0.0f);
    std::vector<bf16> xh(x.begin(), x.end()), wh(w.begin(), w.end()), dyh(dy.begin(), dy.end());
    std::vector<bf16> yh(y.size()), dxh(dx.size());
    const double flops = 2.0 * N * C * OC;
    auto rate = [&](auto&& f) { return flops / (cpu_clock ? best_cpu_seconds(reps, f) : best_seconds(reps, f)) / 1e9; };
    struct row { const char* name; double f32, b16, fb, fd, fm; };
    const gemm_impl hi = fast ? gemm_impl::avx512_bf16 : gemm_impl::fp32_convert;
    auto fwd = [&](gemm_impl impl) {  // y (N,OC) = x (N,C) W (OC,C)^T
      return rate([&] { cpu::detail::gemm<bf16, bf16>(impl, false, true, N, OC, C, 1.f, xh.data(), C, wh.data(), C, 0.f, yh.data(), OC); });
    };
    auto bwd_data = [&](gemm_impl impl) {  // dx (N,C) = dy (N,OC) W (OC,C)
      return rate([&] { cpu::detail::gemm<bf16, bf16>(impl, false, false, N, C, OC, 1.f, dyh.data(), OC, wh.data(), C, 0.f, dxh.data(), C); });
    };
    auto bwd_weight = [&](gemm_impl impl) {  // dW (OC,C) += dy^T x, fp32 gradient buffer
      return rate([&] { cpu::detail::gemm<bf16, float>(impl, true, false, OC, C, N, 1.f, dyh.data(), OC, xh.data(), C, 1.f, dw.data(), C); });
    };
    // The same three products through the matmul primitive: one untimed call creates it.
    auto matmul = [&](auto&& f) { return dnnl ? (f(), rate(f)) : 0.0; };
    const double fm[3] = {
        matmul([&] { cpu::detail::gemm<bf16, bf16>(cache, false, true, N, OC, C, 1.f, xh.data(), C, wh.data(), C, 0.f, yh.data(), OC); }),
        matmul([&] { cpu::detail::gemm<bf16, bf16>(cache, false, false, N, C, OC, 1.f, dyh.data(), OC, wh.data(), C, 0.f, dxh.data(), C); }),
        matmul([&] { cpu::detail::gemm<bf16, float>(cache, true, false, OC, C, N, 1.f, dyh.data(), OC, xh.data(), C, 1.f, dw.data(), C); })};
    row rows[3] = {
        {"y = x W^T", rate([&] { cpu::gemm(false, true, N, OC, C, 1.f, x.data(), C, w.data(), C, 0.f, y.data(), OC); }),
         fwd(hi), fwd(gemm_impl::fp32_convert), dnnl ? fwd(gemm_impl::onednn) : 0.0, fm[0]},
        {"dx = dy W", rate([&] { cpu::gemm(false, false, N, C, OC, 1.f, dy.data(), OC, w.data(), C, 0.f, dx.data(), C); }),
         bwd_data(hi), bwd_data(gemm_impl::fp32_convert), dnnl ? bwd_data(gemm_impl::onednn) : 0.0, fm[1]},
        {"dW += dy^T x", rate([&] { cpu::gemm(true, false, OC, C, N, 1.f, dy.data(), OC, x.data(), C, 1.f, dw.data(), C); }),
         bwd_weight(hi), bwd_weight(gemm_impl::fp32_convert), dnnl ? bwd_weight(gemm_impl::onednn) : 0.0, fm[2]},
    };
    fastest += "\n  " + std::to_string(N) + " x " + std::to_string(C) + " -> " + std::to_string(OC) + ":";
    for (const auto& r : rows) {
      std::printf("| %5d x %4d -> %5d      | %-12s | %12.1f | %14.1f | %11.2f | %14.1f | %15.1f | %18.1f |\n", N, C, OC,
                  r.name, r.f32, r.b16, r.b16 / r.f32, r.fb, r.fd, r.fm);
      const std::pair<double, const char*> all[] = {{r.f32, "fp32"}, {r.b16, fast ? "bf16 VDPBF16PS" : "bf16 fallback"},
                                                    {r.fb, "bf16 via Eigen"}, {r.fd, "bf16 via oneDNN sgemm"},
                                                    {r.fm, "bf16 oneDNN matmul"}};
      const auto& best = *std::max_element(std::begin(all), std::end(all),
                                           [](const auto& p, const auto& q) { return p.first < q.first; });
      fastest += std::string(" ") + r.name + " -> " + best.second + ";";
      sum_ratio_log += std::log(r.b16 / r.f32);
      ++n_ratio;
    }
  }
  std::printf("geometric mean bf16 / fp32 over the %d products: %.2f\n", n_ratio, std::exp(sum_ratio_log / n_ratio));
  std::printf("fastest per product:%s\n", fastest.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::string table = "all", clock = "wall";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--table") table = argv[i + 1];
    if (std::string(argv[i]) == "--clock") clock = argv[i + 1];
  }
  if (table == "bf16") {
    bf16_table(reps, clock == "cpu");
    return 0;
  }
  auto timed = [&](int r, auto&& f) { return clock == "cpu" ? best_cpu_seconds(r, f) : best_seconds(r, f); };
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OPENBLAS_CORETYPE=%s | best of %d | %s\n", ct ? ct : "(unset)", reps,
              clock == "cpu" ? "GFLOP per process CPU-second" : "GFLOP/s (wall)");
  namespace cpu = loom::kernels::cpu;
  std::printf("kernels::cpu::gemm automatic: fp32 -> %s, bf16 -> %s\n",
              cpu::detail::gemm_impl_name(cpu::detail::gemm_default_impl<float>()),
              cpu::detail::gemm_impl_name(cpu::detail::gemm_default_impl<Eigen::bfloat16>()));
  std::printf("fp32 linear layers with a context (train::trainer): %s\n",
              cpu::detail::linear_uses_onednn_matmul<float>() ? "oneDNN matmul primitive" : "kernels::cpu::gemm automatic");
  std::printf("| shape (N x C -> OC)      | product      | Eigen (loom) | oneDNN sgemm | oneDNN matmul | matmul / sgemm | OpenBLAS | OpenBLAS / Eigen |\n");
  std::printf("|--------------------------|--------------|--------------|--------------|---------------|----------------|----------|------------------|\n");
  cpu::detail::onednn_matmul_cache fp32_cache;
  const int shapes[][3] = {{2048, 192, 576}, {2048, 192, 768}, {2048, 768, 192}, {2048, 192, 256},
                           {2048, 384, 1152}, {2048, 384, 1536}, {2048, 1536, 384}, {2048, 384, 8192}};
  for (const auto& s : shapes) {
    const int N = s[0], C = s[1], OC = s[2];
    std::vector<float> x(std::size_t(N) * C), w(std::size_t(OC) * C), y(std::size_t(N) * OC), dx(x.size()), dw(w.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(loom::random_uniform(1, 0, i) - 0.5);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(loom::random_uniform(1, 1, i) - 0.5);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = float(loom::random_uniform(1, 2, i) - 0.5);
    const double flops = 2.0 * N * C * OC;
    struct row { const char* name; double eigen, blas, dnnl = 0, matmul = 0; };
    std::vector<row> rows;
    // forward: y = x w^T
    rows.push_back({"y = x w^T",
                    flops / timed(reps, [&] { loom::kernels::cpu::map<float>(y.data(), N, OC).noalias() =
                                                         loom::kernels::cpu::cmap<float>(x.data(), N, C) * loom::kernels::cpu::cmap<float>(w.data(), OC, C).transpose(); }),
                    0});
    // backward: dx = dy w ; dw += dy^T x
    rows.push_back({"dx = dy w",
                    flops / timed(reps, [&] { loom::kernels::cpu::cmap<float> dy(y.data(), N, OC);
                                                     loom::kernels::cpu::map<float>(dx.data(), N, C).noalias() = dy * loom::kernels::cpu::cmap<float>(w.data(), OC, C); }),
                    0});
    rows.push_back({"dw += dy^T x",
                    flops / timed(reps, [&] { loom::kernels::cpu::cmap<float> dy(y.data(), N, OC);
                                                     loom::kernels::cpu::map<float>(dw.data(), OC, C).noalias() += dy.transpose() * loom::kernels::cpu::cmap<float>(x.data(), N, C); }),
                    0});
    if (cpu::detail::gemm_has_onednn) {
      using cpu::detail::gemm_impl;
      rows[0].dnnl = flops / timed(reps, [&] { cpu::detail::gemm<float, float>(gemm_impl::onednn, false, true, N, OC, C, 1.f, x.data(), C, w.data(), C, 0.f, y.data(), OC); });
      rows[1].dnnl = flops / timed(reps, [&] { cpu::detail::gemm<float, float>(gemm_impl::onednn, false, false, N, C, OC, 1.f, y.data(), OC, w.data(), C, 0.f, dx.data(), C); });
      rows[2].dnnl = flops / timed(reps, [&] { cpu::detail::gemm<float, float>(gemm_impl::onednn, true, false, OC, C, N, 1.f, y.data(), OC, x.data(), C, 1.f, dw.data(), C); });
      auto& mc = fp32_cache;  // the first run also creates the primitive: the best of the runs excludes it
      rows[0].matmul = flops / timed(reps, [&] { cpu::detail::gemm<float, float>(mc, false, true, N, OC, C, 1.f, x.data(), C, w.data(), C, 0.f, y.data(), OC); });
      rows[1].matmul = flops / timed(reps, [&] { cpu::detail::gemm<float, float>(mc, false, false, N, C, OC, 1.f, y.data(), OC, w.data(), C, 0.f, dx.data(), C); });
      rows[2].matmul = flops / timed(reps, [&] { cpu::detail::gemm<float, float>(mc, true, false, OC, C, N, 1.f, y.data(), OC, x.data(), C, 1.f, dw.data(), C); });
    }
#if LOOM_BENCH_CBLAS
    rows[0].blas = flops / timed(reps, [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.f, x.data(), C, w.data(), C, 0.f, y.data(), OC); });
    rows[1].blas = flops / timed(reps, [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.f, y.data(), OC, w.data(), C, 0.f, dx.data(), C); });
    rows[2].blas = flops / timed(reps, [&] { cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.f, y.data(), OC, x.data(), C, 1.f, dw.data(), C); });
#endif
    for (const auto& r : rows)
      std::printf("| %5d x %4d -> %5d      | %-12s | %12.1f | %12.1f | %13.1f | %14.2f | %8.1f | %16.2f |\n", N, C, OC,
                  r.name, r.eigen / 1e9, r.dnnl / 1e9, r.matmul / 1e9, r.dnnl > 0 ? r.matmul / r.dnnl : 0.0, r.blas / 1e9,
                  r.blas / r.eigen);
  }
#if !LOOM_BENCH_CBLAS
  std::printf("(built without cblas.h: OpenBLAS column is empty)\n");
#endif
  if (table == "all") bf16_table(reps, clock == "cpu");
}
