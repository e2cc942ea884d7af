// doctor: is this machine ready to train? One line per check, OK or FAIL, each FAIL with its fix.
//
//   ./doctor                 host checks, then Ascend: runtime, CANN version, devices, smoke tests, HCCL
//   ./doctor --no-peak       skip the ~1 s CPU peak measurement
//   ./doctor --max-devices 2 smoke-test at most 2 NPUs (default 8)
//
// Exit status (a bit mask, so a script can tell what is missing):
//   0  every check passed
//   1  a host check failed (CPU features the build needs, Eigen, a library loom was built with)
//   2  no Ascend NPU runtime was found (the normal result on a CPU-only machine)
//   4  an NPU runtime was found but a device, operator or HCCL check failed
// The Ascend checks load CANN at run time (loom::device::ascend_runtime) — this binary is the same
// on a CPU-only machine and on an NPU host. Sources: loom's API reference
// (shared/reference/ascend-api.md §1.3 versions, §1.4 devices, §1.6 memory, §3 HCCL, §4.1 layout).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "cli.hpp"  // CLI11 and parse_or_exit
#include <Eigen/Core>

#include <loom/bench/peak.hpp>
#include <loom/core/buffer.hpp>
#include <loom/device/ascend.hpp>
#include <loom/device/ascend_runtime.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/comm_threads.hpp>

#if LOOM_WITH_MPI
#include <mpi.h>
#endif

namespace {

int status = 0;

void ok(const std::string& what, const std::string& detail) { std::printf("OK    %-16s %s\n", what.c_str(), detail.c_str()); }
void info(const std::string& what, const std::string& detail) {
  std::printf("--    %-16s %s\n", what.c_str(), detail.c_str());
}
/// A FAIL line, then `details` (lines, printed indented under it), then the fix, once.
void fail(int bit, const std::string& what, const std::string& problem, const std::string& fix,
          const std::vector<std::string>& details = {}) {
  status |= bit;
  std::printf("FAIL  %-16s %s\n", what.c_str(), problem.c_str());
  for (const auto& d : details) std::printf("      %-16s %s\n", "", d.c_str());
  std::printf("      %-16s fix: %s\n", "", fix.c_str());
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// --- host ----------------------------------------------------------------------------------------
void check_cpu(bool measure_peak) {
  std::string features;
#if defined(__x86_64__)
  __builtin_cpu_init();
  auto has = [&](bool yes, const char* f) {
    if (yes) features += std::string(features.empty() ? "" : " ") + f;
  };
  has(__builtin_cpu_supports("sse4.2"), "sse4.2");
  has(__builtin_cpu_supports("avx"), "avx");
  has(__builtin_cpu_supports("avx2"), "avx2");
  has(__builtin_cpu_supports("fma"), "fma");
  has(__builtin_cpu_supports("avx512f"), "avx512f");
  has(__builtin_cpu_supports("avx512bw"), "avx512bw");
  has(__builtin_cpu_supports("avx512vl"), "avx512vl");
  has(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
  const char* arch = "x86_64";
#elif defined(__aarch64__)
  const char* arch = "aarch64";
  features = "neon";
#else
  const char* arch = "unknown";
#endif
  ok("cpu", std::string(arch) + ", features: " + (features.empty() ? "(none detected)" : features));
  std::string built = "built for: ";
#if defined(__AVX512F__)
  built += "avx512f";
#elif defined(__AVX2__)
  built += "avx2";
#else
  built += "baseline (no -march=native)";
#endif
#if defined(_OPENMP)
  built += ", OpenMP " + std::to_string(_OPENMP);
#else
  built += ", no OpenMP";
#endif
  ok("build", built);
#if defined(__x86_64__) && defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f"))
    fail(1, "build", "this binary uses AVX-512 but the CPU lacks it",
         "rebuild on this machine (LOOM_NATIVE=ON compiles with -march=native for the build host)");
#endif
  if (measure_peak) {
    const auto p = loom::bench::measure_fp32_peak(0, 0.1, 2);
    ok("cpu peak", std::to_string(int(std::lround(p.gflops))) + " GFLOP/s fp32 measured (" + std::string(p.isa) + ", " +
                       std::to_string(p.threads) + " threads; wall-clock estimate " +
                       std::to_string(int(std::lround(p.gflops_wall))) + ")");
  } else {
    info("cpu peak", "not measured (--no-peak)");
  }
}

void check_libraries() {
  ok("eigen", std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                  std::to_string(EIGEN_MINOR_VERSION) + " (loom's CPU GEMM and kernels)");
  // loom does not link a BLAS; bench_matmul compares against OpenBLAS when present.
  void* blas = ::dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_LOCAL);
  if (!blas) blas = ::dlopen("libopenblas.so", RTLD_LAZY | RTLD_LOCAL);
  if (blas) {
    using config_fn = char* (*)();
    auto* cfg = reinterpret_cast<config_fn>(::dlsym(blas, "openblas_get_config"));
    ok("blas", std::string(cfg ? cfg() : "OpenBLAS (version unknown)") + " (optional; bench_matmul only)");
  } else {
    info("blas", "no OpenBLAS (optional: loom uses Eigen's GEMM; apt install libopenblas-dev for bench_matmul)");
  }
#if LOOM_WITH_MPI
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
  ok("mpi", first_line(version) + " (comm::mpi)");
#else
  info("mpi", "not built in (optional: comm::mpi; apt install libopenmpi-dev and reconfigure)");
#endif
#if LOOM_WITH_TEXT
#ifdef LOOM_SENTENCEPIECE_VERSION
  ok("sentencepiece", std::string(LOOM_SENTENCEPIECE_VERSION) + " (loom::text: tokenizer training, prepare_data)");
#else
  ok("sentencepiece", "linked (loom::text: tokenizer training, prepare_data)");
#endif
#else
  info("sentencepiece", "not built in (optional: loom::text; scripts/setup.sh installs libsentencepiece-dev)");
#endif
}

// --- Ascend --------------------------------------------------------------------------------------
constexpr int npu_bit = 4;

/// y (m,n) = x (m,k) w(n,k)^T in fp16 on the NPU against a double reference on the host.
double smoke_matmul(loom::context<loom::device::ascend>& ctx) {
  using T = Eigen::half;
  const int m = 37, k = 45, n = 29;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<T> x(std::size_t(m) * k), w(std::size_t(n) * k), y(std::size_t(m) * n);
  for (auto& v : x) v = T(d(rng));
  for (auto& v : w) v = T(d(rng));
  loom::buffer<loom::device::ascend, T> dx(x.size(), ctx.stream), dw(w.size(), ctx.stream), dy(y.size(), ctx.stream);
  loom::device::ascend::copy_to_device(dx.data(), x.data(), dx.bytes(), ctx.stream);
  loom::device::ascend::copy_to_device(dw.data(), w.data(), dw.bytes(), ctx.stream);
  loom::kernels::ops<loom::device::ascend, T>::matmul_forward(ctx, dy.data(), dx.data(), dw.data(), nullptr, m, k, n);
  loom::device::ascend::copy_to_host(y.data(), dy.data(), dy.bytes(), ctx.stream);
  ctx.synchronize();
  double worst = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += double(float(x[std::size_t(i) * k + p])) * double(float(w[std::size_t(j) * k + p]));
      worst = std::max(worst, std::abs(double(float(y[std::size_t(i) * n + j])) - ref));
    }
  return worst;
}

void check_ascend(int max_devices) {
  std::shared_ptr<const loom::device::ascend_runtime> rt;
  try {
    rt = loom::device::ascend_runtime::load();
  } catch (const loom::device::runtime_not_found& e) {
    // e.what(): what was not loaded, the places tried, and a "fix:" line. The places go under the
    // FAIL line; the fix is printed once (the runtime's own, when it has one).
    std::string fix = "install the CANN toolkit and driver, then `source <toolkit>/set_env.sh` (sets "
                      "ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, LD_LIBRARY_PATH), or set ASCEND_HOME_PATH=<toolkit "
                      "root containing lib64/libascendcl.so>";
    std::vector<std::string> details;
    const std::string what = e.what();
    for (std::size_t at = 0; at < what.size();) {
      std::size_t end = what.find('\n', at);
      if (end == std::string::npos) end = what.size();
      const std::string line = what.substr(at, end - at);
      const std::size_t text = line.find_first_not_of(' ');
      if (text != std::string::npos && line.compare(text, 5, "fix: ") == 0) fix = line.substr(text + 5);
      else if (text != std::string::npos) details.push_back(line);
      at = end + 1;
    }
    fail(2, "ascend runtime", "no Ascend NPU runtime found (libascendcl.so)", fix, details);
    info("ascend", "skipped the NPU checks (CPU training works without them)");
    return;
  }
  std::string libs;
  for (const auto& [name, path] : rt->libraries()) libs += (libs.empty() ? "" : ", ") + path;
  ok("ascend runtime", libs);
  if (!rt->has_operators()) {
    std::string missing;
    for (const auto& m : rt->missing())
      if (m.starts_with("acl")) missing += (missing.empty() ? "" : " ") + m;
    fail(npu_bit, "aclnn operators", "not all resolved: " + missing,
         "the op-API libraries (libopapi.so or libopapi_{math,nn,transformer}.so) and libnnopbase.so must sit next "
         "to libascendcl.so; a CANN 8.x toolkit has them — source its set_env.sh");
  } else {
    ok("aclnn operators", "every operator loom uses is exported");
  }

  const auto& api = rt->api();
  try {
    rt->initialize();
    ok("aclInit", "initialised");
  } catch (const std::exception& e) {
    fail(npu_bit, "aclInit", first_line(e.what()), "check the driver (npu-smi info) and ASCEND_OPP_PATH (set_env.sh)");
    return;
  }
  if (const std::string version = rt->cann_version(); !version.empty())
    ok("CANN version", version);
  else
    info("CANN version", "the runtime reports none (neither aclsysGetVersionStr nor aclsysGetCANNVersion)");

  uint32_t count = 0;
  if (const int rc = api.aclrtGetDeviceCount(&count); rc != 0 || count == 0) {
    fail(npu_bit, "npu devices", rc ? "aclrtGetDeviceCount failed with code " + std::to_string(rc) : "0 NPUs visible",
         "check the driver with `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES (it lists the NPUs this process may see)");
    return;
  }
  ok("npu devices", std::to_string(count) + " visible");
  const int n = std::min<int>(int(count), std::max(1, max_devices));
  for (int d = 0; d < n; ++d) {
    const std::string label = "npu " + std::to_string(d);
    try {
      loom::device::ascend_device dev(rt, d);
      const char* soc = api.aclrtGetSocName ? api.aclrtGetSocName() : nullptr;
      std::size_t free_b = 0, total_b = 0, f2 = 0, t2 = 0;
      api.aclrtGetMemInfo(loom::device::acl::mem_hbm, &free_b, &total_b);
      if (api.aclrtGetMemInfo(loom::device::acl::mem_ddr, &f2, &t2) == 0 && t2 > total_b) free_b = f2, total_b = t2;
      const double err = smoke_matmul(dev.context());
      const std::string desc = std::string(soc ? soc : "SoC unknown") + ", " + std::to_string(total_b >> 20) +
                               " MiB (" + std::to_string(free_b >> 20) + " free)";
      if (err < 0.1)
        ok(label, desc + ", fp16 matmul 37x45x29 max error " + std::to_string(err));
      else
        fail(npu_bit, label, desc + ": fp16 matmul max error " + std::to_string(err) + " (expected < 0.1)",
             "the NPU computes wrong results: check `npu-smi info` health, then run loom_ascend_tests' bodies on it");
    } catch (const std::exception& e) {
      fail(npu_bit, label, first_line(e.what()),
           "check `npu-smi info` (health, processes holding the device) and that ASCEND_OPP_PATH is set");
    }
  }
  if (n < int(count)) info("npu", "checked " + std::to_string(n) + " of " + std::to_string(count) + " (--max-devices)");

  if (!rt->has_hccl()) {
    fail(npu_bit, "hccl", "libhccl.so not found or incomplete next to libascendcl.so",
         "install the CANN toolkit's HCCL component (set_env.sh puts lib64 on LD_LIBRARY_PATH)");
    return;
  }
  try {
    std::atomic<int> good{0};
    loom::comm::run_threads(n, [&](loom::comm::threads& boot) {
      loom::device::ascend_device dev(rt, boot.rank());
      auto& ctx = dev.context();
      loom::parallel::comm::hccl_options opt;
      opt.timeout = std::chrono::seconds(60);
      auto hc = loom::comm::hccl::create(boot, ctx, opt);
      const float mine[4] = {float(boot.rank() + 1), 1, 2, 3};
      loom::buffer<loom::device::ascend, float> x(4, ctx.stream);
      loom::device::ascend::copy_to_device(x.data(), mine, sizeof mine, ctx.stream);
      hc.all_reduce(std::span<float>(x.data(), 4));
      float out[4] = {};
      loom::device::ascend::copy_to_host(out, x.data(), sizeof out, ctx.stream);
      ctx.synchronize();
      const float want = float(n) * float(n + 1) / 2;
      if (out[0] == want && out[3] == 3.0f * float(n)) ++good;
    });
    if (good == n)
      ok("hccl", "communicator over " + std::to_string(n) + " NPU(s) (HcclCommInitRootInfo), all-reduce correct");
    else
      fail(npu_bit, "hccl", "all-reduce over " + std::to_string(n) + " NPUs gave wrong sums",
           "check the HCCL links (hccn_tool / npu-smi) and HCCL_* environment variables");
  } catch (const std::exception& e) {
    fail(npu_bit, "hccl", first_line(e.what()),
         "check HCCL_CONNECT_TIMEOUT, HCCL_IF_IP / HCCL_SOCKET_IFNAME, and that no other job holds the NPUs");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom doctor: checks this machine before training (exit status: 0 all OK; bit 1 host check failed; "
               "bit 2 no Ascend runtime found; bit 4 an NPU check failed)"};
  bool no_peak = false;
  int max_devices = 8;
  app.add_flag("--no-peak", no_peak, "skip the CPU fp32 peak measurement (~1 s)");
  app.add_option("--max-devices", max_devices, "smoke-test at most this many NPUs")->check(CLI::Range(1, 64));
  loom_examples::parse_or_exit(app, argc, argv);

  std::printf("loom doctor\n");
  check_cpu(!no_peak);
  check_libraries();
  check_ascend(max_devices);
  std::printf("exit status %d (%s)\n", status,
              status == 0 ? "all checks passed"
                          : status == 2 ? "CPU ready; no NPU runtime on this machine" : "see the FAIL lines above");
  return status;
}
