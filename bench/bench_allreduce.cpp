// All-reduce bandwidth of comm::threads against the machine's memcpy bandwidth and a naive
// gather-to-rank-0 all-reduce, for float32 buffers on 2 and 4 ranks.
//
//   bench_allreduce [max_mib]        (default 64; sizes 4 KiB, 1, 16, 64 MiB up to max_mib)
//
// Columns (nccl-tests conventions):
//   time     best of 5 repetitions, per operation, measured on rank 0 between barriers
//   algbw    bytes / time                          (bytes = element count * 4, one rank's buffer)
//   busbw    algbw * 2(n-1)/n                      (the traffic a ring puts on each link)
//   %memcpy  busbw / single-thread memcpy bandwidth of the same size, measured in the same run
// Algorithms:
//   threads  comm::threads::all_reduce: fused reduce-scatter + all-gather over shared memory
//   bf16     the same element count as Eigen::bfloat16 (fp32 accumulation); bytes = count * 2
//   naive    reduce to rank 0 + broadcast in shared memory: rank 0 sums all buffers in place, the
//            others copy its result (3 barriers, no extra copies): the algorithm to beat
// Numbers depend on the load of the machine: on a shared 2-core box, 4 ranks are oversubscribed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <loom/parallel/comm_threads.hpp>

namespace {

using clock_type = std::chrono::steady_clock;
namespace comm = loom::comm;
using loom::parallel::reduce_op;

/// Buffer pointers the naive algorithm shares between ranks (they are threads of this process).
struct naive_shared {
  std::vector<float*> buffers;
};

int iterations_for(std::size_t bytes) {
  // ~256 MiB of payload per repetition, at least 3 and at most 2000 operations
  const std::size_t it = (std::size_t{256} << 20) / std::max<std::size_t>(bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(it, 3, 2000));
}

double best_memcpy(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const int iters = iterations_for(bytes);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");  // keep the copy
    }
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count() / iters);
  }
  return best;
}

/// Runs op(comm, buffer, shared) `iters` times per repetition on n ranks; returns the best time
/// per op seen by rank 0.
template <class T, class Op>
double time_collective(int n, std::size_t count, Op op) {
  const int iters = iterations_for(count * sizeof(T));
  double best = 1e30;
  naive_shared shared{std::vector<float*>(static_cast<std::size_t>(n))};
  comm::run_threads(n, [&](comm::threads& c) {
    std::vector<T> x(count, static_cast<T>(1.0f / 64));  // first touch by the owning rank
    op(c, x, shared);  // warm-up
    for (int rep = 0; rep < 5; ++rep) {
      c.barrier();
      const auto t0 = clock_type::now();
      for (int i = 0; i < iters; ++i) op(c, x, shared);
      c.barrier();
      const double t = std::chrono::duration<double>(clock_type::now() - t0).count() / iters;
      if (c.rank() == 0) best = std::min(best, t);
    }
  });
  return best;
}

/// Reduce to rank 0 + broadcast, in shared memory: after a barrier rank 0 adds every other
/// rank's buffer into its own, in rank order, reading them in place; after a second barrier every
/// other rank copies rank 0's result; a third barrier ends the operation. No extra copies, so
/// the only difference to comm::threads is who does the work: one rank instead of all.
void naive_all_reduce(comm::threads& c, std::vector<float>& x, naive_shared& shared) {
  shared.buffers[static_cast<std::size_t>(c.rank())] = x.data();
  c.barrier();
  if (c.rank() == 0)
    for (int j = 1; j < c.size(); ++j) {
      const float* other = shared.buffers[static_cast<std::size_t>(j)];
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += other[i];
    }
  c.barrier();
  if (c.rank() != 0) std::memcpy(x.data(), shared.buffers[0], x.size() * sizeof(float));
  c.barrier();
}

void print_row(const char* algo, int n, std::size_t bytes, double seconds, double memcpy_gbs) {
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  const double busbw = algbw * 2.0 * (n - 1) / n;
  std::printf("%-8s %5d %10.3f %12.1f %9.2f %9.2f", algo, n, static_cast<double>(bytes) / (1 << 20), seconds * 1e6,
              algbw, busbw);
  if (memcpy_gbs > 0) std::printf(" %8.0f%%\n", 100.0 * busbw / memcpy_gbs);
  else std::printf(" %9s\n", "-");
}

}  // namespace

int main(int argc, char** argv) {
  const double max_mib = argc > 1 ? std::atof(argv[1]) : 64.0;
  std::vector<std::size_t> sizes;
  for (std::size_t b : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20})
    if (static_cast<double>(b) <= max_mib * (1 << 20)) sizes.push_back(b);

  std::printf("comm::threads all-reduce, float32 (hardware threads: %u)\n\n", std::thread::hardware_concurrency());
  std::printf("%-8s %5s %10s %12s %9s %9s %9s\n", "algo", "ranks", "MiB", "time [us]", "algbw", "busbw", "%memcpy");
  std::printf("%-8s %5s %10s %12s %9s %9s %9s\n", "", "", "", "", "[GB/s]", "[GB/s]", "");
  for (std::size_t bytes : sizes) {
    const double memcpy_s = best_memcpy(bytes);
    const double memcpy_gbs = static_cast<double>(bytes) / memcpy_s / 1e9;
    std::printf("%-8s %5s %10.3f %12.1f %9.2f %9s %9s\n", "memcpy", "-", static_cast<double>(bytes) / (1 << 20),
                memcpy_s * 1e6, memcpy_gbs, "-", "-");
    const std::size_t count = bytes / sizeof(float);
    for (int n : {2, 4}) {
      const double t = time_collective<float>(n, count, [](comm::threads& c, std::vector<float>& x, naive_shared&) {
        c.all_reduce(std::span{x}, reduce_op::sum);
      });
      print_row("threads", n, bytes, t, memcpy_gbs);
      const double tb = time_collective<Eigen::bfloat16>(
          n, count, [](comm::threads& c, std::vector<Eigen::bfloat16>& x, naive_shared&) {
            c.all_reduce(std::span{x}, reduce_op::sum);
          });
      print_row("bf16", n, count * sizeof(Eigen::bfloat16), tb, 0.0);
      const double tn = time_collective<float>(n, count, naive_all_reduce);
      print_row("naive", n, bytes, tn, memcpy_gbs);
    }
    std::printf("\n");
  }
  return 0;
}
