// comm::hccl from a rank table (HcclCommInitClusterInfo), against loom's host emulation:
//  * two processes, launched the way MindSpore's and torch_npu's rank-table scripts launch them
//    (the same RANK_TABLE_FILE, RANK_ID 0 and 1, nothing else shared): this binary spawns itself
//    twice as workers, which meet over the emulation's shared-memory transport (one segment per
//    rank table path), all-reduce and send/recv, and check the values;
//  * in one process: the emulation's HcclCommInitClusterInfo rejects each bad table as HCCL does,
//    and loom's create_from_rank_table reports a bad table before calling HCCL.
// CTest: ascend_hccl_rank_table (cmake/LoomAscendEmulation.cmake); under a second. With
// LOOM_RANK_TABLE_WORKER=1 the binary is one worker (RANK_TABLE_FILE, RANK_ID from the
// environment): CTest ascend_hccl_rank_table_mpirun starts two under mpirun with hccl_np2.json.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <loom/parallel/comm_hccl.hpp>

#include "ascend/support.hpp"
#include "support/temp_dir.hpp"

extern char** environ;

using namespace loom_test;

namespace {

/// A one-server rank table: rank r on device_id r, for r < n.
std::string table_of(int n, const char* status = "completed") {
  std::string devices;
  for (int r = 0; r < n; ++r)
    devices += std::string(r ? ", " : "") + "{\"device_id\": \"" + std::to_string(r) + "\", \"device_ip\": \"192.168.1." +
               std::to_string(8 + r) + "\", \"rank_id\": \"" + std::to_string(r) + "\"}";
  return std::string("{\"status\": \"") + status + "\", \"version\": \"1.0\", \"server_count\": \"1\", "
         "\"server_list\": [{\"server_id\": \"node_0\", \"device\": [" + devices + "]}]}";
}
void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

/// One worker process: RANK_TABLE_FILE and RANK_ID from the environment, as a user's script sets them.
int worker() {
  try {
    const auto table = loom::parallel::read_rank_table(loom::parallel::rank_table_path());
    const int r = loom::parallel::rank_from_env();
    loom::device::ascend_device dev(runtime(), table.device_of(r));
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create_from_rank_table(ctx);  // path and rank from the environment
    int bad = 0;
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) {
        std::fprintf(stderr, "rank %d: %s\n", r, what.c_str());
        ++bad;
      }
    };
    expect(hc.size() == 2 && hc.rank() == r, "size/rank " + std::to_string(hc.size()) + "/" + std::to_string(hc.rank()));

    const std::size_t m = 1000;
    std::vector<float> mine(m);
    for (std::size_t i = 0; i < m; ++i) mine[i] = float(r + 1) + 0.5f * float(i);
    auto x = upload<float>(ctx, mine);
    hc.all_reduce(std::span<float>(x.data(), m));
    const auto sum = download(ctx, x.data(), m);
    for (std::size_t i = 0; i < m; i += 37)
      expect(sum[i] == 3.0f + float(i), "all_reduce[" + std::to_string(i) + "] = " + std::to_string(sum[i]));

    // 0 -> 1, then 1 -> 0 with the received values doubled
    const std::size_t k = 257;
    dbuf<std::int32_t> buf(k, ctx.stream);
    if (r == 0) {
      std::vector<std::int32_t> v(k);
      for (std::size_t i = 0; i < k; ++i) v[i] = std::int32_t(7 * i + 1);
      auto s = upload<std::int32_t>(ctx, v);
      hc.send(std::span<const std::int32_t>(s.data(), k), 1, 0);
      hc.recv(std::span<std::int32_t>(buf.data(), k), 1, 0);
      const auto back = download(ctx, buf.data(), k);
      for (std::size_t i = 0; i < k; ++i)
        expect(back[i] == float(2 * (7 * i + 1)), "recv[" + std::to_string(i) + "] = " + std::to_string(back[i]));
    } else {
      hc.recv(std::span<std::int32_t>(buf.data(), k), 0, 0);
      auto got = download(ctx, buf.data(), k);
      for (std::size_t i = 0; i < k; ++i)
        expect(got[i] == float(7 * i + 1), "recv[" + std::to_string(i) + "] = " + std::to_string(got[i]));
      for (auto& g : got) g *= 2;
      auto s = upload<std::int32_t>(ctx, got);
      hc.send(std::span<const std::int32_t>(s.data(), k), 0, 0);
    }
    hc.barrier();
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker: %s\n", e.what());
    return 2;
  }
}

/// The emulation's HcclCommInitClusterInfo on `path` as `rank` from device 0: (code, message).
std::pair<int, std::string> init_cluster(const std::filesystem::path& path, std::uint32_t rank) {
  acl::HcclComm comm = nullptr;
  const int rc = int(api().HcclCommInitClusterInfo(path.c_str(), rank, &comm));
  if (rc == 0) api().HcclCommDestroy(comm);
  return {rc, loom::device::detail::acl_recent_message(api())};
}

}  // namespace

TEST_CASE("comm::hccl from a rank table: two processes with RANK_ID 0 and 1 all-reduce and send/recv") {
  temp_dir dir("loom_rank_table_");
  const auto table = dir / "hccl.json";
  write(table, table_of(2));
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(len > 0);
  self[len] = '\0';
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string s = *e;
      if (!s.starts_with("RANK_ID=") && !s.starts_with("RANK=") && !s.starts_with("RANK_TABLE_FILE=")) env.push_back(s);
    }
    env.push_back("RANK_TABLE_FILE=" + table.string());
    env.push_back("RANK_ID=" + std::to_string(r));
    env.push_back("LOOM_RANK_TABLE_WORKER=1");
    env.push_back("HCCL_CONNECT_TIMEOUT=30");
    env.push_back("HCCL_EXEC_TIMEOUT=30");
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    char* argv[] = {self, nullptr};
    pid_t pid = 0;
    REQUIRE(posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data()) == 0);
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (std::size_t r = 0; r < pids.size(); ++r) {
    int status = -1;
    while (waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[r], &status, 0);
        FAIL("rank " << r << " did not finish within 90 s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK_MESSAGE(WIFEXITED(status), "rank " << r << " was killed by signal " << WTERMSIG(status));
    CHECK_MESSAGE(WEXITSTATUS(status) == 0, "rank " << r << " failed (see its messages above)");
  }
}

TEST_CASE("HcclCommInitClusterInfo (emulation) rejects what HCCL rejects; one rank joins alone") {
  temp_dir dir("loom_rank_table_");
  loom::device::ascend_device dev(runtime(), 0);
  const auto t = dir / "t.json";
  struct bad_case {
    const char* name;
    std::string text;
    std::uint32_t rank;
    const char* message;
  };
  const std::string good = table_of(2);
  auto swap = [](std::string s, const std::string& a, const std::string& b) { return s.replace(s.find(a), a.size(), b); };
  const std::vector<bad_case> cases = {
      {"not JSON", "{\"status\": \"completed\", // comment\n}", 0, "is not valid JSON"},
      {"missing field", swap(good, "\"server_count\": \"1\", ", ""), 0, "has no \"server_count\""},
      {"unquoted number", swap(good, "\"rank_id\": \"1\"", "\"rank_id\": 1"), 0, "\"rank_id\" is not a string"},
      {"rank ids", swap(good, "\"rank_id\": \"1\"", "\"rank_id\": \"2\""), 0, "rank_ids are not 0..1"},
      {"rank not in table", good, 2, "rank 2 is not in the rank table"},
      {"device twice", swap(good, "\"device_id\": \"1\"", "\"device_id\": \"0\""), 0, "device_id 0 appears twice"},
      {"status", table_of(2, "initializing"), 0, "status is \"initializing\""},
      {"version", swap(good, "\"1.0\"", "\"1.2\""), 0, "version \"1.2\""},
      {"server_count", swap(good, "\"server_count\": \"1\"", "\"server_count\": \"2\""), 0, "server_count 2"},
      {"device id past the devices", swap(good, "\"device_id\": \"1\"", "\"device_id\": \"8\""), 0, "does not exist"},
      {"device_ip", swap(good, "192.168.1.9", "192.168.1.8"), 0, "is not unique"},
      {"wrong device", good, 1, "puts rank 1 on device_id 1 but the calling thread is on device 0"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    write(t, c.text);
    const auto [rc, msg] = init_cluster(t, c.rank);
    CHECK(rc == 1);  // HCCL_E_PARA
    CHECK_MESSAGE(msg.find(c.message) != std::string::npos, msg);
  }
  {
    const auto [rc, msg] = init_cluster(dir / "missing.json", 0);
    CHECK(rc == 10);  // HCCL_E_OPEN_FILE_FAILURE
    CHECK(msg.find("missing.json") != std::string::npos);
  }
  {
    acl::HcclComm comm = nullptr;
    CHECK(int(api().HcclCommInitClusterInfo(nullptr, 0, &comm)) == 2);  // HCCL_E_PTR
    const std::string long_path(5000, 'a');
    CHECK(int(api().HcclCommInitClusterInfo(long_path.c_str(), 0, &comm)) == 1);
  }
  // a one-rank table joins at once; initialising it again while alive is an error ("repeated
  // initialization"), and after HcclCommDestroy the same table (same segment name) works again
  write(t, table_of(1));
  acl::HcclComm a = nullptr, b = nullptr;
  REQUIRE(int(api().HcclCommInitClusterInfo(t.c_str(), 0, &a)) == 0);
  CHECK(int(api().HcclCommInitClusterInfo(t.c_str(), 0, &b)) == 1);
  CHECK(loom::device::detail::acl_recent_message(api()).find("already initialised") != std::string::npos);
  CHECK(int(api().HcclCommDestroy(a)) == 0);
  REQUIRE(int(api().HcclCommInitClusterInfo(t.c_str(), 0, &b)) == 0);
  CHECK(int(api().HcclCommDestroy(b)) == 0);
}

TEST_CASE("comm::hccl::create_from_rank_table: loom names the file and the fix before HCCL sees a bad table") {
  temp_dir dir("loom_rank_table_");
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const auto t = dir / "hccl.json";
  write(t, table_of(2, "initializing"));
  CHECK_THROWS_WITH_AS(loom::comm::hccl::create_from_rank_table(ctx, t, 0),
                       doctest::Contains((t.string() + ": \"status\" is \"initializing\"").c_str()), loom::input_error);
  write(t, table_of(2));
  CHECK_THROWS_WITH_AS(loom::comm::hccl::create_from_rank_table(ctx, t, 5), doctest::Contains("rank 5 is not in the table"),
                       loom::input_error);
  CHECK_THROWS_WITH_AS(loom::comm::hccl::create_from_rank_table(ctx, dir / "none.json", 0),
                       doctest::Contains("none.json does not exist"), loom::input_error);
  // HCCL's own check: rank 1 belongs on device 1
  CHECK_THROWS_WITH_AS(loom::comm::hccl::create_from_rank_table(ctx, t, 1), doctest::Contains("HcclCommInitClusterInfo"),
                       loom::device_error);
  // one rank: a working communicator
  write(t, table_of(1));
  auto hc = loom::comm::hccl::create_from_rank_table(ctx, t, 0);
  CHECK(hc.size() == 1);
  auto x = upload<float>(ctx, std::vector<float>{1, 2, 3});
  hc.all_reduce(std::span<float>(x.data(), 3));
  CHECK(download(ctx, x.data(), 3) == std::vector<float>{1, 2, 3});
}

int main(int argc, char** argv) {
  if (const char* w = std::getenv("LOOM_RANK_TABLE_WORKER"); w && *w) return worker();
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
