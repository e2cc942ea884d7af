// comm::hccl across processes: CTest runs this binary as `mpirun -np 2`, one emulated NPU per
// process (device 0 of each process's own emulation). The root info comes from HcclGetRootInfo on
// rank 0 and travels by MPI_Bcast (comm::hccl::create over comm::mpi); under an MPI launcher the
// emulation's HCCL moves data between the processes through POSIX shared memory
// (emulation/src/hccl.cpp, "Across processes"). The CTest sets LOOMEMU_HCCL_SHM_MB=1, so the
// larger messages below cross the 1 MB staging slots in several rounds. Covered: the collectives,
// send/recv and split; data parallelism, and tensor and pipeline parallelism (TP = 2, PP = 2),
// each against one rank; a hung peer.
#include <doctest/doctest.h>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/comm_mpi.hpp>
#include <loom/train/trainer.hpp>

#include "ascend/support.hpp"

using namespace loom_test;
using loom::parallel::reduce_op;

TEST_CASE("comm::hccl over processes (mpirun, root info by MPI_Bcast): collectives, send/recv, split") {
  loom::comm::mpi world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  loom::device::ascend_device dev(runtime(), 0);  // one NPU per process
  auto& ctx = dev.context();
  auto hc = loom::comm::hccl::create(world, ctx);
  REQUIRE(hc.size() == n);
  CHECK(hc.rank() == r);

  const std::size_t m = 600000;  // 2.4 MB of fp32: three rounds through 1 MB slots
  std::vector<float> mine(m);
  for (std::size_t i = 0; i < m; ++i) mine[i] = float(r + 1) * 0.5f + float(i % 1000) * 0.001f;
  auto x = upload<float>(ctx, mine);
  hc.all_reduce(std::span<float>(x.data(), m), reduce_op::sum);
  const auto sum = download(ctx, x.data(), m);
  bool ok = true;
  for (std::size_t i = 0; i < m; ++i) {
    double want = 0;
    for (int j = 0; j < n; ++j) want += double(float(j + 1) * 0.5f + float(i % 1000) * 0.001f);
    ok = ok && std::abs(sum[i] - want) <= 1e-5 * std::abs(want);
  }
  CHECK(ok);

  // all_gather of each rank's id block, reduce_scatter of ones (chunked: n parts per element)
  const std::size_t k = 300000;
  auto part = upload<std::int32_t>(ctx, std::vector<std::int32_t>(k, r + 10));
  dbuf<std::int32_t> all(k * std::size_t(n), ctx.stream);
  hc.all_gather(std::span<const std::int32_t>(part.data(), k), std::span<std::int32_t>(all.data(), all.size()));
  std::vector<std::int32_t> got(all.size());
  npu::copy_to_host(got.data(), all.data(), got.size() * sizeof(std::int32_t), ctx.stream);
  ctx.synchronize();
  for (int j = 0; j < n; ++j) CHECK(got[std::size_t(j) * k + k / 2] == j + 10);
  auto ones = upload<float>(ctx, std::vector<float>(k * std::size_t(n), 1.0f));
  dbuf<float> mine_sum(k, ctx.stream);
  hc.reduce_scatter(std::span<const float>(ones.data(), ones.size()), std::span<float>(mine_sum.data(), k));
  const auto rs = download(ctx, mine_sum.data(), k);
  CHECK(rs.front() == float(n));
  CHECK(rs.back() == float(n));

  // broadcast from the last rank; a send/recv ring (even ranks send first: HCCL pairs them)
  auto b = upload<float>(ctx, std::vector<float>(5, float(r)));
  hc.broadcast(std::span<float>(b.data(), 5), n - 1);
  CHECK(download(ctx, b.data(), 5) == std::vector<float>(5, float(n - 1)));
  const std::size_t pm = 400000;  // two rounds
  auto payload = upload<float>(ctx, std::vector<float>(pm, float(r) + 0.25f));
  dbuf<float> in(pm, ctx.stream);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    hc.send(std::span<const float>(payload.data(), pm), next, 0);
    hc.recv(std::span<float>(in.data(), pm), prev, 0);
  } else {
    hc.recv(std::span<float>(in.data(), pm), prev, 0);
    hc.send(std::span<const float>(payload.data(), pm), next, 0);
  }
  const auto rcv = download(ctx, in.data(), pm);
  CHECK(rcv.front() == float(prev) + 0.25f);
  CHECK(rcv.back() == float(prev) + 0.25f);
  hc.barrier();

  // a sub-communicator of every rank (its own segment), as the trainer's groups are made
  auto sub = hc.split(0, r, "all");
  auto one = upload<float>(ctx, std::vector<float>(3, 1.0f));
  sub.all_reduce(std::span<float>(one.data(), 3), reduce_op::sum);
  CHECK(download(ctx, one.data(), 3) == std::vector<float>(3, float(n)));
}

TEST_CASE("data parallel over processes: trainer<tiny> on comm::hccl equals one ascend rank") {
  using M = loom::models::tiny;
  constexpr int rows = 4, T = 9, steps = 2;
  using trainer_t = loom::train::trainer<M, loom::policy<npu, loom::precision::fp32_ascend_matmul>, rows, T,
                                         loom::parallel::local_group,
                                         loom::kernels::fused>;
  loom::comm::mpi world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  REQUIRE(rows % n == 0);
  const int mine = rows / n;
  auto config = [](int micro) {
    loom::train::trainer_config c;
    c.micro_batch = micro;
    c.seq_len = T;
    c.schedule = {3e-3, 3e-4, 1, 10};
    c.seed = 5;
    return c;
  };
  auto batch = [](int s) {
    std::vector<std::int32_t> w(std::size_t(rows) * (T + 1));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t((i * 29 + std::size_t(s) * 7 + 3) % M::vocab);
    return w;
  };
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  std::vector<double> one, dp;
  {
    trainer_t tr(ctx, config(rows));
    for (int s = 0; s < steps; ++s) one.push_back(tr.step(ctx, batch(s)).loss);
  }
  auto hc = loom::comm::hccl::create(world, ctx);
  trainer_t tr(ctx, config(mine), hc);
  for (int s = 0; s < steps; ++s) {
    const auto w = batch(s);
    const std::size_t per = std::size_t(mine) * (T + 1);
    dp.push_back(tr.step(ctx, std::span<const std::int32_t>(w).subspan(std::size_t(r) * per, per)).loss);
  }
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(dp[std::size_t(s)] == doctest::Approx(one[std::size_t(s)]).epsilon(1e-5));
  }
  MESSAGE("DP=" << n << " over processes: losses " << dp[0] << " " << dp[1] << " vs one rank " << one[0] << " " << one[1]);
}

namespace {
/// layout<TP, PP> over the processes of MPI_COMM_WORLD (TP*PP of them) on comm::hccl: the loss
/// curve of tiny_parallel, and one ascend rank's on the same global batch.
template <int TP, int PP>
void layout_over_processes() {
  using MP = loom::models::tiny_parallel;
  constexpr int B = 2, T = 8, windows = 4, steps = 2;
  using policy = loom::policy<npu, loom::precision::fp32_ascend_matmul, loom::layout<TP, PP>>;
  loom::comm::mpi world(MPI_COMM_WORLD);
  REQUIRE(world.size() == TP * PP);
  auto config = [](int accum) {
    loom::train::trainer_config c;
    c.micro_batch = B;
    c.seq_len = T;
    c.grad_accum = accum;
    c.schedule = {3e-3, 3e-4, 1, 8};
    c.seed = 31;
    return c;
  };
  auto batch = [](int s) {
    std::vector<std::int32_t> w(std::size_t(windows) * (T + 1));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t((i * 37 + std::size_t(s) * 11 + 5) % MP::vocab);
    return w;
  };
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  std::vector<double> one, lay;
  {
    loom::train::trainer<MP, loom::policy<npu, loom::precision::fp32_ascend_matmul>, B, T, loom::parallel::local_group, loom::kernels::fused> tr(
        ctx, config(windows / B));
    for (int s = 0; s < steps; ++s) one.push_back(tr.step(ctx, batch(s)).loss);
  }
  auto hc = loom::comm::hccl::create(world, ctx);
  loom::train::trainer<MP, policy, B, T, loom::comm::hccl, loom::kernels::fused> tr(ctx, config(windows / B), hc);
  for (int s = 0; s < steps; ++s) lay.push_back(tr.step(ctx, batch(s)).loss);
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(lay[std::size_t(s)] == doctest::Approx(one[std::size_t(s)]).epsilon(1e-5));
  }
  MESSAGE("layout<" << TP << "," << PP << "> over processes: losses " << lay[0] << " " << lay[1] << " vs one rank "
                    << one[0] << " " << one[1]);
}
}  // namespace

TEST_CASE("tensor and pipeline parallel over processes: layout<2,1> and layout<1,2> on comm::hccl equal one rank") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 2) return;  // the layouts need exactly two ranks
  layout_over_processes<2, 1>();
  layout_over_processes<1, 2>();
}

TEST_CASE("a hung peer across processes: comm_timeout names the operation and the missing ranks") {
  loom::comm::mpi world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  auto hc = loom::comm::hccl::create(world, ctx);
  ::setenv("HCCL_EXEC_TIMEOUT", "2", 1);  // HCCL's wait for the peers, read when the operation runs
  auto x = upload<float>(ctx, std::vector<float>(16, 1.0f));
  if (r == 0) {
    std::string missing = "HcclAllReduce #0: ranks";
    for (int j = 1; j < n; ++j) missing += " " + std::to_string(j);
    missing += " never arrived";
    CHECK_THROWS_WITH_AS(hc.all_reduce(std::span<float>(x.data(), 16)), doctest::Contains(missing.c_str()),
                         loom::parallel::comm_timeout);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the other ranks never issued it; rank 0 has given up
  ::unsetenv("HCCL_EXEC_TIMEOUT");
}
