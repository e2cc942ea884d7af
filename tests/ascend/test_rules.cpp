// The documented operator and HCCL rules the emulation enforces, one test per rule, each asserting
// the status code CANN returns (aclnn return codes: 161002 ACLNN_ERR_PARAM_INVALID, 561002
// ACLNN_ERR_INNER_TILING_ERROR; runtime 507015 ACL_ERROR_RT_AICORE_EXCEPTION; HcclResult 1
// HCCL_E_PARA, 5 HCCL_E_NOT_SUPPORT). Sources are cited at each rule in emulation/src and in
// docs/ascend.md. The calls are raw (no loom wrapper) so that each test exercises the rule itself;
// loom's own calls meeting the rules are tested in test_kernels.cpp and test_hccl.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/comm_threads.hpp>

#include "support.hpp"

using namespace loom_test;

namespace {
/// A raw contiguous ND descriptor over device memory p.
acl::aclTensor* raw(void* p, acl::aclDataType dt, std::vector<int64_t> dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  int64_t storage = 1;
  for (auto d : dims) storage *= d;
  return api().aclCreateTensor(dims.data(), dims.size(), dt, strides.data(), 0, acl::format_nd, &storage, 1, p);
}

/// Device buffers and descriptors of one cross-entropy call: input (N, C) fp32, target (N) of
/// `target_dt`, loss/zloss/lse (N), logProb (N, C); reduction "none".
struct ce_call {
  dbuf<float> x, loss, lp, zloss, lse, grad;
  dbuf<std::int64_t> t;  // 8 bytes per row: large enough for INT32 targets too
  acl::aclTensor *X, *T, *L, *LP, *Z, *S, *G;
  ce_call(loom::context<npu>& ctx, int64_t N, int64_t C, acl::aclDataType target_dt)
      : x(std::size_t(N * C), ctx.stream), loss(std::size_t(N), ctx.stream), lp(std::size_t(N * C), ctx.stream),
        zloss(std::size_t(N), ctx.stream), lse(std::size_t(N), ctx.stream), grad(std::size_t(N), ctx.stream),
        t(std::size_t(N), ctx.stream) {
    X = raw(x.data(), acl::dt_float, {N, C});
    T = raw(t.data(), target_dt, {N});
    L = raw(loss.data(), acl::dt_float, {N});
    LP = raw(lp.data(), acl::dt_float, {N, C});
    Z = raw(zloss.data(), acl::dt_float, {N});
    S = raw(lse.data(), acl::dt_float, {N});
    G = raw(grad.data(), acl::dt_float, {N});
  }
  ~ce_call() {
    for (auto* p : {X, T, L, LP, Z, S, G}) api().aclDestroyTensor(p);
  }
  uint64_t ws = 0;  // phase 1's workspace size
  int forward(int64_t ignore_index, acl::aclOpExecutor** ex) {
    char none[] = "none";
    return api().aclnnCrossEntropyLossGetWorkspaceSize(X, T, nullptr, none, ignore_index, 0.0, 0.0, false, L, LP, Z, S,
                                                       &ws, ex);
  }
  /// Phase 2 of forward() with a workspace of the size phase 1 asked for.
  int run_forward(loom::context<npu>& ctx, acl::aclOpExecutor* ex) {
    dbuf<float> work(std::size_t(ws / sizeof(float) + 1), ctx.stream);
    const int rc = api().aclnnCrossEntropyLoss(work.data(), ws, ex, ctx.stream);
    (void)api().aclrtSynchronizeStream(ctx.stream);  // the workspace dies here; errors stay for the caller's sync
    return rc;
  }
  int backward(int64_t ignore_index, acl::aclOpExecutor** ex) {
    char none[] = "none";
    return api().aclnnCrossEntropyLossGradGetWorkspaceSize(G, LP, T, nullptr, nullptr, nullptr, none, ignore_index, 0.0,
                                                           0.0, X, &ws, ex);
  }
};
std::string recent() {
  const char* m = api().aclGetRecentErrMsg();
  return m ? m : "";
}
}  // namespace

/// Both phase-1 calls of a cross-entropy of (bad_rows, bad_dt) fail with `code` and a recent
/// error message containing `says`; one of (good_rows, good_dt) passes both phases.
static void check_ce_rule(int64_t bad_rows, int64_t bad_classes, acl::aclDataType bad_dt, int code, const std::string& says,
                   int64_t good_rows, int64_t good_classes) {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  acl::aclOpExecutor* ex = nullptr;
  {
    ce_call c(ctx, bad_rows, bad_classes, bad_dt);
    CHECK(c.forward(-100, &ex) == code);
    CHECK(recent().find(says) != std::string::npos);
    CHECK(c.backward(-100, &ex) == code);
  }
  ce_call c(ctx, good_rows, good_classes, acl::dt_int64);
  ctx.synchronize();
  CHECK(c.forward(-100, &ex) == 0);
  CHECK(c.run_forward(ctx, ex) == 0);
  CHECK(api().aclrtSynchronizeStream(ctx.stream) == 0);
}

TEST_CASE("rule: aclnnCrossEntropyLoss[Grad] take INT64 targets only on Ascend910B (INT32 -> 161002)") {
  check_ce_rule(4, 5, acl::dt_int32, 161002, "INT64", 4, 5);
}

TEST_CASE("rule: aclnnCrossEntropyLoss[Grad] need N < 200000 rows per call (-> 561002)") {
  check_ce_rule(200000, 1, acl::dt_int64, 561002, "200000", 199999, 1);
}

TEST_CASE("rule: a negative ignoreIndex ignores nothing, so a target -1 faults on the AI core (-> 507015)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t N = 3, C = 4;
  ce_call c(ctx, N, C, acl::dt_int64);
  const std::vector<std::int64_t> tgt{1, -1, 2};
  npu::copy_to_device(c.t.data(), tgt.data(), tgt.size() * sizeof(std::int64_t), ctx.stream);
  const auto x = randn(std::size_t(N * C), 7);
  npu::copy_to_device(c.x.data(), x.data(), x.size() * sizeof(float), ctx.stream);
  ctx.synchronize();
  acl::aclOpExecutor* ex = nullptr;
  REQUIRE(c.forward(-1, &ex) == 0);  // values are not checked in phase 1: the kernel gathers them
  dbuf<float> work(std::size_t(c.ws / sizeof(float) + 1), ctx.stream);
  REQUIRE(api().aclnnCrossEntropyLoss(work.data(), c.ws, ex, ctx.stream) == 0);
  CHECK(api().aclrtSynchronizeStream(ctx.stream) == 507015);

  // a non-negative ignoreIndex that the row carries is skipped: loss 0 for that row
  const std::vector<std::int64_t> tgt2{1, C, 2};
  npu::copy_to_device(c.t.data(), tgt2.data(), tgt2.size() * sizeof(std::int64_t), ctx.stream);
  ctx.synchronize();
  REQUIRE(c.forward(C, &ex) == 0);
  REQUIRE(c.run_forward(ctx, ex) == 0);
  const auto loss = download(ctx, c.loss.data(), std::size_t(N));
  CHECK(loss[1] == 0.0f);
  CHECK(loss[0] > 0.0f);
}

TEST_CASE("rule: aclnnEmbeddingDenseBackward writes a FLOAT output (16-bit out -> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t N = 6, C = 4, V = 5;
  dbuf<Eigen::bfloat16> g(std::size_t(N * C), ctx.stream), o16(std::size_t(V * C), ctx.stream);
  dbuf<float> o32(std::size_t(V * C), ctx.stream);
  dbuf<std::int32_t> idx(std::size_t(N), ctx.stream);
  const std::vector<std::int32_t> ids{0, 1, 2, 3, 4, 0};
  npu::copy_to_device(idx.data(), ids.data(), ids.size() * sizeof(std::int32_t), ctx.stream);
  ctx.synchronize();
  auto* G = raw(g.data(), acl::dt_bf16, {N, C});
  auto* I = raw(idx.data(), acl::dt_int32, {N});
  auto* O16 = raw(o16.data(), acl::dt_bf16, {V, C});
  auto* O32 = raw(o32.data(), acl::dt_float, {V, C});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnEmbeddingDenseBackwardGetWorkspaceSize(G, I, uint64_t(V), ~uint64_t(0), false, O16, &ws, &ex) ==
        161002);
  CHECK(api().aclnnEmbeddingDenseBackwardGetWorkspaceSize(G, I, uint64_t(V), ~uint64_t(0), false, O32, &ws, &ex) == 0);
  dbuf<float> work(std::size_t(ws / sizeof(float) + 1), ctx.stream);
  CHECK(api().aclnnEmbeddingDenseBackward(work.data(), ws, ex, ctx.stream) == 0);
  ctx.synchronize();
  for (auto* p : {G, I, O16, O32}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnn[Inplace]Add on integer operands refuses a float alpha (-> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t B = 2, T = 3;
  dbuf<std::uint8_t> s(std::size_t(B * T * T), ctx.stream), o(std::size_t(B * T), ctx.stream),
      out(std::size_t(B * T * T), ctx.stream);
  std::vector<std::uint8_t> hs(std::size_t(B * T * T)), ho(std::size_t(B * T));
  for (std::size_t i = 0; i < hs.size(); ++i) hs[i] = std::uint8_t(i % 2);
  for (std::size_t i = 0; i < ho.size(); ++i) ho[i] = std::uint8_t(i % 3 == 0);
  npu::copy_to_device(s.data(), hs.data(), hs.size(), ctx.stream);
  npu::copy_to_device(o.data(), ho.data(), ho.size(), ctx.stream);
  ctx.synchronize();
  auto* S = raw(s.data(), acl::dt_uint8, {B, T, T});
  auto* O = raw(o.data(), acl::dt_uint8, {B, 1, T});  // broadcast over the rows, as a key-padding row
  auto* Out = raw(out.data(), acl::dt_uint8, {B, T, T});
  float one_f = 1.0f;
  std::int64_t one_i = 1;
  auto* alpha_f = api().aclCreateScalar(&one_f, acl::dt_float);
  auto* alpha_i = api().aclCreateScalar(&one_i, acl::dt_int64);
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnInplaceAddGetWorkspaceSize(S, O, alpha_f, &ws, &ex) == 161002);
  CHECK(recent().find("alpha") != std::string::npos);
  CHECK(api().aclnnAddGetWorkspaceSize(S, O, alpha_f, Out, &ws, &ex) == 161002);
  // an integer alpha casts to the promoted UINT8: accepted, and the sum is exact
  REQUIRE(api().aclnnInplaceAddGetWorkspaceSize(S, O, alpha_i, &ws, &ex) == 0);
  dbuf<float> work(std::size_t(ws / sizeof(float) + 1), ctx.stream);
  CHECK(api().aclnnInplaceAdd(work.data(), ws, ex, ctx.stream) == 0);
  std::vector<std::uint8_t> got(hs.size());
  npu::copy_to_host(got.data(), s.data(), got.size(), ctx.stream);
  ctx.synchronize();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        const std::size_t k = std::size_t((b * T + i) * T + j);
        CHECK(int(got[k]) == int(hs[k]) + int(ho[std::size_t(b * T + j)]));
      }
  api().aclDestroyScalar(alpha_f);
  api().aclDestroyScalar(alpha_i);
  for (auto* p : {S, O, Out}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: HcclCreateSubCommConfig needs ascending rankIds and a global parent (-> HCCL_E_PARA / _NOT_SUPPORT)") {
  const int world = 4;
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    const int r = boot.rank();
    loom::device::ascend_device dev(runtime(), r);
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create(boot, ctx);
    acl::HcclComm global = hc.native_handle();
    acl::HcclCommConfig cfg;
    acl::hccl_comm_config_init(&cfg);
    // pairs {0,1} and {2,3}, listed in descending order: refused before any rendezvous
    const std::uint32_t lo = std::uint32_t(r & ~1), hi = lo + 1;
    std::uint32_t desc[2] = {hi, lo};
    acl::HcclComm sub = nullptr;
    CHECK(int(api().HcclCreateSubCommConfig(&global, 2, desc, 77, r == int(hi) ? 0u : 1u, &cfg, &sub)) == 1);
    // ascending: accepted
    std::uint32_t asc[2] = {lo, hi};
    REQUIRE(int(api().HcclCreateSubCommConfig(&global, 2, asc, 78 + lo, std::uint32_t(r) - lo, &cfg, &sub)) == 0);
    // a rank outside any new group passes rankIds = NULL and subCommId = 0xFFFFFFFF: no communicator
    acl::HcclComm none = nullptr;
    CHECK(int(api().HcclCreateSubCommConfig(&global, 0, nullptr, 0xFFFFFFFFull, 0, &cfg, &none)) == 0);
    CHECK(none == nullptr);
    // splitting the sub-communicator again is not supported
    std::uint32_t one[1] = {std::uint32_t(r) - lo};
    acl::HcclComm subsub = nullptr;
    CHECK(int(api().HcclCreateSubCommConfig(&sub, 1, one, 79, 0, &cfg, &subsub)) == 5);
    CHECK(int(api().HcclCommDestroy(sub)) == 0);
  });
}

namespace {
/// Sets an environment variable for the scope (restores the previous value).
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};
}  // namespace

TEST_CASE("rule: HcclCommConfig fields \"not set\" (0xffffffff) follow HCCL_BUFFSIZE / HCCL_DETERMINISTIC") {
  const scoped_env buffsize("HCCL_BUFFSIZE", "64"), deterministic("HCCL_DETERMINISTIC", "true");
  const int world = 4;
  loom::comm::run_threads(world, [&](loom::comm::threads& boot) {
    const int r = boot.rank();
    loom::device::ascend_device dev(runtime(), r);
    auto& ctx = dev.context();
    auto hc = loom::comm::hccl::create(boot, ctx);
    acl::HcclComm global = hc.native_handle();
    CHECK(loomemu_hccl_comm_config(global).buffsize_mb == 64);  // no config at all: the environment

    // loom's initialiser (the fallback without CANN's headers) leaves both fields "not set", as
    // CANN 9.0's HcclCommConfigInit does: the split communicator gets the environment's values
    acl::HcclCommConfig cfg;
    acl::hccl_comm_config_init(&cfg);
    CHECK(cfg.hcclBufferSize == 0xffffffffu);
    CHECK(cfg.hcclDeterministic == 0xffffffffu);
    const std::uint32_t lo = std::uint32_t(r & ~1), hi = lo + 1;
    std::uint32_t pair[2] = {lo, hi};
    acl::HcclComm sub = nullptr;
    REQUIRE(int(api().HcclCreateSubCommConfig(&global, 2, pair, 90 + lo, std::uint32_t(r) - lo, &cfg, &sub)) == 0);
    const auto got = loomemu_hccl_comm_config(sub);
    CHECK(got.buffsize_mb == 64);
    CHECK(got.deterministic == 1);
    CHECK(int(api().HcclCommDestroy(sub)) == 0);

    // values that are set win over the environment
    acl::HcclCommConfig mine;
    acl::hccl_comm_config_init(&mine);
    mine.hcclBufferSize = 300;
    mine.hcclDeterministic = 0;
    REQUIRE(int(api().HcclCreateSubCommConfig(&global, 2, pair, 94 + lo, std::uint32_t(r) - lo, &mine, &sub)) == 0);
    CHECK(loomemu_hccl_comm_config(sub).buffsize_mb == 300);
    CHECK(loomemu_hccl_comm_config(sub).deterministic == 0);
    CHECK(int(api().HcclCommDestroy(sub)) == 0);

    // out of range, or not initialised by HcclCommConfigInit: HCCL_E_PARA (every rank, before any
    // rendezvous)
    acl::HcclCommConfig bad = cfg;
    bad.hcclBufferSize = 0;
    CHECK(int(api().HcclCreateSubCommConfig(&global, 2, pair, 98 + lo, std::uint32_t(r) - lo, &bad, &sub)) == 1);
    bad = cfg;
    bad.hcclDeterministic = 2;
    CHECK(int(api().HcclCreateSubCommConfig(&global, 2, pair, 98 + lo, std::uint32_t(r) - lo, &bad, &sub)) == 1);
    acl::HcclCommConfig zero{};
    CHECK(int(api().HcclCreateSubCommConfig(&global, 2, pair, 98 + lo, std::uint32_t(r) - lo, &zero, &sub)) == 1);
    CHECK(recent().find("HcclCommConfigInit") != std::string::npos);

    // loom's own split() passes the initialiser's config
    auto half = hc.split(r / 2, r);
    CHECK(loomemu_hccl_comm_config(half.native_handle()).buffsize_mb == 64);
    CHECK(loomemu_hccl_comm_config(half.native_handle()).deterministic == 1);
  });
}

/// Runs phase 2 of ex with a workspace of ws bytes and synchronizes; returns phase 2's status.
static int run_phase2(loom::context<npu>& ctx, acl::aclnnStatus (*phase2)(void*, uint64_t, acl::aclOpExecutor*, acl::aclrtStream),
                      acl::aclOpExecutor* ex, uint64_t ws) {
  dbuf<float> work(std::size_t(ws / sizeof(float) + 1), ctx.stream);
  const int rc = phase2(work.data(), ws, ex, ctx.stream);
  (void)api().aclrtSynchronizeStream(ctx.stream);
  return rc;
}

TEST_CASE("rule: aclnnAmax writes out of self's dtype, reduces named axes once each (-> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t N = 3, C = 5;
  const std::vector<float> hx{1, -2, 7, 0, 3, -1, -5, -3, -4, -2, 9, 9, 8, 0, 1};
  dbuf<float> x(hx.size(), ctx.stream), o(std::size_t(N), ctx.stream);
  dbuf<Eigen::bfloat16> o16(std::size_t(N), ctx.stream);
  npu::copy_to_device(x.data(), hx.data(), hx.size() * sizeof(float), ctx.stream);
  auto* X = raw(x.data(), acl::dt_float, {N, C});
  auto* O = raw(o.data(), acl::dt_float, {N});
  auto* O16 = raw(o16.data(), acl::dt_bf16, {N});
  const int64_t d1[] = {1}, d_twice[] = {1, -1}, d_out[] = {2};
  auto* dim = api().aclCreateIntArray(d1, 1);
  auto* twice = api().aclCreateIntArray(d_twice, 2);
  auto* outside = api().aclCreateIntArray(d_out, 1);
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnAmaxGetWorkspaceSize(X, dim, false, O16, &ws, &ex) == 161002);  // out must be FLOAT like self
  CHECK(api().aclnnAmaxGetWorkspaceSize(X, twice, false, O, &ws, &ex) == 161002);  // axis 1 named twice
  CHECK(recent().find("repeated") != std::string::npos);
  CHECK(api().aclnnAmaxGetWorkspaceSize(X, outside, false, O, &ws, &ex) == 161002);  // axis 2 of a 2-D self
  CHECK(api().aclnnAmaxGetWorkspaceSize(X, dim, true, O, &ws, &ex) == 161002);  // keepDim: out is (N, 1)
  CHECK(api().aclnnAmaxGetWorkspaceSize(X, nullptr, false, O, &ws, &ex) == 161001);
  REQUIRE(api().aclnnAmaxGetWorkspaceSize(X, dim, false, O, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnAmax, ex, ws) == 0);
  CHECK(download(ctx, o.data(), std::size_t(N)) == std::vector<float>{7, -1, 9});
  api().aclDestroyIntArray(dim);
  api().aclDestroyIntArray(twice);
  api().aclDestroyIntArray(outside);
  for (auto* p : {X, O, O16}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnnReduceSum's dtype must equal out's, axes in range (-> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t N = 2, C = 3;
  const std::vector<float> hx{1, 2, 3, 4, 5, 6};
  dbuf<float> x(hx.size(), ctx.stream), o(std::size_t(N), ctx.stream);
  npu::copy_to_device(x.data(), hx.data(), hx.size() * sizeof(float), ctx.stream);
  auto* X = raw(x.data(), acl::dt_float, {N, C});
  auto* O = raw(o.data(), acl::dt_float, {N});
  const int64_t d1[] = {-1}, d_out[] = {-3};
  auto* dim = api().aclCreateIntArray(d1, 1);
  auto* outside = api().aclCreateIntArray(d_out, 1);
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnReduceSumGetWorkspaceSize(X, dim, false, acl::dt_float16, O, &ws, &ex) == 161002);
  CHECK(recent().find("dtype") != std::string::npos);
  CHECK(api().aclnnReduceSumGetWorkspaceSize(X, outside, false, acl::dt_float, O, &ws, &ex) == 161002);
  CHECK(api().aclnnReduceSumGetWorkspaceSize(nullptr, dim, false, acl::dt_float, O, &ws, &ex) == 161001);
  REQUIRE(api().aclnnReduceSumGetWorkspaceSize(X, dim, false, acl::dt_float, O, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnReduceSum, ex, ws) == 0);
  CHECK(download(ctx, o.data(), std::size_t(N)) == std::vector<float>{6, 15});
  api().aclDestroyIntArray(dim);
  api().aclDestroyIntArray(outside);
  for (auto* p : {X, O}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnnClamp on INT64 takes integer bounds only; a bound is required (-> 161002 / 161001)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const std::vector<std::int64_t> hx{-7, -1, 0, 3, 16, 99};
  const auto n = int64_t(hx.size());
  dbuf<std::int64_t> x(hx.size(), ctx.stream), o(hx.size(), ctx.stream);
  npu::copy_to_device(x.data(), hx.data(), hx.size() * sizeof(std::int64_t), ctx.stream);
  auto* X = raw(x.data(), acl::dt_int64, {n});
  auto* O = raw(o.data(), acl::dt_int64, {n});
  std::int64_t lo = -1, hi = 16;
  float lo_f = -1.0f;
  auto* Lo = api().aclCreateScalar(&lo, acl::dt_int64);
  auto* Hi = api().aclCreateScalar(&hi, acl::dt_int64);
  auto* LoF = api().aclCreateScalar(&lo_f, acl::dt_float);
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnClampGetWorkspaceSize(X, LoF, Hi, O, &ws, &ex) == 161002);  // FLOAT does not cast to INT64
  CHECK(api().aclnnClampGetWorkspaceSize(X, nullptr, nullptr, O, &ws, &ex) == 161001);
  REQUIRE(api().aclnnClampGetWorkspaceSize(X, Lo, Hi, O, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnClamp, ex, ws) == 0);
  std::vector<std::int64_t> got(hx.size());
  npu::copy_to_host(got.data(), o.data(), got.size() * sizeof(std::int64_t), ctx.stream);
  ctx.synchronize();
  CHECK(got == std::vector<std::int64_t>{-1, -1, 0, 3, 16, 16});
  for (auto* s : {Lo, Hi, LoF}) api().aclDestroyScalar(s);
  for (auto* p : {X, O}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnnInplaceExp / aclnnInplaceLog need a floating selfRef (INT64 -> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  dbuf<std::int64_t> i(4, ctx.stream);
  dbuf<float> f(4, ctx.stream);
  const std::vector<float> hf{0.0f, 1.0f, -2.0f, 0.5f};
  npu::copy_to_device(f.data(), hf.data(), hf.size() * sizeof(float), ctx.stream);
  auto* I = raw(i.data(), acl::dt_int64, {4});
  auto* F = raw(f.data(), acl::dt_float, {4});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnInplaceExpGetWorkspaceSize(I, &ws, &ex) == 161002);
  CHECK(api().aclnnInplaceLogGetWorkspaceSize(I, &ws, &ex) == 161002);
  REQUIRE(api().aclnnInplaceExpGetWorkspaceSize(F, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnInplaceExp, ex, ws) == 0);
  REQUIRE(api().aclnnInplaceLogGetWorkspaceSize(F, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnInplaceLog, ex, ws) == 0);
  const auto got = download(ctx, f.data(), 4);
  for (std::size_t k = 0; k < 4; ++k) CHECK(got[k] == doctest::Approx(hf[k]).epsilon(1e-6));  // log(exp(x)) = x
  for (auto* p : {I, F}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnnRmsNorm[Grad]: gamma of x's dtype or FLOAT32, rstd FLOAT32, dgamma FLOAT32 (-> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t N = 3, C = 8;
  dbuf<Eigen::bfloat16> x(std::size_t(N * C), ctx.stream), y(std::size_t(N * C), ctx.stream), gb(std::size_t(C), ctx.stream);
  dbuf<Eigen::half> gh(std::size_t(C), ctx.stream);
  dbuf<float> g32(std::size_t(C), ctx.stream), r32(std::size_t(N), ctx.stream), dg32(std::size_t(C), ctx.stream);
  dbuf<Eigen::bfloat16> r16(std::size_t(N), ctx.stream);
  auto* X = raw(x.data(), acl::dt_bf16, {N, C});
  auto* Y = raw(y.data(), acl::dt_bf16, {N, C});
  auto* GB = raw(gb.data(), acl::dt_bf16, {C});
  auto* GH = raw(gh.data(), acl::dt_float16, {C});
  auto* G32 = raw(g32.data(), acl::dt_float, {C});
  auto* GWIDE = raw(g32.data(), acl::dt_float, {C / 2});
  auto* R = raw(r32.data(), acl::dt_float, {N, 1});
  auto* RLEAD = raw(r32.data(), acl::dt_float, {N});
  auto* R16 = raw(r16.data(), acl::dt_bf16, {N, 1});
  auto* DG16 = raw(gb.data(), acl::dt_bf16, {C});
  auto* DG32 = raw(dg32.data(), acl::dt_float, {C});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnRmsNormGetWorkspaceSize(X, GH, 1e-5, Y, R, &ws, &ex) == 161002);  // fp16 gamma, bf16 x
  CHECK(recent().find("gamma dtype") != std::string::npos);
  CHECK(api().aclnnRmsNormGetWorkspaceSize(X, GWIDE, 1e-5, Y, R, &ws, &ex) == 161002);  // not x's trailing dims
  CHECK(api().aclnnRmsNormGetWorkspaceSize(X, GB, 1e-5, Y, R16, &ws, &ex) == 161002);  // rstd must be FLOAT32
  CHECK(api().aclnnRmsNormGetWorkspaceSize(X, GB, 1e-5, nullptr, R, &ws, &ex) == 161001);
  REQUIRE(api().aclnnRmsNormGetWorkspaceSize(X, G32, 1e-5, Y, R, &ws, &ex) == 0);  // FLOAT32 gamma: documented
  CHECK(run_phase2(ctx, api().aclnnRmsNorm, ex, ws) == 0);
  CHECK(api().aclnnRmsNormGradGetWorkspaceSize(X, X, R, GB, Y, DG16, &ws, &ex) == 161002);  // dgamma FLOAT32 only
  CHECK(recent().find("dgammaOut") != std::string::npos);
  REQUIRE(api().aclnnRmsNormGradGetWorkspaceSize(X, X, RLEAD, GB, Y, DG32, &ws, &ex) == 0);  // leading-dims rstd
  CHECK(run_phase2(ctx, api().aclnnRmsNormGrad, ex, ws) == 0);
  for (auto* p : {X, Y, GB, GH, G32, GWIDE, R, RLEAD, R16, DG16, DG32}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnnSwiGlu[Grad]: dim in range and even, out halved, SwiGluGrad's x 64-byte aligned (-> 161002)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t N = 3;
  dbuf<Eigen::bfloat16> x(std::size_t(N * 64), ctx.stream), o(std::size_t(N * 32), ctx.stream), dx(std::size_t(N * 64), ctx.stream);
  auto* X = raw(x.data(), acl::dt_bf16, {N, 32});     // 64 bytes per row
  auto* X14 = raw(x.data(), acl::dt_bf16, {N, 14});   // 28 bytes per row
  auto* X7 = raw(x.data(), acl::dt_bf16, {N, 7});     // odd along dim
  auto* O = raw(o.data(), acl::dt_bf16, {N, 16});
  auto* O7 = raw(o.data(), acl::dt_bf16, {N, 7});
  auto* OF = raw(o.data(), acl::dt_float16, {N, 16});
  auto* DX = raw(dx.data(), acl::dt_bf16, {N, 32});
  auto* DX14 = raw(dx.data(), acl::dt_bf16, {N, 14});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnSwiGluGetWorkspaceSize(X7, -1, O, &ws, &ex) == 161002);  // odd axis
  CHECK(api().aclnnSwiGluGetWorkspaceSize(X, 2, O, &ws, &ex) == 161002);    // dim outside [-2, 1]
  CHECK(api().aclnnSwiGluGetWorkspaceSize(X, -1, OF, &ws, &ex) == 161002);  // out dtype differs
  CHECK(api().aclnnSwiGluGetWorkspaceSize(X, 0, O, &ws, &ex) == 161002);    // out not halved along dim 0
  REQUIRE(api().aclnnSwiGluGetWorkspaceSize(X, -1, O, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnSwiGlu, ex, ws) == 0);
  CHECK(api().aclnnSwiGluGradGetWorkspaceSize(O7, X14, -1, DX14, &ws, &ex) == 161002);  // 28-byte rows
  CHECK(recent().find("64") != std::string::npos);
  REQUIRE(api().aclnnSwiGluGradGetWorkspaceSize(O, X, -1, DX, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnSwiGluGrad, ex, ws) == 0);
  for (auto* p : {X, X14, X7, O, O7, OF, DX, DX14}) api().aclDestroyTensor(p);
}

TEST_CASE("rule: aclnnRotaryPositionEmbedding[Grad] on A2: modes 0/1, one dtype, even D < 896, contiguous out, "
          "dcos/dsin required (-> 161002 / 161001)") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const int64_t B = 2, S = 5, N = 3, D = 8;
  dbuf<Eigen::bfloat16> x(std::size_t(B * S * N * D), ctx.stream), o(std::size_t(B * S * N * D), ctx.stream),
      cs(std::size_t(S * D), ctx.stream);
  dbuf<float> c32(std::size_t(S * D), ctx.stream);
  auto* X = raw(x.data(), acl::dt_bf16, {B, S, N, D});
  auto* O = raw(o.data(), acl::dt_bf16, {B, S, N, D});
  auto* C = raw(cs.data(), acl::dt_bf16, {1, S, 1, D});
  auto* C32 = raw(c32.data(), acl::dt_float, {1, S, 1, D});
  auto* X7 = raw(x.data(), acl::dt_bf16, {B, S, N, 7});
  auto* C7 = raw(cs.data(), acl::dt_bf16, {1, S, 1, 7});
  const int64_t dims[] = {B, S, N, D}, strided[] = {S * N * D * 2, N * D * 2, D * 2, 1}, storage = B * S * N * D * 2;
  dbuf<Eigen::bfloat16> wide(std::size_t(storage), ctx.stream);
  auto* OS = api().aclCreateTensor(dims, 4, acl::dt_bf16, strided, 0, acl::format_nd, &storage, 1, wide.data());
  auto* EMPTY = raw(cs.data(), acl::dt_bf16, {1, 1, 1, 0});
  uint64_t ws = 0;
  acl::aclOpExecutor* ex = nullptr;
  CHECK(api().aclnnRotaryPositionEmbeddingGetWorkspaceSize(X, C, C, 2, O, &ws, &ex) == 161002);  // quarter: 950 only
  CHECK(recent().find("950") != std::string::npos);
  CHECK(api().aclnnRotaryPositionEmbeddingGetWorkspaceSize(X, C32, C32, 0, O, &ws, &ex) == 161002);  // fp32 tables, bf16 x
  CHECK(api().aclnnRotaryPositionEmbeddingGetWorkspaceSize(X7, C7, C7, 0, O, &ws, &ex) == 161002);   // odd D
  CHECK(api().aclnnRotaryPositionEmbeddingGetWorkspaceSize(X, C, C, 0, OS, &ws, &ex) == 161002);     // strided out
  REQUIRE(api().aclnnRotaryPositionEmbeddingGetWorkspaceSize(X, C, C, 0, O, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnRotaryPositionEmbedding, ex, ws) == 0);
  CHECK(api().aclnnRotaryPositionEmbeddingGradGetWorkspaceSize(X, C, C, nullptr, 0, O, nullptr, nullptr, &ws, &ex) ==
        161001);  // dcosOut/dsinOut are required pointers even without x
  REQUIRE(api().aclnnRotaryPositionEmbeddingGradGetWorkspaceSize(X, C, C, nullptr, 0, O, EMPTY, EMPTY, &ws, &ex) == 0);
  CHECK(run_phase2(ctx, api().aclnnRotaryPositionEmbeddingGrad, ex, ws) == 0);
  for (auto* p : {X, O, C, C32, X7, C7, OS, EMPTY}) api().aclDestroyTensor(p);
}
