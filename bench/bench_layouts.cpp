// bench_layouts: step time, per-rank memory and pipeline bubble of train::trainer for
// each layout<TP, PP> (DP = 1, and a few with DP = 2 with and without ZeRO-1) on one model,
// threads backend (a table printer).
//
// Per layout: the median step time over the measured steps (after one warm-up step); per rank,
// from the actual buffers, parameters + gradients, AdamW moments and the activation ring, and
// the largest over ranks; "x TP*PP" = that largest params+grads+optimizer times TP*PP over the
// single-rank value (1.00 means exact 1/(TP*PP) scaling; above 1 is the replicated LayerNorms,
// position embedding and row-parallel biases under TP, and the wte/wpe rows every pipeline stage
// holds but only the first and last use — docs/tensor_pipeline.md). The bubble column is the
// measured idle fraction of the 1F1B pipeline (time in receive/send actions over the pipeline's
// wall time, mean over stages, via the trainer's on_phase hook) next to (PP-1)/(M+PP-1).
// DP = 2 rows: each replica runs M micro-batches; "AdamW x" = the largest rank's AdamW bytes times
// TP*PP*DP over the single-rank value (about DP without ZeRO-1: every replica holds its cell's
// moments; about 1.00 with ZeRO-1: 1/DP of them, up to the chunks' padding); "dp buf" = the
// ZeRO-1 engine's bucket buffers (about one gradient buffer: the reduce-scatter's input; the
// path without ZeRO-1 all-reduces the gradient buffer in place), counted in "x TP*PP".
//
// Meaningful only with TP*PP idle cores: ranks that share a core are descheduled, which shows up
// as longer steps and as busy time (so the bubble is underestimated). Prints the core count and
// the load average. OpenMP threads are split over the ranks (OMP_NUM_THREADS=1: one per rank, the
// fair comparison on a loaded machine, where a 2-thread OpenMP team is descheduled badly).
// Usage: bench_layouts [measured steps, default 3] [micro-batches M, default 4]
// The dp = 2 rows take 2*TP*PP ranks: their step times on this 2-core machine are not comparable.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/train/trainer.hpp>

namespace {

using namespace loom;
using M = models::bench_small;
constexpr int B = 2, T = 64;

struct rank_figures {
  std::size_t params_grads = 0, optimizer = 0, dp_buffers = 0, activations = 0;
  double pipeline = 0, transfers = 0;  // seconds over the measured steps
  std::vector<double> steps;           // seconds per measured step
};

template <int TP, int PP>
std::vector<rank_figures> run(int m, int steps, int dp, bool zero1) {
  using trainer_t = train::trainer<M, policy<device::cpu, precision::fp32, layout<TP, PP>>, B, T, comm::threads>;
  const int ranks = TP * PP * dp;
  std::vector<rank_figures> out(ranks);
#ifdef _OPENMP
  const int threads = std::max(1, omp_get_max_threads() / ranks);
#endif
  comm::run_threads(ranks, [&](comm::threads& world) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    context<device::cpu> ctx;
    train::trainer_config cfg;
    cfg.grad_accum = m;
    cfg.schedule = {1e-4, 1e-5, 0, 100};
    trainer_t tr(ctx, cfg, world, parallel::ddp_options{.zero1 = zero1});
    auto& f = out[std::size_t(world.rank())];
    f.params_grads = tr.model().parameters().bytes() + tr.model().gradients().bytes();
    f.optimizer = tr.optimizer_bytes();
    if (tr.data_parallel()) f.dp_buffers = tr.data_parallel()->memory().buckets;
    f.activations = tr.activation_bytes();
    const std::size_t actions = parallel::one_f_one_b(PP, m, tr.stage()).size();
    std::size_t opened = 0;
    bool measured = false;
    std::chrono::steady_clock::time_point began;
    tr.on_phase = [&](train::phase p, bool begin) {  // the first `actions` phases after h2d_copy: the pipeline
      if (p == train::phase::h2d_copy) {
        opened = 0;
        return;
      }
      if (begin) {
        began = std::chrono::steady_clock::now();
        ++opened;
        return;
      }
      if (opened > actions || !measured) return;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      f.pipeline += s;
      if (p == train::phase::exposed_comm) f.transfers += s;
    };
    std::vector<std::int32_t> windows(tr.windows_per_step() * tr.window());
    for (std::size_t i = 0; i < windows.size(); ++i) windows[i] = std::int32_t(random_below(M::vocab, 5, 0, i));
    for (int s = 0; s <= steps; ++s) {  // step 0 warms up and is not counted
      measured = s > 0;
      world.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      tr.step(ctx, windows);
      world.barrier();
      if (measured) f.steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  });
  return out;
}

double single_rank_state = 0;      // params+grads+optimizer bytes of layout<1,1>, set by the first row
double single_rank_optimizer = 0;  // its AdamW bytes

template <int TP, int PP>
void row(int m, int steps, int dp = 1, bool zero1 = false) {
  const auto r = run<TP, PP>(m, steps, dp, zero1);
  auto steps0 = r[0].steps;
  std::sort(steps0.begin(), steps0.end());
  std::size_t state = 0, acts = 0, pg = 0, opt = 0, buf = 0, most_opt = 0;
  double idle = 0;
  for (const auto& x : r) {
    const std::size_t mine = x.params_grads + x.optimizer + x.dp_buffers;
    if (mine > state) state = mine, pg = x.params_grads, opt = x.optimizer, buf = x.dp_buffers;
    acts = std::max(acts, x.activations);
    most_opt = std::max(most_opt, x.optimizer);
    idle += x.pipeline > 0 ? x.transfers / x.pipeline : 0;
  }
  idle /= double(r.size());
  if (TP * PP * dp == 1) single_rank_state = double(state), single_rank_optimizer = double(opt);
  std::printf("tp%dpp%d %3d %-6s %5d %10.0f %12.1f %10.1f %7.1f %12.1f %9.2f %8.2f %8.3f %10.3f\n", TP, PP, dp,
              zero1 ? "ZeRO-1" : "-", TP * PP * dp, 1e3 * steps0[steps0.size() / 2], pg / 1048576.0, opt / 1048576.0,
              buf / 1048576.0, acts / 1048576.0, double(state) * TP * PP / single_rank_state,
              double(most_opt) * TP * PP * dp / single_rank_optimizer, PP > 1 ? idle : 0.0,
              parallel::bubble_fraction(PP, m));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const int m = argc > 2 ? std::max(1, std::atoi(argv[2])) : 4;
  std::string load = "?";
  if (std::ifstream f("/proc/loadavg"); f) std::getline(f, load);
  std::printf("bench_layouts: model %s (%d layers, %d heads, width %d, vocab %d, %zu parameters), micro-batch B=%d "
              "T=%d, M=%d micro-batches per step (per replica), fp32, comm::threads, OpenMP threads per rank = max(1, %d / ranks)\n",
              std::string(M::name).c_str(), M::n_layer, M::n_head, M::d_model, M::vocab, models::parameter_count<M>(), B, T,
              m,
#ifdef _OPENMP
              omp_get_max_threads()
#else
              1
#endif
  );
  std::printf("hardware threads %u, load average %s; %d measured steps (median shown)\n",
              std::thread::hardware_concurrency(), load.c_str(), steps);
  std::printf("%-7s %3s %-6s %5s %10s %12s %10s %7s %12s %9s %8s %8s %10s\n", "layout", "dp", "zero", "ranks", "step ms",
              "params+grad", "AdamW", "dp buf", "activations", "x TP*PP", "AdamW x", "bubble", "(PP-1)/");
  std::printf("%-7s %3s %-6s %5s %10s %12s %10s %7s %12s %9s %8s %8s %10s\n", "", "", "", "", "", "MiB/rank", "MiB/rank",
              "MiB", "MiB/rank", "", "TPxPPxDP", "measured", "(M+PP-1)");
  row<1, 1>(m, steps);
  row<2, 1>(m, steps);
  row<1, 2>(m, steps);
  row<2, 2>(m, steps);
  row<1, 3>(m, steps);
  row<2, 1>(m, steps, 2, false);
  row<2, 1>(m, steps, 2, true);
  row<1, 2>(m, steps, 2, true);
  return 0;
}
