// ascend_runtime: finding the CANN libraries at run time (here: the emulation's fake toolkit), the
// message when there is none, and the errors when a toolkit lacks operators or HCCL.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include <unistd.h>

#include <loom/device/ascend.hpp>
#include <loom/device/ascend_peak.hpp>
#include <loom/device/ascend_runtime.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/train/metrics.hpp>

#include "support.hpp"
#include "../support/scoped.hpp"

using namespace loom_test;
namespace fs = std::filesystem;

namespace {
using loom_test::scoped_env;
/// A fresh temporary directory, removed at scope exit.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const char* tag) {
    path = fs::temp_directory_path() / (std::string("loom_ascend_") + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
/// Loads the runtime from `root`, which holds only lib64/libascendcl.so (a link to the
/// emulation's): no environment, default roots or loader path.
auto load_acl_only(const temp_dir& root) {
  fs::create_directories(root.path / "lib64");
  fs::create_symlink(fs::path(runtime()->home()) / "libascendcl.so", root.path / "lib64" / "libascendcl.so");
  loom::device::ascend_runtime_options o;
  o.roots = {root.path.string()};
  o.use_environment = false;
  o.use_default_roots = false;
  o.use_loader_path = false;
  return loom::device::ascend_runtime::load(o);
}
}  // namespace

TEST_CASE("ascend runtime: without a toolkit, load() says no NPU runtime was found, where it looked and what to set") {
  scoped_env home("ASCEND_HOME_PATH", "/nonexistent/loom-test-toolkit");
  scoped_env toolkit("ASCEND_TOOLKIT_HOME", nullptr);
  loom::device::ascend_runtime_options o;
  o.roots = {"/nonexistent/explicit-root"};
  o.use_default_roots = false;  // a developer machine might have /usr/local/Ascend
  o.use_loader_path = false;
  try {
    (void)loom::device::ascend_runtime::load(o);
    FAIL("expected runtime_not_found");
  } catch (const loom::device::runtime_not_found& e) {
    const std::string what = e.what();
    CHECK(what.find("no Ascend NPU runtime found") != std::string::npos);
    CHECK(what.find("libascendcl.so") != std::string::npos);
    CHECK(what.find("/nonexistent/explicit-root/lib64") != std::string::npos);
    CHECK(what.find("$ASCEND_HOME_PATH=/nonexistent/loom-test-toolkit") != std::string::npos);
    CHECK(what.find("$ASCEND_TOOLKIT_HOME is not set") != std::string::npos);
    CHECK(what.find("set_env.sh") != std::string::npos);
    CHECK(what.find("libnnopbase.so") != std::string::npos);  // the fix lists every library loom loads
    CHECK(what.find("libhccl.so") != std::string::npos);
  }
}

TEST_CASE("ascend runtime: the emulation loads from ASCEND_HOME_PATH like a toolkit, every function resolved") {
  const auto& rt = runtime();
  CHECK(rt->has_operators());
  CHECK(rt->has_hccl());
  CHECK(rt->missing().empty());
  REQUIRE(rt->libraries().size() == 5);  // ascendcl, nnopbase, opapi, hccl, msprofiler — nothing linked
  CHECK(rt->has_profiler());
  CHECK(rt->libraries()[0].first == "libascendcl.so");
  CHECK(fs::path(rt->libraries()[0].second).parent_path() == fs::path(rt->home()));
  CHECK(static_cast<bool>(rt->api().aclsysGetVersionStr));
  CHECK(static_cast<bool>(rt->api().aclnnFlashAttentionScoreGrad));
  CHECK(static_cast<bool>(rt->api().HcclCommInitRootInfo));
  CHECK(rt->cann_version().find("8.1.RC1") == 0);
}

TEST_CASE("ascend runtime: required, optional and newer functions; aclprof* found through libascendcl too") {
  temp_dir root("acl_only");
  const auto rt = load_acl_only(root);
  // aclrtGetVersion is deprecated in the newest runtime: optional, like the 9.0-only functions
  CHECK(static_cast<bool>(rt->api().aclFinalize));
  CHECK(static_cast<bool>(rt->api().aclrtGetVersion));
  CHECK(static_cast<bool>(rt->api().aclFinalizeReference));
  // the emulated libascendcl does not export aclprof*: with libmsprofiler absent, no profiler, and
  // the message names both places loom looks
  CHECK_FALSE(rt->has_profiler());
  CHECK(rt->searched_for("aclprofStart") == "libascendcl.so, libmsprofiler.so");
  // a runtime that did not initialise ACL finalizes nothing
  CHECK(rt->finalize() == 0);
}

TEST_CASE("ascend runtime: a toolkit without operator or HCCL libraries loads, and using them names what is missing") {
  temp_dir root("partial");
  const auto partial = load_acl_only(root);
  CHECK_FALSE(partial->has_operators());
  CHECK_FALSE(partial->has_hccl());
  CHECK_FALSE(static_cast<bool>(partial->api().aclnnMatmul));
  CHECK(static_cast<bool>(partial->api().aclrtMalloc));

  loom::device::ascend_device dev(partial, 5);
  auto& ctx = dev.context();
  dbuf<float> x(16, ctx.stream), y(16, ctx.stream);
  using ops = loom::kernels::ops<npu, float>;
  CHECK_THROWS_WITH_AS(ops::gelu_forward(ctx, y.data(), x.data(), 16),
                       doctest::Contains("aclCreateTensor failed with code 561003: not exported by the loaded CANN"),
                       loom::device_error);
  CHECK_THROWS_WITH_AS(
      loom::parallel::comm::hccl::create_from_file(root.path / "root_info", 1, 0, ctx),
      doctest::Contains("HCCL is not available"), loom::device_error);
}

TEST_CASE("ascend runtime: policy calls on a thread without a device say which object to create") {
  std::thread([] {
    CHECK_THROWS_WITH_AS(npu::synchronize(nullptr), doctest::Contains("ascend_device(runtime, ordinal)"),
                         loom::device_error);
  }).join();
}

TEST_CASE("ascend peak table: the SoC name from aclrtGetSocName picks the row; unknown SoCs and precisions give NaN MFU") {
  loom::device::ascend_device dev(runtime(), 0);
  // the emulation reports "Ascend910B-emulated (...)": the Ascend910B row, by longest prefix
  const auto p = loom::device::ascend_peak_of(*runtime());
  REQUIRE(p.has_value());
  CHECK(p->soc_prefix == "Ascend910B");
  CHECK(p->flops("bf16") == 280e12);
  CHECK(p->flops("fp16") == 280e12);
  CHECK(std::isnan(p->flops("fp32_ascend_matmul")));  // no sourced fp32 cube figure: NaN, not a guess
  CHECK_FALSE(p->confirmed);
  CHECK(p->source.find("unconfirmed") != std::string_view::npos);
  CHECK(loom::device::ascend_peak_for("Ascend910B3")->soc_prefix == "Ascend910B");
  const auto first_gen = loom::device::ascend_peak_for("Ascend910A");
  REQUIRE(first_gen.has_value());
  CHECK(first_gen->soc_prefix == "Ascend910");
  CHECK(first_gen->flops("fp16") == 256e12);
  CHECK(std::isnan(first_gen->flops("bf16")));  // first-generation parts have no bf16
  CHECK_FALSE(loom::device::ascend_peak_for("Ascend310P3").has_value());
  CHECK_FALSE(loom::device::ascend_peak_for("").has_value());
  // MFU of a GPT step against it: 6 N flops per token (N = 1e8), 2e5 tokens/s on 2 NPUs
  const double flops_per_token = 6.0 * 1e8, tokens_per_s = 2e5;
  CHECK(loom::train::mfu(flops_per_token, tokens_per_s, 2 * p->flops("bf16")) == doctest::Approx(1.2e14 / 5.6e14));
  CHECK(std::isnan(loom::train::mfu(flops_per_token, tokens_per_s, p->flops("fp32"))));
  const auto user = loom::device::peak_override(313, "datasheet of my part");
  CHECK(user.flops("fp32") == 313e12);
}
