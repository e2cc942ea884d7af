// bench_matmul — the GEMMs of one training step: loom's Eigen kernel against OpenBLAS sgemm,
// at the shapes of the quickstart and of issue #2's comparison config, forward (N x C x OC)
// and the two backward products. Prints GFLOP/s and the OpenBLAS/Eigen ratio, measured in one
// run, and the OPENBLAS_CORETYPE it ran under (Haswell on these machines: AVX2 kernels at
// half speed; run `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/bench/bench_matmul`
// for OpenBLAS's own choice).
//
//   build/bench/bench_matmul [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
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

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  if (argc == 3 && std::string(argv[1]) == "--reps") reps = std::max(1, std::atoi(argv[2]));
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OPENBLAS_CORETYPE=%s | best of %d | GFLOP/s\n", ct ? ct : "(unset)", reps);
  std::printf("| shape (N x C -> OC)      | product      | Eigen (loom) | OpenBLAS | OpenBLAS / Eigen |\n");
  std::printf("|--------------------------|--------------|--------------|----------|------------------|\n");
  const int shapes[][3] = {{2048, 192, 576}, {2048, 192, 768}, {2048, 768, 192}, {2048, 192, 256},
                           {2048, 384, 1152}, {2048, 384, 1536}, {2048, 1536, 384}, {2048, 384, 8192}};
  for (const auto& s : shapes) {
    const int N = s[0], C = s[1], OC = s[2];
    std::vector<float> x(std::size_t(N) * C), w(std::size_t(OC) * C), y(std::size_t(N) * OC), dx(x.size()), dw(w.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(loom::random_uniform(1, 0, i) - 0.5);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(loom::random_uniform(1, 1, i) - 0.5);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = float(loom::random_uniform(1, 2, i) - 0.5);
    const double flops = 2.0 * N * C * OC;
    struct row { const char* name; double eigen, blas; };
    std::vector<row> rows;
    // forward: y = x w^T
    rows.push_back({"y = x w^T",
                    flops / best_seconds(reps, [&] { loom::kernels::cpu::matmul_forward(y.data(), x.data(), w.data(), (float*)nullptr, N, C, OC); }),
                    0});
    // backward: dx = dy w ; dw += dy^T x
    rows.push_back({"dx = dy w",
                    flops / best_seconds(reps, [&] { loom::kernels::cpu::cmap<float> dy(y.data(), N, OC);
                                                     loom::kernels::cpu::map<float>(dx.data(), N, C).noalias() = dy * loom::kernels::cpu::cmap<float>(w.data(), OC, C); }),
                    0});
    rows.push_back({"dw += dy^T x",
                    flops / best_seconds(reps, [&] { loom::kernels::cpu::cmap<float> dy(y.data(), N, OC);
                                                     loom::kernels::cpu::map<float>(dw.data(), OC, C).noalias() += dy.transpose() * loom::kernels::cpu::cmap<float>(x.data(), N, C); }),
                    0});
#if LOOM_BENCH_CBLAS
    rows[0].blas = flops / best_seconds(reps, [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.f, x.data(), C, w.data(), C, 0.f, y.data(), OC); });
    rows[1].blas = flops / best_seconds(reps, [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.f, y.data(), OC, w.data(), C, 0.f, dx.data(), C); });
    rows[2].blas = flops / best_seconds(reps, [&] { cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.f, y.data(), OC, x.data(), C, 1.f, dw.data(), C); });
#endif
    for (const auto& r : rows)
      std::printf("| %5d x %4d -> %5d      | %-12s | %12.1f | %8.1f | %16.2f |\n", N, C, OC, r.name, r.eigen / 1e9, r.blas / 1e9,
                  r.blas / r.eigen);
  }
#if !LOOM_BENCH_CBLAS
  std::printf("(built without cblas.h: OpenBLAS column is empty)\n");
#endif
}
