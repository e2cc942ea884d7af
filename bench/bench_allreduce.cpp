// All-reduce bandwidth of loom's communicators beside their peers, in the same run:
//   bench_allreduce [max_mib]     comm::threads on 2 and 4 ranks beside memcpy and a naive
//                                 all-reduce (default 64; sizes 4 KiB, 1, 16, 64 MiB up to max_mib)
//   mpirun -np N bench_allreduce [max_mib]
//                                 comm::mpi beside a raw MPI_Allreduce on the same buffers, fp32
//                                 and bf16, sizes 1, 4, 16, 64 MiB (detected from Open MPI's or
//                                 PMI's environment; needs a build with loom::mpi)
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
//   mpi      comm::mpi::all_reduce (sum, in place); fp32 is MPI_Allreduce; bf16 is loom's ring of
//            MPI_Sendrecv (detail::mpi_ring_all_reduce): each rank's own values travel as bf16,
//            partial sums between hops as fp32 (none on 2 ranks), the owner adds in fp32 and
//            rounds once, the rounded bf16 segments are all-gathered; on 2 ranks it moves half the
//            bytes of the fp32 path and equals "sum in fp32, round once" bitwise
//   MPI      MPI_Allreduce(MPI_IN_PLACE, ..., MPI_FLOAT, MPI_SUM) on a duplicate of MPI_COMM_WORLD
//   MPI f32  (bf16 rows) the same on an fp32 buffer of the same element count: the peer with the
//            same arithmetic (fp32 sum, no rounding between hops), and what comm::mpi did for
//            bf16 before the ring (plus a widening and a narrowing pass)
//   MPI bf16 (bf16 rows) a user-defined MPI_Op on MPI_UINT16_T adding in fp32 and rounding every
//            partial sum to bf16: half the bytes, less accuracy (NCCL's way)
//   In MPI mode each repetition times every algorithm in turn (9 repetitions, interleaved); time
//   is the best, on the slowest rank; the last column is the median of the per-repetition bus
//   bandwidth ratios mpi/peer: on the mpi row against the first peer, on a peer's row against it.
// Numbers depend on the load of the machine: on a shared 2-core box, 4 ranks are oversubscribed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <loom/parallel/comm_threads.hpp>
#if defined(LOOM_WITH_MPI)
#include <loom/parallel/comm_mpi.hpp>
#endif

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

#if defined(LOOM_WITH_MPI)
/// inout[i] = bf16(float(in[i]) + float(inout[i])), round to nearest even (a raw MPI user op).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const std::uint32_t ua = std::uint32_t(a[i]) << 16, ub = std::uint32_t(b[i]) << 16;
    float fa, fb;
    std::memcpy(&fa, &ua, 4);
    std::memcpy(&fb, &ub, 4);
    const float sum = fa + fb;
    std::uint32_t u;
    std::memcpy(&u, &sum, 4);
    b[i] = std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

/// Seconds per operation of `iters` calls of op(), between barriers, on the slowest rank.
template <class Op>
double time_mpi(MPI_Comm c, int iters, Op op) {
  MPI_Barrier(c);
  const auto t0 = clock_type::now();
  for (int i = 0; i < iters; ++i) op();
  double t = std::chrono::duration<double>(clock_type::now() - t0).count() / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, c);
  return t;
}

/// Rows for one dtype and size: comm::mpi, then the raw MPI peers, interleaved per repetition.
/// The ratio column compares comm::mpi with the first peer (the same arithmetic).
template <class T>
void mpi_rows(comm::mpi& world, MPI_Comm raw, MPI_Op bf16_op, const char* dtype, std::size_t bytes) {
  const int n = world.size();
  const std::size_t count = bytes / sizeof(T);
  std::vector<T> x(count, static_cast<T>(1.0f / 64));
  std::vector<float> wide(std::is_same_v<T, float> ? 0 : count, 1.0f / 64);
  const int iters = iterations_for(bytes);
  struct peer {
    const char* name;
    std::function<void()> op;
    double best = 1e30;
    std::vector<double> ratio;
  };
  std::vector<peer> peers;
  peers.push_back({"mpi", [&] { world.all_reduce(std::span{x}, reduce_op::sum); }, 1e30, {}});
  if constexpr (std::is_same_v<T, float>) {
    peers.push_back({"MPI", [&] { MPI_Allreduce(MPI_IN_PLACE, x.data(), int(count), MPI_FLOAT, MPI_SUM, raw); }, 1e30, {}});
  } else {
    peers.push_back({"MPI f32", [&] { MPI_Allreduce(MPI_IN_PLACE, wide.data(), int(count), MPI_FLOAT, MPI_SUM, raw); }, 1e30, {}});
    peers.push_back({"MPI bf16", [&] { MPI_Allreduce(MPI_IN_PLACE, x.data(), int(count), MPI_UINT16_T, bf16_op, raw); }, 1e30, {}});
  }
  for (auto& p : peers) p.op();  // warm-up
  for (int rep = 0; rep < 9; ++rep) {
    std::vector<double> t;
    for (auto& p : peers) t.push_back(time_mpi(raw, iters, p.op));
    for (std::size_t i = 0; i < peers.size(); ++i) {
      peers[i].best = std::min(peers[i].best, t[i]);
      peers[i].ratio.push_back(i == 0 ? t[1] / t[0] : t[i] / t[0]);  // busbw of mpi over that of the peer
    }
  }
  if (world.rank() != 0) return;
  for (auto& p : peers) {
    std::sort(p.ratio.begin(), p.ratio.end());
    const double algbw = double(bytes) / p.best / 1e9;
    std::printf("%-9s %-5s %5d %8.3f %12.1f %9.2f %9.2f %9.2f\n", p.name, dtype, n, double(bytes) / (1 << 20),
                p.best * 1e6, algbw, algbw * 2.0 * (n - 1) / n, p.ratio[p.ratio.size() / 2]);
  }
}

int mpi_main(int argc, char** argv, double max_mib) {
  comm::mpi_environment env(&argc, &argv);
  comm::mpi world = env.world();
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  MPI_Op bf16_op = MPI_OP_NULL;
  MPI_Op_create(&bf16_sum, 1, &bf16_op);
  if (world.rank() == 0) {
    std::printf("comm::mpi vs raw MPI_Allreduce, %d ranks (hardware threads per node: %u)\n\n", world.size(),
                std::thread::hardware_concurrency());
    std::printf("%-9s %-5s %5s %8s %12s %9s %9s %9s\n", "algo", "dtype", "ranks", "MiB", "time [us]", "algbw", "busbw",
                "busbw vs");
    std::printf("%-9s %-5s %5s %8s %12s %9s %9s %9s\n", "", "", "", "", "", "[GB/s]", "[GB/s]", "mpi/peer");
  }
  for (std::size_t mib : {1, 4, 16, 64}) {
    if (double(mib) > max_mib) break;
    mpi_rows<float>(world, raw, bf16_op, "fp32", mib << 20);
    mpi_rows<Eigen::bfloat16>(world, raw, bf16_op, "bf16", mib << 20);
  }
  MPI_Op_free(&bf16_op);
  MPI_Comm_free(&raw);
  return 0;
}
#endif

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

}  // namespace

int main(int argc, char** argv) {
  const double max_mib = argc > 1 ? std::atof(argv[1]) : 64.0;
  if (launched_by_mpirun()) {
#if defined(LOOM_WITH_MPI)
    return mpi_main(argc, argv, max_mib);
#else
    std::fprintf(stderr, "bench_allreduce: launched by mpirun but built without loom::mpi; install Open MPI "
                         "(libopenmpi-dev) and reconfigure\n");
    return 2;
#endif
  }
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
