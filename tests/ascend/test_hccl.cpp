// comm::hccl over emulated ranks: ranks are threads (comm::run_threads), each with its own emulated
// NPU; the HCCL root info travels over the threads communicator (or a file). Results are compared
// with what comm::threads computes on host copies of the same data.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>

#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/comm_threads.hpp>

#include "support.hpp"

using namespace loom_test;
using loom::parallel::reduce_op;

namespace {
std::vector<float> rank_data(int rank, std::size_t n) { return randn(n, 1000 + std::uint64_t(rank)); }
}  // namespace

TEST_CASE_TEMPLATE("comm::hccl: all_reduce (sum, avg, max, min) equals comm::threads on the same data", T, float,
                   Eigen::bfloat16, Eigen::half) {
  const int world = 4;
  const std::size_t n = 1001;
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    loom::device::ascend_device dev(runtime(), boot.rank());
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create(boot, ctx);
    REQUIRE(hc.size() == world);
    REQUIRE(hc.rank() == boot.rank());
    for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min}) {
      CAPTURE(int(op));
      const auto x = quantize<T>(rank_data(boot.rank(), n));
      auto dx = upload<T>(ctx, x);
      hc.all_reduce(std::span<T>(dx.data(), n), op);
      auto host = to<T>(x);
      boot.all_reduce(std::span<T>(host), op);
      const double tol = std::is_same_v<T, float> ? 1e-12 : tolerance<T>();
      CHECK(nmse(download(ctx, dx.data(), n), to_float(host)) < tol);
    }
  });
}

TEST_CASE("comm::hccl: reduce_scatter, all_gather (also in place), broadcast, send/recv and barrier") {
  const int world = 3;
  const std::size_t m = 37;
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    const int r = boot.rank();
    loom::device::ascend_device dev(runtime(), r);
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create(boot, ctx);

    const auto full = rank_data(r, m * world);
    auto din = upload<float>(ctx, full);
    dbuf<float> out(m, ctx.stream);
    hc.reduce_scatter(std::span<const float>(din.data(), m * world), std::span<float>(out.data(), m));
    std::vector<float> href(m), hfull = full;
    boot.reduce_scatter(std::span<const float>(hfull), std::span<float>(href));
    CHECK(nmse(download(ctx, out.data(), m), href) < 1e-12);

    // all_gather from this rank's own chunk of the output (in place)
    const auto mine = rank_data(r, m);
    std::vector<float> gathered_host(m * world);
    boot.all_gather(std::span<const float>(mine), std::span<float>(gathered_host));
    dbuf<float> gathered(m * world, ctx.stream);
    npu::copy_to_device(gathered.data() + r * m, mine.data(), m * sizeof(float), ctx.stream);
    hc.all_gather(std::span<const float>(gathered.data() + r * m, m), std::span<float>(gathered.data(), m * world));
    CHECK(download(ctx, gathered.data(), m * world) == gathered_host);

    auto b = upload<std::int32_t>(ctx, std::vector<std::int32_t>(m, 100 + r));
    hc.broadcast(std::span<std::int32_t>(b.data(), m), 1);
    CHECK(download(ctx, b.data(), m) == std::vector<float>(m, 101.0f));

    // a ring: even ranks send first, odd ranks receive first (HCCL send/recv are paired)
    auto payload = upload<float>(ctx, std::vector<float>(m, float(r)));
    dbuf<float> got(m, ctx.stream);
    const int next = (r + 1) % world, prev = (r + world - 1) % world;
    if (r % 2 == 0) {
      hc.send(std::span<const float>(payload.data(), m), next, 0);
      hc.recv(std::span<float>(got.data(), m), prev, 0);
    } else {
      hc.recv(std::span<float>(got.data(), m), prev, 0);
      hc.send(std::span<const float>(payload.data(), m), next, 0);
    }
    CHECK(download(ctx, got.data(), m) == std::vector<float>(m, float(prev)));
    hc.barrier();
  });
}

TEST_CASE("comm::hccl: split into sub-communicators, and the async all_reduce orders later compute after it") {
  const int world = 4;
  const std::size_t n = 257;
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    const int r = boot.rank();
    loom::device::ascend_device dev(runtime(), r);
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create(boot, ctx);
    // HCCL numbers a sub-communicator's ranks in ascending global order: keys may not reverse it
    CHECK_THROWS_WITH_AS(hc.split(r % 2, -r), doctest::Contains("ascending global order"), loom::input_error);
    auto half = hc.split(r % 2, r);
    CHECK(half.size() == 2);
    CHECK(half.rank() == r / 2);
    CHECK(half.name() == "world/" + std::to_string(r % 2));
    // a split of a split: HCCL cannot split a sub-communicator, so loom splits the global one
    auto all = hc.split(0, r);
    auto pair = all.split(r / 2, r);  // {0,1} and {2,3}
    CHECK(pair.size() == 2);
    CHECK(pair.rank() == r % 2);
    auto p = upload<float>(ctx, std::vector<float>(3, float(r)));
    pair.all_reduce(std::span<float>(p.data(), 3));
    CHECK(download(ctx, p.data(), 3) == std::vector<float>(3, float(r < 2 ? 0 + 1 : 2 + 3)));
    auto x = upload<float>(ctx, std::vector<float>(n, float(r + 1)));
    half.all_reduce(std::span<float>(x.data(), n));
    const float expect = r % 2 == 0 ? 1 + 3 : 2 + 4;  // ranks {0,2} and {1,3}
    CHECK(download(ctx, x.data(), n) == std::vector<float>(n, expect));

    // async: the compute stream's next kernel waits for the collective, without a host wait
    auto y = upload<float>(ctx, std::vector<float>(n, 1.0f));
    dbuf<float> z(n, ctx.stream);
    auto req = hc.all_reduce_async(std::span<float>(y.data(), n));
    loom::kernels::ops<npu, float>::residual_forward(ctx, z.data(), y.data(), y.data(), n);
    req.wait();
    CHECK(download(ctx, z.data(), n) == std::vector<float>(n, 2.0f * world));
  });
}

TEST_CASE("comm::hccl: root info through a file, bad input, mismatched calls and a missing rank") {
  const int world = 2;
  const auto path = std::filesystem::temp_directory_path() / ("loom_hccl_root_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  ::setenv("HCCL_EXEC_TIMEOUT", "1", 1);  // the emulated peer wait: keep the stuck collective short
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    const int r = boot.rank();
    loom::device::ascend_device dev(runtime(), r);
    auto& ctx = dev.context();
    loom::comm::hccl_options opt;
    opt.timeout = std::chrono::milliseconds(300);
    auto hc = loom::comm::hccl::create_from_file(path, world, r, ctx, opt);
    CHECK(hc.size() == world);
    auto d = upload<double>(ctx, std::vector<double>(8, 1.0));
    CHECK_THROWS_WITH_AS(hc.all_reduce(std::span<double>(d.data(), 8)), doctest::Contains("no fp64 reduction"),
                         loom::input_error);
    auto i = upload<std::int32_t>(ctx, std::vector<std::int32_t>(8, 1));
    CHECK_THROWS_AS(hc.all_reduce(std::span<std::int32_t>(i.data(), 8), reduce_op::avg), loom::input_error);
    CHECK_THROWS_AS(hc.broadcast(std::span<std::int32_t>(i.data(), 8), 5), loom::input_error);

    // ranks disagree on the count: every rank's synchronize reports it
    auto f = upload<float>(ctx, std::vector<float>(16, 1.0f));
    CHECK_THROWS_WITH_AS(hc.all_reduce(std::span<float>(f.data(), r == 0 ? 16 : 8)),
                         doctest::Contains("ranks posted different calls"), loom::device_error);
    boot.barrier();
    // rank 1 never joins: rank 0 times out with comm_timeout naming the operation
    if (r == 0)
      CHECK_THROWS_WITH_AS(hc.all_reduce(std::span<float>(f.data(), 16)), doctest::Contains("did not complete within"),
                           loom::parallel::comm_timeout);
    boot.barrier();
  });
  ::unsetenv("HCCL_EXEC_TIMEOUT");
  CHECK_FALSE(std::filesystem::exists(path));  // rank 0 removed it after every rank joined
}

TEST_CASE("comm::hccl: two ranks on one NPU cannot form a communicator; every rank is told which") {
  loom::comm::run_threads(2, [&](loom::comm::threads& boot) {
    loom::device::ascend_device dev(runtime(), 0);  // both ranks on device 0
    CHECK_THROWS_WITH_AS(loom::comm::hccl::create(boot, dev.context()), doctest::Contains("ranks 0 and 1 are both on device 0"),
                         loom::device_error);
  });
}
