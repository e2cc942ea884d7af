// bench_memory: the memory plan (train::session_instance::plan) against the process's measured
// peak resident memory, one layout per fresh process, as a table:
//
//   build/bench/bench_memory                      # the layouts below, a markdown table
//   build/bench/bench_memory --quick --check 0.05 # CTest's bench_memory_check: exit 1 when a
//                                                 # row is outside the bound
//
// Each row runs in a new process (this program re-executed with --one), so its peak is its own:
// after OpenMP's threads have started and the data are made, the baseline is the resident set
// (VmRSS: the program, its libraries, the thread pool); the peak is VmHWM after steps 1..3 on
// every rank (threads of the process, as train_gpt --ranks runs them), with the micro-batch at
// the compiled capacity so that every activation page is touched. "plan" is the sum over the
// process's ranks of train::trainer::plan: parameters, gradients, master weights, moments,
// activation tables, data-parallel buckets. The check: plan x (1 - tol) <= peak - baseline <=
// plan x (1 + tol) + overhead, the overhead (--overhead-mib, 64 by default) being the runtime's
// own heap beyond the tables: Eigen's GEMM packing buffers, the ranks' pinned input copies and
// loss arrays, the step's windows, allocator slack.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/device/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/session.hpp>

namespace {

namespace lt = loom::train;

/// A row: the instance and its run-time settings.
struct row {
  std::string model, precision, layout;
  int ranks = 1, accum = 1;
  bool zero1 = false;
  std::string recompute = "none";
};

const std::vector<row> quick_rows = {
    {"quickstart", "fp32", "tp1pp1", 1, 2},
    {"quickstart", "bf16", "tp1pp1", 1, 2, false, "full"},
    {"quickstart", "fp32", "tp2pp2", 4, 4},
    {"quickstart_bpe", "fp32", "tp1pp1", 2, 1, true},
};
const std::vector<row> all_rows = {
    {"quickstart", "fp32", "tp1pp1", 1, 2},
    {"quickstart", "bf16", "tp1pp1", 1, 2},
    {"quickstart", "fp16", "tp1pp1", 1, 2},
    {"quickstart", "bf16", "tp1pp1", 1, 2, false, "selective"},
    {"quickstart", "bf16", "tp1pp1", 1, 2, false, "full"},
    {"quickstart", "fp32", "tp2pp2", 4, 4},
    {"quickstart", "bf16", "tp2pp2", 4, 4},
    {"quickstart_bpe", "fp32", "tp1pp1", 2, 1},
    {"quickstart_bpe", "fp32", "tp1pp1", 2, 1, true},
    {"quickstart_bpe", "fp32", "tp2pp1", 4, 2, true},
    {"quickstart_bpe", "fp32", "tp1pp2", 2, 4},
    {"llama_quickstart", "bf16", "tp1pp1", 1, 2},
    {"llama_quickstart", "fp32", "tp2pp2", 4, 4},
    {"gpt2_small", "fp32", "tp1pp1", 1, 1},
    {"gpt2_small", "bf16", "tp1pp1", 1, 1, false, "full"},
};

/// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
std::size_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string k;
  std::size_t kib = 0;
  while (f >> k) {
    if (k == std::string(key) + ":") {
      f >> kib;
      return kib * 1024;
    }
    f.ignore(1 << 12, '\n');
  }
  return 0;
}

/// Runs one row in this process; prints "plan <bytes> baseline <bytes> peak <bytes>".
int run_one(const row& w) {
  using namespace loom;
  const auto tp = std::stoi(w.layout.substr(2, w.layout.find("pp") - 2)), pp = std::stoi(w.layout.substr(w.layout.find("pp") + 2));
  const auto* inst = lt::find_session(lt::compiled_sessions(), w.model, w.precision, tp, pp, "cpu", "fused");
  if (!inst) {
    std::fprintf(stderr, "bench_memory: %s %s %s is not compiled\n", w.model.c_str(), w.precision.c_str(), w.layout.c_str());
    return 2;
  }
  lt::session_args a;
  a.cfg.grad_accum = w.accum;
  a.cfg.schedule = {1e-4, 1e-5, 0, 100};
  a.cfg.recompute = w.recompute == "full" ? nn::recompute::full
                    : w.recompute == "selective" ? nn::recompute::selective : nn::recompute::none;
  a.ddp.zero1 = w.zero1;
  const int dp = w.ranks / (tp * pp);
  const std::size_t windows = std::size_t(inst->micro_batch) * w.accum * (inst->seq_len + 1);
  std::vector<std::vector<std::int32_t>> data(static_cast<std::size_t>(dp));
  for (int d = 0; d < dp; ++d) {
    std::mt19937 gen(std::uint32_t(d + 1));
    std::uniform_int_distribution<std::int32_t> id(0, 200);
    for (std::size_t k = 0; k < windows; ++k) data[std::size_t(d)].push_back(id(gen));
  }
#ifdef _OPENMP
  const int threads = std::max(1, omp_get_max_threads() / w.ranks);
#pragma omp parallel
  { (void)omp_get_thread_num(); }  // the pool's threads exist in the baseline
#endif
  const std::size_t baseline = status_bytes("VmRSS");
  std::size_t plan = 0;
  std::mutex mu;
  auto rank = [&](lt::world_ref world, int world_rank) {
    auto s = inst->make(a, world);
    const auto r = s->rank();
    for (int step = 0; step < 3; ++step) s->step(data[std::size_t(r.dp_rank)]);
    const auto p = inst->plan(a, w.ranks, r.dp_rank, r.stage);
    std::lock_guard lock(mu);
    plan += p.total();
    (void)world_rank;
  };
  if (w.ranks == 1 && tp * pp == 1) {
    rank(lt::world_ref::none(), 0);
  } else {
    comm::run_threads(w.ranks, [&](comm::threads& world) {
#ifdef _OPENMP
      omp_set_num_threads(threads);
#endif
      rank(lt::world_ref::of(world), world.rank());
      world.barrier();  // every rank's peak before any rank frees its session
    });
  }
  std::printf("plan %zu baseline %zu peak %zu\n", plan, baseline, status_bytes("VmHWM"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();  // as train_gpt runs
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 8 && args[0] == "--one")
    return run_one({args[1], args[2], args[3], std::stoi(args[4]), std::stoi(args[5]), args[6] == "1", args[7]});
  bool quick = false;
  double tol = -1, overhead_mib = 64;
  for (std::size_t k = 0; k < args.size(); ++k) {
    if (args[k] == "--quick") quick = true;
    else if (args[k] == "--check" && k + 1 < args.size()) tol = std::stod(args[++k]);
    else if (args[k] == "--overhead-mib" && k + 1 < args.size()) overhead_mib = std::stod(args[++k]);
    else {
      std::fprintf(stderr, "usage: bench_memory [--quick] [--check TOLERANCE] [--overhead-mib MIB]\n");
      return 2;
    }
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();  // popen runs a shell
  std::printf("| instance | ranks | settings | plan (MiB, all ranks) | baseline RSS | peak RSS | peak - baseline | "
              "(peak - baseline) / plan |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  int bad = 0;
  for (const auto& w : quick ? quick_rows : all_rows) {
    const std::string cmd = "'" + self + "' --one " + w.model + " " + w.precision + " " + w.layout + " " +
                            std::to_string(w.ranks) + " " + std::to_string(w.accum) + " " + (w.zero1 ? "1" : "0") + " " +
                            w.recompute;
    FILE* p = popen(cmd.c_str(), "r");
    std::size_t plan = 0, base = 0, peak = 0;
    const int got = p ? std::fscanf(p, "plan %zu baseline %zu peak %zu", &plan, &base, &peak) : 0;
    const int status = p ? pclose(p) : -1;
    if (got != 3 || status != 0) {
      std::printf("| %s %s %s | %d | failed (exit %d) | | | | | |\n", w.model.c_str(), w.precision.c_str(),
                  w.layout.c_str(), w.ranks, status);
      ++bad;
      continue;
    }
    const double mib = 1048576.0, grown = double(peak) - double(base), ratio = grown / double(plan);
    const bool ok = tol < 0 || (grown >= double(plan) * (1 - tol) && grown <= double(plan) * (1 + tol) + overhead_mib * mib);
    bad += ok ? 0 : 1;
    std::printf("| %s %s %s | %d | accum %d%s, recompute %s | %.1f | %.1f | %.1f | %.1f | %.3f%s |\n", w.model.c_str(),
                w.precision.c_str(), w.layout.c_str(), w.ranks, w.accum, w.zero1 ? ", ZeRO-1" : "",
                w.recompute.c_str(), plan / mib, base / mib, peak / mib, grown / mib, ratio, ok ? "" : " OUT OF BOUND");
  }
  if (tol >= 0)
    std::printf("check: plan x (1 -/+ %.2f) + %.0f MiB overhead: %s\n", tol, overhead_mib, bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}
