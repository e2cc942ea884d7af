// bench_pipeline: the measured pipeline bubble of 1F1B against (PP-1)/(M+PP-1).
//
// Runs nn::transformer<quickstart> with layout<1, PP> on comm::threads (one thread per stage, one
// OpenMP thread per stage) for PP in {2, 4} and M micro-batches in {1, 2, 4, 8, 16}, and prints
// per stage the idle fraction of a step: 1 - (forward + backward time) / step time, where the step
// time runs from a barrier before the first action to the stage's last action. The formula
// assumes equal stages; here the first stage also embeds and the last runs the LM head and the
// loss, so the last stage idles less than the others.
//
// Meaningful only when the machine has at least PP idle cores: stage threads that share a core
// are descheduled, which shows up as busy time and distorts both columns. Prints the core count
// and the load average at start. Usage: bench_pipeline [steps per configuration, default 3]
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

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/parallel/schedule.hpp>

namespace {

using namespace loom;
using M = models::quickstart;
constexpr int B = 4, T = 64;

struct stage_times {
  double step = 0, busy = 0, fwd = 0, bwd = 0;
  int nf = 0, nb = 0;
};

template <int PP>
std::vector<stage_times> run(int m, int steps) {
  using model_t = nn::transformer<M, policy<device::cpu, precision::fp32, layout<1, PP>>>;
  using acts_t = typename model_t::template activations<B, T>;
  std::vector<stage_times> out(PP);
  std::vector<std::int32_t> in(std::size_t(m) * B * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = std::int32_t(random_below(M::vocab, 1, 0, i));
    tg[i] = std::int32_t(random_below(M::vocab, 1, 1, i));
  }
  comm::run_threads(PP, [&](comm::threads& world) {
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    auto g = parallel::make_groups<layout<1, PP>>(world);
    context<device::cpu> ctx;
    model_t model(ctx, 0, g.pp.rank(), 1);
    std::vector<acts_t> ring;
    for (int i = 0; i < parallel::max_in_flight(PP, m, g.pp.rank()); ++i) ring.emplace_back(ctx);
    auto& st = out[std::size_t(g.pp.rank())];
    for (int s = 0; s <= steps; ++s) {  // step 0 warms up and is not counted
      stage_times now;
      auto observe = [&](const parallel::pipe_action& a, double sec) {
        if (a.op == parallel::pipe_op::forward) now.fwd += sec, ++now.nf;
        if (a.op == parallel::pipe_op::backward) now.bwd += sec, ++now.nb;
      };
      model.zero_grad(ctx);
      world.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      parallel::pipeline_forward_backward<model_t, B, T>(ctx, model, std::span<acts_t>(ring), g.tp, g.pp, m, in.data(),
                                                   tg.data(), B, T, 1.0f / float(in.size()), observe);
      now.step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s == 0) continue;
      st.step += now.step;
      st.fwd += now.fwd;
      st.bwd += now.bwd;
      st.nf += now.nf;
      st.nb += now.nb;
    }
    st.busy = st.fwd + st.bwd;
  });
  return out;
}

template <int PP>
void table(int steps) {
  for (int m : {1, 2, 4, 8, 16}) {
    const auto st = run<PP>(m, steps);
    for (int s = 0; s < PP; ++s) {
      const auto& x = st[std::size_t(s)];
      std::printf("%3d %4d %6d %10.2f %10.2f %10.3f %10.3f\n", PP, m, s, 1e3 * x.step / steps, 1e3 * x.busy / steps,
                  1.0 - x.busy / x.step, parallel::bubble_fraction(PP, m));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  std::string load = "?";
  if (std::ifstream f("/proc/loadavg"); f) std::getline(f, load);
  std::printf("bench_pipeline: model %s, micro-batch B=%d T=%d, layout<1,PP> on comm::threads, 1 OpenMP thread per "
              "stage\n",
              std::string(M::name).c_str(), B, T);
  std::printf("hardware threads %u, load average %s; meaningful only with >= PP idle cores\n",
              std::thread::hardware_concurrency(), load.c_str());
  std::printf("%3s %4s %6s %10s %10s %10s %10s\n", "PP", "M", "stage", "step ms", "busy ms", "idle",
              "(PP-1)/(M+PP-1)");
  table<2>(steps);
  table<4>(steps);
  return 0;
}
