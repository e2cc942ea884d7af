// doctor: is this machine ready to train? One line per check, OK or FAIL, each FAIL with its fix.
//
//   ./doctor                 host checks, then Ascend: driver, group, runtime, CANN version, devices, HCCL
//   ./doctor --no-peak       skip the ~1 s CPU peak measurement
//   ./doctor --max-devices 2 smoke-test at most 2 NPUs (default 8)
//
// With RANK_TABLE_FILE set (a rank-table launch, as MindSpore and torch_npu do it), the table is
// read with loom's own reader (loom/parallel/rank_table.hpp, what comm::hccl::create_from_rank_table
// uses): one FAIL line and one fix per problem, and the rank from RANK_ID / RANK must be in it.
//
// The Ascend checks start with what the vendor's troubleshooting tables list first: `npu-smi` and
// the cards it lists (driver and firmware installed, card healthy), the driver version, the user's
// membership of HwHiAiUser (the group the driver's device files belong to), the CANN version
// against loom's compatibility statement (loom/device/ascend_version.hpp), ASCEND_HOME_PATH (set by the
// toolkit's set_env.sh), then loading the runtime, the devices, the operators and HCCL.
//
// Exit status (a bit mask, so a script can tell what is missing):
//   0  every check passed
//   1  a host check failed (CPU features the build needs, Eigen, a library loom was built with)
//   2  no Ascend NPU software was found: no driver (npu-smi) and no runtime (libascendcl.so) — the
//      normal result on a CPU-only machine
//   4  Ascend software was found but a check failed (driver, group, CANN version, ASCEND_HOME_PATH,
//      device, operator or HCCL), or RANK_TABLE_FILE is set and the rank table has a problem
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
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "cli.hpp"  // CLI11 and parse_or_exit
#include <Eigen/Core>

#include <loom/bench/peak.hpp>
#include <loom/core/buffer.hpp>
#include <loom/device/ascend.hpp>
#include <loom/device/ascend_runtime.hpp>
#include <loom/device/ascend_version.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/comm_threads.hpp>
#if __has_include(<nlohmann/json.hpp>)
#include <loom/parallel/rank_table.hpp>
#define LOOM_DOCTOR_RANK_TABLE 1
#endif

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

using loom::device::cann_compatibility;
using loom::device::cann_supported;

/// The first executable `name` on $PATH, then in the driver's install directories ("" if none).
std::string find_tool(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) dirs.push_back(d);
  }
  for (const char* d : {"/usr/local/sbin", "/usr/local/bin", "/usr/local/Ascend/driver/tools"}) dirs.push_back(d);
  for (const auto& d : dirs) {
    const auto p = std::filesystem::path(d) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return {};
}

/// Runs `command` through the shell; returns its exit status and (stdout + stderr) text.
std::pair<int, std::string> run_tool(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen((command + " 2>&1").c_str(), "r"), ::pclose);
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (std::size_t got = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, got);
  const int rc = ::pclose(pipe.release());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

/// One card of `npu-smi info`: its first table row "| <id> <name> | <health> | ...".
struct npu_card {
  int id;
  std::string name, health;
};
std::vector<npu_card> parse_npu_smi(const std::string& text) {
  std::vector<npu_card> cards;
  const std::regex row(R"(^\|\s*(\d+)\s+(\S+)\s*\|\s*([A-Za-z]+)\s*\|)");
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) cards.push_back({std::stoi(m[1]), m[2], m[3]});
  }
  return cards;
}

/// The driver version: `npu-smi info`'s header ("Version: X"), else the driver's version.info.
std::string driver_version(const std::string& npu_smi_text) {
  std::smatch m;
  if (std::regex_search(npu_smi_text, m, std::regex(R"(Version:\s*(\S+))"))) return m[1];
  std::ifstream f("/usr/local/Ascend/driver/version.info");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("Version=", 0) == 0) return line.substr(8);
  return {};
}

/// npu-smi, its cards, the driver version. Returns whether a driver was found.
bool check_driver() {
  const std::string smi = find_tool("npu-smi");
  if (smi.empty()) {
    const std::string version = driver_version("");
    if (version.empty()) {
      fail(2, "npu driver", "npu-smi not found (PATH, /usr/local/sbin) and no /usr/local/Ascend/driver/version.info",
           "install the Ascend NPU driver and firmware for your card (Ascend HDK: it installs npu-smi in "
           "/usr/local/sbin and the driver in /usr/local/Ascend/driver), then reboot or reload the driver");
      return false;
    }
    fail(npu_bit, "npu-smi", "driver " + version + " installed but npu-smi is not on PATH",
         "add the driver's tools to PATH (npu-smi is installed in /usr/local/sbin) or reinstall the driver");
    return true;
  }
  const auto [rc, text] = run_tool("'" + smi + "' info");
  const auto cards = parse_npu_smi(text);
  if (rc != 0 || cards.empty()) {
    fail(npu_bit, "npu-smi", smi + " info " + (rc != 0 ? "failed (exit " + std::to_string(rc) + "): " : "lists no card: ") +
                                 first_line(text),
         "check that the card is seated and the driver loaded (`lsmod | grep drv_`; `dmesg | grep -i davinci`); "
         "reinstall the driver and firmware matching the card");
    return true;
  }
  std::string list;
  int unhealthy = 0;
  for (const auto& c : cards) {
    list += (list.empty() ? "" : ", ") + std::to_string(c.id) + " " + c.name + " " + c.health;
    if (c.health != "OK") ++unhealthy;
  }
  if (unhealthy)
    fail(npu_bit, "npu-smi", std::to_string(cards.size()) + " card(s): " + list,
         "a card is not OK: `npu-smi info -t health -i <id>` names the alarm; clear its cause (the card's alarm "
         "handling guide) or ask the machine's administrator before training on it");
  else
    ok("npu-smi", smi + ": " + std::to_string(cards.size()) + " card(s): " + list);
  const std::string version = driver_version(text);
  if (version.empty())
    fail(npu_bit, "npu driver", "version unknown (no \"Version:\" in npu-smi info, no driver version.info)",
         "reinstall the driver: /usr/local/Ascend/driver/version.info is missing");
  else
    ok("npu driver", version);
  return true;
}

/// The calling user must be in HwHiAiUser, the group of the driver's device files (/dev/davinci*).
void check_group() {
  const uid_t uid = ::getuid();
  const passwd* pw = ::getpwuid(uid);
  const std::string user = pw ? pw->pw_name : std::to_string(uid);
  if (uid == 0) {
    ok("HwHiAiUser", "running as root: the device files need no group membership");
    return;
  }
  const group* g = ::getgrnam("HwHiAiUser");
  if (!g) {
    fail(npu_bit, "HwHiAiUser", "the group HwHiAiUser does not exist",
         "the driver package creates it: reinstall the driver with --install-username/--install-usergroup, or "
         "`groupadd HwHiAiUser` before installing it");
    return;
  }
  std::vector<gid_t> groups(std::size_t(std::max(::getgroups(0, nullptr), 0)) + 1);
  const int n = ::getgroups(int(groups.size()), groups.data());
  bool member = ::getgid() == g->gr_gid;
  for (int i = 0; i < n; ++i) member = member || groups[std::size_t(i)] == g->gr_gid;
  if (member) ok("HwHiAiUser", user + " is a member");
  else
    fail(npu_bit, "HwHiAiUser", user + " is not in the group HwHiAiUser (the NPU device files belong to it)",
         "sudo usermod -aG HwHiAiUser " + user + ", then log in again");
}

/// ASCEND_HOME_PATH must be set (set_env.sh) and name the toolkit the runtime was loaded from.
void check_home(const loom::device::ascend_runtime& rt) {
  const char* env = std::getenv("ASCEND_HOME_PATH");
  const std::string fix = "`source <toolkit>/set_env.sh` (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh) in the "
                          "shell that trains: it sets ASCEND_HOME_PATH, ASCEND_OPP_PATH and LD_LIBRARY_PATH together";
  if (!env || !*env) {
    fail(npu_bit, "ASCEND_HOME_PATH", "not set (the runtime was found in " +
                                          (rt.home().empty() ? std::string("the loader path") : rt.home()) + ")",
         fix);
    return;
  }
  std::error_code ec;
  const auto want = std::filesystem::weakly_canonical(std::filesystem::path(env) / "lib64", ec);
  const auto got = std::filesystem::weakly_canonical(rt.home(), ec);
  if (rt.home().empty() || want != got)
    fail(npu_bit, "ASCEND_HOME_PATH", std::string(env) + ", but libascendcl.so was loaded from " +
                                          (rt.home().empty() ? std::string("the loader path") : rt.home()),
         fix + " — of the toolkit you mean to use");
  else
    ok("ASCEND_HOME_PATH", env);
}

void check_ascend(int max_devices) {
  const bool driver = check_driver();
  if (driver) check_group();
  else info("HwHiAiUser", "not checked (no NPU driver)");
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
    fail(driver ? npu_bit : 2, "ascend runtime", "no Ascend NPU runtime found (libascendcl.so)", fix, details);
    info("ascend", "skipped the NPU checks (CPU training works without them)");
    return;
  }
  std::string libs;
  for (const auto& [name, path] : rt->libraries()) libs += (libs.empty() ? "" : ", ") + path;
  ok("ascend runtime", libs);
  // aclFinalize (aclFinalizeReference on newer runtimes) once every check below is done
  struct finalize_last {
    const loom::device::ascend_runtime& rt;
    ~finalize_last() {
      if (const int rc = rt.finalize(); rc != 0) std::fprintf(stderr, "doctor: aclFinalize returned %d\n", rc);
    }
  } finalize{*rt};
  check_home(*rt);
  if (const std::string version = rt->cann_version(); version.empty()) {
    fail(npu_bit, "CANN version", "the runtime reports none (neither aclsysGetVersionStr nor aclsysGetCANNVersion)",
         std::string("install a CANN toolkit within loom's statement: ") + cann_compatibility);
  } else if (std::string why; !cann_supported(version, &why)) {
    fail(npu_bit, "CANN version", version + ": " + why,
         std::string("install a CANN toolkit within loom's statement (") + cann_compatibility +
             ") and source its set_env.sh");
  } else {
    ok("CANN version", version + " (loom supports " + cann_compatibility + ")");
  }
  if (!rt->has_operators()) {
    std::string missing;
    for (const auto& m : rt->missing_operators()) missing += (missing.empty() ? "" : " ") + m;
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

// --- rank table (RANK_TABLE_FILE) ----------------------------------------------------------------
void check_rank_table() {
  const char* env = std::getenv("RANK_TABLE_FILE");
  if (!env || !*env) {
    info("RANK_TABLE_FILE", "not set (launch by root info over MPI; set it for a rank-table launch)");
    return;
  }
#if LOOM_DOCTOR_RANK_TABLE
  loom::parallel::rank_table table;
  const auto problems = loom::parallel::check_rank_table(env, &table);
  for (const auto& p : problems) fail(npu_bit, "RANK_TABLE_FILE", p.what, p.fix);
  if (!problems.empty()) return;
  ok("RANK_TABLE_FILE", std::string(env) + ": " + std::to_string(table.size()) + " rank(s) on " +
                            std::to_string(table.server_count()) + " server(s)");
  const bool has_rank = (std::getenv("RANK_ID") && *std::getenv("RANK_ID")) || (std::getenv("RANK") && *std::getenv("RANK"));
  if (!has_rank) {
    info("rank", "RANK_ID / RANK not set (each process of the job sets its own)");
    return;
  }
  try {
    const int r = loom::parallel::rank_from_env();
    table.check_rank(r);
    const auto& e = table.at(r);
    ok("rank", std::to_string(r) + ": device_id " + std::to_string(e.device_id) + " on server " + e.server_id);
  } catch (const loom::input_error& e) {
    const std::string what = e.what();
    const auto semi = what.find("; ");
    fail(npu_bit, "rank", what.substr(0, semi), semi == std::string::npos ? "set RANK_ID" : what.substr(semi + 2));
  }
#else
  info("RANK_TABLE_FILE", std::string(env) + " (not checked: built without nlohmann-json)");
#endif
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
  check_rank_table();
  std::printf("exit status %d (%s)\n", status,
              status == 0 ? "all checks passed"
                          : status == 2 ? "CPU ready; no NPU runtime on this machine" : "see the FAIL lines above");
  return status;
}
