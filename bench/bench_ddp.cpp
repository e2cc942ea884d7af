// bench_ddp — data-parallel training step time with the bucket all-reduces overlapped with
// backward (the default) and serialised (--no-overlap in train_gpt), on comm::threads ranks.
// Prints, per configuration, the median step, backward and exposed-communication times of rank 0
// and the time of the step's all-reduces alone (the same buckets, no compute), so that
//   hidden = (step without overlap) - (step with overlap)
// can be read against the communication there is to hide.
//
//   build/bench/bench_ddp [--ranks N] [--steps S] [--bucket-mb X]
//
// OpenMP threads are split between the ranks (cores / N each), as train_gpt --ranks does.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/trainer.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <class M>
constexpr std::size_t parameters_of() {
  return loom::models::param_offsets<M, loom::parallel::ddp>().back();
}

struct result {
  double step_ms = 0, backward_ms = 0, exposed_ms = 0, comm_ms = 0;
  std::size_t buckets = 0;
};

template <class M, int B, int T>
result run(int ranks, int steps, loom::parallel::ddp_options o) {
  using namespace loom;
  using P = policy<device::cpu, precision::fp32>;
  result res;
#ifdef _OPENMP
  const int threads = std::max(1, omp_get_max_threads() / ranks);
#endif
  comm::run_threads(ranks, [&](comm::threads& world) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    context<device::cpu> ctx;
    train::trainer_config cfg;
    cfg.schedule = {1e-3, 1e-4, 10, 1000};
    train::trainer<M, P, B, T> tr(ctx, cfg, world, o);
    std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 1 + world.rank(), 0, i));
    clock_type::time_point began;
    double backward = 0, exposed = 0;
    tr.on_phase = [&](train::phase p, bool begin) {
      if (begin) {
        began = clock_type::now();
        return;
      }
      const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - began).count();
      if (p == train::phase::backward) backward += ms;
      if (p == train::phase::exposed_comm) exposed += ms;
    };
    tr.step(ctx, w);  // warm-up: first touch, thread pools, progress thread
    std::vector<double> step_ms, bwd_ms, exp_ms;
    for (int s = 0; s < steps; ++s) {
      backward = exposed = 0;
      world.barrier();  // start together: a late rank's wait would count as communication
      const auto t0 = clock_type::now();
      tr.step(ctx, w);
      step_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
      bwd_ms.push_back(backward);
      exp_ms.push_back(exposed);
    }
    // the communication alone: one all-reduce per bucket, the same sizes, back to back
    std::vector<float> grads(parameters_of<M>());
    std::vector<double> comm_ms;
    for (int s = 0; s < steps; ++s) {
      world.barrier();
      const auto t0 = clock_type::now();
      world.all_reduce(std::span<float>(grads), parallel::reduce_op::sum);
      comm_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
    }
    if (world.rank() == 0) {
      res.step_ms = median(step_ms);
      res.backward_ms = median(bwd_ms);
      res.exposed_ms = median(exp_ms);
      res.comm_ms = median(comm_ms);
      res.buckets = tr.data_parallel()->bucket_count();
    }
  });
  return res;
}

template <class M, int B, int T>
void compare(int ranks, int steps, double bucket_mb) {
  loom::parallel::ddp_options on;
  on.bucket_mb = bucket_mb;
  auto off = on;
  off.overlap = false;
  const result a = run<M, B, T>(ranks, steps, on);
  const result b = run<M, B, T>(ranks, steps, off);
  std::printf("%-12s %2d ranks  B=%d T=%d  %zu params (%.1f MiB)  %zu buckets of <= %.2f MiB\n",
              std::string(M::name).c_str(), ranks, B, T, parameters_of<M>(), parameters_of<M>() * 4 / 1048576.0,
              a.buckets, bucket_mb);
  std::printf("  %-12s %10s %10s %12s\n", "overlap", "step ms", "backward", "exposed comm");
  std::printf("  %-12s %10.1f %10.1f %12.2f\n", "on", a.step_ms, a.backward_ms, a.exposed_ms);
  std::printf("  %-12s %10.1f %10.1f %12.2f\n", "off", b.step_ms, b.backward_ms, b.exposed_ms);
  std::printf("  all-reduce of the whole gradient alone: %.2f ms; step time saved by overlap: %.2f ms (%.0f%% of it)\n",
              a.comm_ms, b.step_ms - a.step_ms, a.comm_ms > 0 ? 100.0 * (b.step_ms - a.step_ms) / a.comm_ms : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, steps = 10;
  double bucket_mb = 1.0;
  CLI::App app{"bench_ddp: data-parallel step time with the bucket all-reduces overlapped with backward and "
               "serialised, on comm::threads ranks"};
  app.add_option("--ranks", ranks, "data-parallel ranks (threads)")->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps, "timed steps per configuration")->check(CLI::Range(1, 1000000));
  app.add_option("--bucket-mb", bucket_mb, "gradient bucket size in MiB (> 0)")
      ->check(CLI::Range(1e-6, 1e6));
  CLI11_PARSE(app, argc, argv);
  loom::device::configure_host_malloc_for_gemm();
  compare<loom::models::quickstart, 8, 128>(ranks, steps, bucket_mb);
  compare<loom::models::bench_small, 4, 256>(ranks, steps, bucket_mb);
  return 0;
}
