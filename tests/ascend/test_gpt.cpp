// The whole loom::nn::transformer forward, backward and AdamW step on device::ascend (through loom's host
// emulation of ACL/aclnn) against the same model on device::cpu, from identical parameters
// (fp32 against fp32; bf16 with fp32 gradients against cpu/bf16); the trainer; the consistency
// checker (verify::compare) with an ascend/bf16 side; the profile window driving the CANN
// profiler (aclprof*) around exactly the window's steps; the copy stream that brings the batches
// and the step's single host wait.
#include <doctest/doctest.h>

#include <cmath>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <loom/device/ascend_profiler.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/trace.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/train/ascend_phase_timer.hpp>
#include <loom/train/trainer.hpp>
#include <loom/verify/compare.hpp>

#include "support.hpp"

using namespace loom_test;

namespace {

/// A Llama for the NPU tests: grouped-query attention (4 query heads on 2 key/value heads, head
/// size 8), SwiGLU rows of 2 x 32 elements (aclnnSwiGluGrad documents 64-byte aligned shapes).
struct llama_npu {
  static constexpr std::string_view name = "llama_npu";
  static constexpr loom::models::recipe arch = loom::models::llama;
  static constexpr int n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 32, d_ff = 32, max_seq = 16;
  static constexpr int vocab = 61, vocab_padded = 64;
};

/// The model step on ascend with precision NpuP against cpu with CpuP (kernels::reference attention
/// for fp32 multi-head models, fused otherwise), from identical parameters.
template <class NpuP, class CpuP, class M = loom::models::tiny>
void compare_with_cpu(double loss_rel, double grad_nmse, double param_nmse) {
  using S = typename NpuP::storage;
  using CS = typename CpuP::storage;
  constexpr bool mha = loom::models::kv_heads_of<M>() == M::n_head;
  using cpu_attn = std::conditional_t<std::is_same_v<CS, float> && mha, loom::kernels::reference, loom::kernels::fused>;
  using cpu_model = loom::nn::transformer<M, loom::policy<loom::device::cpu, CpuP>, cpu_attn>;
  using npu_model = loom::nn::transformer<M, loom::policy<npu, NpuP>, loom::kernels::fused>;
  // parameter gradients are fp32 on both devices for every precision here (kernels::gradient_t)
  static_assert(std::is_same_v<typename npu_model::grad_t, float>);
  static_assert(std::is_same_v<typename cpu_model::grad_t, float>);
  constexpr int B = 3, T = 9;  // activation capacity
  const int b = 2, t = 7;      // a shorter micro-batch than the capacity

  loom::context<loom::device::cpu> cctx;
  loom::device::ascend_device dev(runtime(), 0);
  auto& nctx = dev.context();
  cpu_model cm(cctx, 7);
  npu_model nm(nctx, 7);
  // random perturbation of every parameter (LayerNorm gains/biases included), rounded to S
  auto cp = cm.parameters();
  const auto r = randn(cp.size(), 99, 0.05f);
  for (std::size_t i = 0; i < cp.size(); ++i) cp[i] = CS(float(S(float(cp[i]) + r[i])));
  {
    const auto host = to<S>(to_float(std::vector<CS>(cp.begin(), cp.end())));
    npu::copy_to_device(nm.parameters().data(), host.data(), host.size() * sizeof(S), nctx.stream);
  }
  const auto before = to_float(std::vector<CS>(cp.begin(), cp.end()));
  std::vector<std::int32_t> in(std::size_t(b) * t), tg(std::size_t(b) * t);
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = std::int32_t((i * 29 + 3) % M::vocab);
    tg[i] = std::int32_t((i * 17 + 11) % M::vocab);
  }
  tg[5] = loom::kernels::cpu::ignore_index;
  auto din = upload<std::int32_t>(nctx, in), dtg = upload<std::int32_t>(nctx, tg);
  const float scale = 1.0f / float(b * t - 1);

  typename cpu_model::template activations<B, T> cacts(cctx);
  typename npu_model::template activations<B, T> nacts(nctx);
  cm.zero_grad(cctx);
  nm.zero_grad(nctx);
  const float closs = cm.forward(cctx, cacts, in.data(), tg.data(), b, t, scale);
  const float nloss = nm.forward(nctx, nacts, din.data(), dtg.data(), b, t, scale);
  CHECK(closs > 3.0f);
  CHECK(nloss == doctest::Approx(closs).epsilon(loss_rel));
  const auto nlosses = download(nctx, nacts.losses(), std::size_t(b) * t);
  const std::vector<float> closses(cacts.losses(), cacts.losses() + std::size_t(b) * t);
  CHECK(nmse(nlosses, closses) < loss_rel * loss_rel);
  double worst_grad = 0;

  cm.backward(cctx, cacts, in.data(), b, t);
  nm.backward(nctx, nacts, din.data(), b, t);
  for (int k = 0; k < int(loom::models::num_params<M>); ++k) {
    const auto g = nm.gradient(std::size_t(k));
    const auto cg = cm.gradient(std::size_t(k));
    INFO("gradient of " << cpu_model::table[k].name);
    const double e = nmse(download(nctx, g.data(), g.size()), std::vector<float>(cg.begin(), cg.end()));
    worst_grad = std::max(worst_grad, e);
    CHECK(e < grad_nmse);
  }

  // one AdamW step with clipping, the optimizer running through ops::adamw on each device
  loom::optim::adamw_config cfg;
  loom::optim::adamw<cpu_model> copt(cctx, cfg, cm);
  loom::optim::adamw<npu_model> nopt(nctx, cfg, nm);
  const double cnorm = loom::optim::adamw<cpu_model>::grad_norm(cctx, cm);
  const double nnorm = loom::optim::adamw<npu_model>::grad_norm(nctx, nm);
  CHECK(nnorm == doctest::Approx(cnorm).epsilon(loss_rel));
  copt.update(cctx, cm, 1e-2, loom::optim::clip_coefficient(cnorm, cfg.max_grad_norm));
  nopt.update(nctx, nm, 1e-2, loom::optim::clip_coefficient(nnorm, cfg.max_grad_norm));
  // the updates are ~lr relative to the parameters, so a wrong or missing update fails this
  const auto np = download(nctx, nm.parameters().data(), nm.parameters().size());
  const auto cp_after = cm.parameters();
  const double pe = nmse(np, to_float(std::vector<CS>(cp_after.begin(), cp_after.end())));
  const double moved = nmse(before, to_float(std::vector<CS>(cp_after.begin(), cp_after.end())));
  MESSAGE(M::name << " " << NpuP::name << " on ascend vs " << CpuP::name << " on cpu: worst gradient NMSE " << worst_grad
                     << ", parameter NMSE after the step " << pe << " (the step itself moved them by NMSE " << moved << ")");
  CHECK(pe < param_nmse);
}

}  // namespace

TEST_CASE("gpt<tiny> on ascend/fp32 (deliberate fp32 matmul, emulated): loss, every gradient and an AdamW step match cpu/fp32") {
  compare_with_cpu<loom::precision::fp32_ascend_matmul, loom::precision::fp32>(1e-5, 1e-9, 1e-8);  // Adam amplifies tiny-gradient noise
}

TEST_CASE("gpt<tiny> on ascend/bf16 (emulated): fp32 gradients; loss, every gradient and an AdamW step match cpu/bf16") {
  // measured (emulation): worst gradient NMSE 4.7e-5, parameters after the step 8.1e-5 while the
  // step moves them by 9.6e-3
  compare_with_cpu<loom::precision::bf16, loom::precision::bf16>(2e-2, 5e-4, 5e-4);
}

TEST_CASE("llama on ascend/fp32 (RMSNorm, RoPE, SwiGLU, grouped-query flash attention; emulated): loss, every "
          "gradient and an AdamW step match cpu/fp32") {
  compare_with_cpu<loom::precision::fp32_ascend_matmul, loom::precision::fp32, llama_npu>(1e-5, 1e-9, 1e-8);
}

TEST_CASE("llama on ascend/bf16 (emulated): fp32 gradients; loss, every gradient and an AdamW step match cpu/bf16") {
  compare_with_cpu<loom::precision::bf16, loom::precision::bf16, llama_npu>(2e-2, 5e-4, 5e-4);
}

TEST_CASE("recompute on ascend (emulated): selective and full give bitwise the loss and gradients of none (llama bf16)") {
  using npu_model = loom::nn::transformer<llama_npu, loom::policy<npu, loom::precision::bf16>, loom::kernels::fused>;
  constexpr int B = 3, T = 9;
  const int b = 2, t = 7;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  std::vector<std::int32_t> in(std::size_t(b) * t), tg(std::size_t(b) * t);
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = std::int32_t((i * 29 + 3) % llama_npu::vocab);
    tg[i] = std::int32_t((i * 17 + 11) % llama_npu::vocab);
  }
  auto din = upload<std::int32_t>(ctx, in), dtg = upload<std::int32_t>(ctx, tg);
  npu_model m(ctx, 7);
  std::vector<float> ref;
  float ref_loss = 0;
  for (auto r : {loom::nn::recompute::none, loom::nn::recompute::selective, loom::nn::recompute::full}) {
    CAPTURE(loom::nn::recompute_name(r));
    typename npu_model::template activations<B, T> acts(ctx, r);
    m.zero_grad(ctx);
    const float loss = m.forward(ctx, acts, din.data(), dtg.data(), b, t, 1.0f / float(b * t));
    m.backward(ctx, acts, din.data(), b, t);
    const auto g = download(ctx, m.gradients().data(), m.gradients().size());
    if (r == loom::nn::recompute::none) {
      ref = g;
      ref_loss = loss;
      continue;
    }
    CHECK(std::memcmp(&loss, &ref_loss, sizeof loss) == 0);
    REQUIRE(g.size() == ref.size());
    CHECK(std::memcmp(g.data(), ref.data(), g.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("trainer<tiny> on ascend/fp32 (emulated): three steps with gradient accumulation track cpu/fp32") {
  using M = loom::models::tiny;
  constexpr int B = 2, T = 8;
  loom::train::trainer_config cfg;
  cfg.grad_accum = 2;
  cfg.schedule = {3e-3, 3e-4, 1, 10};
  cfg.seed = 11;
  loom::context<loom::device::cpu> cctx;
  loom::device::ascend_device dev(runtime(), 0);
  loom::train::trainer<M, loom::policy<loom::device::cpu, loom::precision::fp32>, B, T> ct(cctx, cfg);
  loom::train::trainer<M, loom::policy<npu, loom::precision::fp32_ascend_matmul>, B, T, loom::parallel::local_group, loom::kernels::fused> nt(dev.context(), cfg);
  std::vector<std::int32_t> windows(ct.windows_per_step() * ct.window());
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < windows.size(); ++i) windows[i] = std::int32_t((i * 7 + std::size_t(s) * 13 + 1) % M::vocab);
    const auto cr = ct.step(cctx, windows);
    const auto nr = nt.step(dev.context(), windows);
    CAPTURE(s);
    CHECK(nr.loss == doctest::Approx(cr.loss).epsilon(1e-5));
    CHECK(nr.grad_norm == doctest::Approx(cr.grad_norm).epsilon(1e-4));
    CHECK(nr.lr == cr.lr);
    CHECK_FALSE(nr.skipped);
  }
}

// Dropout runs on the CPU only so far: the Ascend ops have no dropout kernel and the aclnn
// attention takes no attention_dropout, so a trainer with dropout > 0 is refused when built.
static_assert(!loom::nn::transformer<loom::models::tiny, loom::policy<npu, loom::precision::bf16>>::supports_dropout);
static_assert(loom::nn::transformer<loom::models::tiny, loom::policy<loom::device::cpu, loom::precision::bf16>>::supports_dropout);

TEST_CASE("trainer<tiny> on ascend (emulated): --dropout > 0 is refused with a sentence; 0 trains") {
  using M = loom::models::tiny;
  loom::device::ascend_device dev(runtime(), 0);
  loom::train::trainer_config cfg;
  cfg.schedule = {3e-3, 3e-4, 1, 10};
  cfg.dropout = 0.1;
  using npu_trainer = loom::train::trainer<M, loom::policy<npu, loom::precision::fp32_ascend_matmul>, 2, 8, loom::parallel::local_group, loom::kernels::fused>;
  CHECK_THROWS_WITH_AS(npu_trainer(dev.context(), cfg), doctest::Contains("dropout runs on the CPU only so far"),
                       loom::input_error);
  cfg.dropout = 0;
  CHECK_NOTHROW(npu_trainer(dev.context(), cfg));
}

TEST_CASE("verify::compare: cpu/fp32 against ascend/bf16 (emulated) passes bf16's tolerance and names a perturbed weight first") {
  using M = loom::models::tiny;
  // A: the same cpu/fp32 model type as the step comparison above (reference attention; one fewer
  // model instantiation in this translation unit)
  using cpu_model = loom::nn::transformer<M, loom::policy<loom::device::cpu, loom::precision::fp32>, loom::kernels::reference>;
  using npu_model = loom::nn::transformer<M, loom::policy<npu, loom::precision::bf16>, loom::kernels::fused>;
  constexpr int B = 2, T = 11;
  loom::verify::batch<B, T> x;
  for (int i = 0; i < B * T; ++i) {
    x.inputs.push_back(std::int32_t((i * 29 + 3) % M::vocab));
    x.targets.push_back(std::int32_t((i * 17 + 11) % M::vocab));
  }
  x.targets[4] = loom::kernels::ignore_index;
  loom::context<loom::device::cpu> cctx;
  loom::device::ascend_device dev(runtime(), 0);
  auto& nctx = dev.context();
  cpu_model a(cctx, 5);
  npu_model b(nctx, 99);  // different init: compare copies A's weights

  const auto r = loom::verify::compare(a, cctx, b, nctx, x);
  double worst_act = 0, worst_grad = 0;
  for (const auto& s : r.rows) (s.gradient ? worst_grad : worst_act) = std::max(s.gradient ? worst_grad : worst_act, s.rel_error);
  MESSAGE("ascend/bf16 vs cpu/fp32: worst relative error " << worst_act << " (activations), " << worst_grad
                                                           << " (gradients)");
  INFO(loom::verify::format(r));
  CHECK(r.policy_b == "ascend/bf16");
  // the tolerances of the CPU fp32-vs-bf16 comparison (tests/unit/verify/test_compare.cpp)
  constexpr auto tol = loom::verify::tolerance_for<loom::precision::fp32, loom::precision::bf16>();
  CHECK(r.tol.activation == tol.activation);
  CHECK(r.tol.gradient == tol.gradient);
  CHECK(r.pass());
  CHECK(r.rows.size() == std::size_t(1 + 8 * M::n_layer + 3 + 1 + 2 + 12 * M::n_layer + 2));
  CHECK(worst_act > 1e-3);  // bf16 rounding is visible (the comparison is not vacuous)
  CHECK(r.loss_b == doctest::Approx(r.loss_a).epsilon(2e-2));

  // the same weights loaded by the caller, then one weight deliberately perturbed by ~10 %
  loom::verify::copy_parameters(a, cctx, b, nctx);
  const auto w = b.parameter(loom::models::param::fc_w);
  const std::size_t per = w.size() / M::n_layer, off = per;  // layer 1
  auto host = download(nctx, w.data() + off, per);
  const auto noise = randn(per, 5, 0.1f);
  for (std::size_t i = 0; i < per; ++i) host[i] *= 1.0f + noise[i];
  const auto hb = to<Eigen::bfloat16>(host);
  npu::copy_to_device(w.data() + off, hb.data(), per * sizeof(Eigen::bfloat16), nctx.stream);
  loom::verify::compare_options opt;
  opt.copy_weights = false;
  const auto rp = loom::verify::compare(a, cctx, b, nctx, x, opt);
  INFO(loom::verify::format(rp));
  CHECK_FALSE(rp.pass());
  REQUIRE(rp.first_failure() != nullptr);
  CHECK(rp.first_failure()->name == "weight layer 1 fc_w");
  CHECK(rp.first_failure()->rel_error > 5e-2);
  CHECK(loom::verify::format(rp).find("FAIL: first disagreement at 'weight layer 1 fc_w'") != std::string::npos);
  // every other weight agrees, and the first activation to fail is the one computed from it
  std::size_t failing_weights = 0;
  const loom::verify::tensor_stats* first_act = nullptr;
  for (const auto& s : rp.rows) {
    if (s.name.rfind("weight ", 0) == 0) failing_weights += !s.pass;
    else if (!s.pass && !first_act) first_act = &s;
  }
  CHECK(failing_weights == 1);
  REQUIRE(first_act != nullptr);
  CHECK(first_act->name == "layer 1 fc");
  CHECK(rp.rows.size() == r.rows.size() + std::size_t(2 + 12 * M::n_layer + 2));
}

TEST_CASE("profile window on ascend (emulated): steps 2:4 start and stop the CANN profiler around exactly those steps") {
  using M = loom::models::tiny;
  constexpr int B = 2, T = 8;
  loom::train::trainer_config cfg;
  cfg.schedule = {3e-3, 3e-4, 1, 10};
  cfg.seed = 3;
  loom::device::ascend_device dev(runtime(), 0);
  loom::train::trainer<M, loom::policy<npu, loom::precision::fp32_ascend_matmul>, B, T, loom::parallel::local_group, loom::kernels::fused> nt(dev.context(), cfg);
  using log_fn = std::size_t(loomemu_prof_event*, std::size_t);
  emu<void()>("loomemu_profiler_clear")();
  const auto dir = std::filesystem::temp_directory_path() / ("loom_msprof_" + std::to_string(::getpid()));
  loom::device::ascend_profiler prof(runtime(), {.output_dir = dir, .devices = {0}});
  loom::io::trace_recorder trace({.window = loom::io::step_window::parse("2:4"),
                                  .on_start = [&] { prof.start(); },
                                  .on_stop = [&] { prof.stop(); }});
  std::vector<std::int32_t> windows(nt.windows_per_step() * nt.window());
  std::vector<std::uint64_t> launches_before;  // aclnn launches enqueued before step s
  for (int s = 0; s < 6; ++s) {
    launches_before.push_back(loomemu_get_counters().executors_run);
    trace.begin_step(s);
    CHECK(prof.running() == (s == 2 || s == 3));
    for (std::size_t i = 0; i < windows.size(); ++i) windows[i] = std::int32_t((i * 5 + std::size_t(s) + 2) % M::vocab);
    nt.step(dev.context(), windows);
  }
  trace.stop();
  CHECK(std::filesystem::is_directory(dir));
  loomemu_prof_event log[8]{};
  const std::size_t n = emu<log_fn>("loomemu_profiler_log")(log, 8);
  REQUIRE(n == 4);  // one session: init, start, stop, finalize — nothing after the window
  CHECK(log[0].kind == LOOMEMU_PROF_INIT);
  CHECK(log[1].kind == LOOMEMU_PROF_START);
  CHECK(log[2].kind == LOOMEMU_PROF_STOP);
  CHECK(log[3].kind == LOOMEMU_PROF_FINALIZE);
  // started after step 1's last launch and before step 2's first; stopped right after step 3's last
  CHECK(launches_before[2] > launches_before[1]);
  CHECK(log[1].executors_run == launches_before[2]);
  CHECK(log[2].executors_run == launches_before[4]);
  CHECK(log[2].executors_run - log[1].executors_run == launches_before[4] - launches_before[2]);
  CHECK(launches_before[4] - launches_before[3] == launches_before[3] - launches_before[2]);  // two whole steps
  CHECK(log[1].device_count == 1);
  CHECK(log[1].data_type_config == (loom::device::acl::prof_acl_api | loom::device::acl::prof_task_time |
                                    loom::device::acl::prof_hccl_trace | loom::device::acl::prof_training_trace));
  CHECK_FALSE(prof.running());
  CHECK_THROWS_AS(prof.start(), loom::input_error);  // one window per profiler
  // the emulation enforces the documented order: stop without a session's config is refused
  CHECK(api().aclprofStop(nullptr) != 0);
  CHECK(api().aclprofFinalize() != 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("ascend_phase_timer (emulated): device-time breakdown of trainer steps from stream events") {
  using M = loom::models::tiny;
  using loom::train::phase;
  constexpr int B = 2, T = 8;
  loom::train::trainer_config cfg;
  cfg.grad_accum = 2;
  cfg.schedule = {3e-3, 3e-4, 1, 10};
  cfg.seed = 5;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  loom::train::trainer<M, loom::policy<npu, loom::precision::fp32_ascend_matmul>, B, T, loom::parallel::local_group, loom::kernels::fused> nt(ctx, cfg);
  loom::train::ascend_phase_timer dt(dev.runtime(), ctx.stream);
  int transitions = 0;
  nt.on_phase = [&](phase p, bool begin) {
    ++transitions;
    begin ? dt.enter(p) : dt.leave();
  };
  std::vector<std::int32_t> windows(nt.windows_per_step() * nt.window());
  for (std::size_t i = 0; i < windows.size(); ++i) windows[i] = std::int32_t((i * 7 + 1) % M::vocab);
  for (int s = 0; s < 2; ++s) {  // the second step reuses the first step's events
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    transitions = 0;
    dt.begin_step();
    nt.step(ctx, windows);
    const auto b = dt.end_step();
    const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(s);
    if (s == 1)
      MESSAGE("device ms: h2d " << 1e3 * b[phase::h2d_copy] << ", forward " << 1e3 * b[phase::forward] << ", backward "
                                << 1e3 * b[phase::backward] << ", optimizer " << 1e3 * b[phase::optimizer] << ", other "
                                << 1e3 * b[phase::other] << ", total " << 1e3 * b.total << " (host " << 1e3 * host << ")");
    CHECK(transitions >= 2 * 4);  // h2d, forward, backward per micro-batch, optimizer: begin and end
    // every phase that enqueues kernels took device time; nothing ran in data_wait
    CHECK(b[phase::forward] > 0);
    CHECK(b[phase::backward] > 0);
    CHECK(b[phase::optimizer] > 0);
    CHECK(b[phase::data_wait] == 0);
    double sum = 0;
    for (double x : b.seconds) sum += x;
    CHECK(sum == doctest::Approx(b.total).epsilon(1e-12));
    // the events were recorded after t0 and completed before end_step returned: a bound, not a speed
    CHECK(b.total > 0);
    CHECK(b.total <= host);
  }
  // without waiting: finish_step records the last event; try_read gives the same kind of
  // breakdown once the stream has passed it (here after a synchronize; in a session, after the
  // next step's loss readback)
  transitions = 0;
  dt.begin_step();
  nt.step(ctx, windows);
  dt.finish_step();
  ctx.synchronize();
  const auto late = dt.try_read();
  REQUIRE(late.has_value());
  double sum = 0;
  for (double x : late->seconds) sum += x;
  CHECK(sum == doctest::Approx(late->total).epsilon(1e-12));
  CHECK((*late)[phase::forward] > 0);
  CHECK((*late)[phase::optimizer] > 0);
}

TEST_CASE("ascend_copy_engine (emulated): a copy beside the compute stream's work, ordered before its next kernel") {
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const std::size_t big = std::size_t(1) << 23, n = 1000;  // 8 Mi adds keep the compute stream busy
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  dbuf<float> a(big, ctx.stream), sum(big, ctx.stream), dst(n, ctx.stream), out(n, ctx.stream);
  auto* src = static_cast<float*>(npu::allocate_host(n * sizeof(float)));
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = want[i] = u(rng);
  {
    loom::device::ascend_copy_engine copier(ctx);
    npu::memset(a.data(), 0, big * sizeof(float), ctx.stream);
    const auto c0 = loomemu_get_counters();
    loom::kernels::ops<npu, float>::residual_forward(ctx, sum.data(), a.data(), a.data(), big);  // queued
    copier.copy_to_device(ctx, dst.data(), src, n * sizeof(float));
    npu::copy(out.data(), dst.data(), n * sizeof(float), ctx.stream);  // after the copy: the stream waited
    copier.release(ctx);
    copier.wait_source_read();
    const auto c1 = loomemu_get_counters();
    // the copy ran on its own stream while the add was queued or running on the compute stream
    CHECK(c1.h2d_copies_beside_work == c0.h2d_copies_beside_work + 1);
    CHECK(c1.h2d_copies_behind_work == c0.h2d_copies_behind_work);
    for (std::size_t i = 0; i < n; ++i) src[i] = -7.0f;  // the source is free again
    const auto got = download(ctx, out.data(), n);
    CHECK(got == want);
    // a second copy into the same destination waits for release(): the stream order holds
    for (std::size_t i = 0; i < n; ++i) src[i] = want[i] * 2.0f;
    copier.copy_to_device(ctx, dst.data(), src, n * sizeof(float));
    copier.wait_source_read();
    for (auto& w : want) w *= 2.0f;
    CHECK(download(ctx, dst.data(), n) == want);
    // pageable memory cannot be copied asynchronously: the copy is synchronous on the compute stream
    std::vector<float> pageable(n, 0.25f);
    copier.copy_to_device(ctx, dst.data(), pageable.data(), n * sizeof(float));
    CHECK(download(ctx, dst.data(), n) == pageable);
  }
  npu::deallocate_host(src);
}

TEST_CASE("trainer<tiny> on ascend (emulated): a pinned batch goes by the copy stream; one host wait per step; the "
          "loss read with the norm is the forward's") {
  using M = loom::models::tiny;
  constexpr int B = 3, T = 7;  // odd sizes
  using policy = loom::policy<npu, loom::precision::fp32_ascend_matmul>;
  using trainer_t = loom::train::trainer<M, policy, B, T, loom::parallel::local_group, loom::kernels::fused>;
  static_assert(trainer_t::device_split && trainer_t::deferred_loss);
  loom::train::trainer_config cfg;
  cfg.grad_accum = 2;
  cfg.schedule = {3e-3, 3e-4, 1, 10};
  cfg.seed = 17;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  trainer_t nt(ctx, cfg);
  const std::size_t ids = nt.windows_per_step() * nt.window();
  auto* windows = static_cast<std::int32_t*>(npu::allocate_host(ids * sizeof(std::int32_t)));
  std::mt19937 rng(29);
  std::uniform_int_distribution<std::int32_t> id(0, M::vocab - 1);
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < ids; ++i) windows[i] = id(rng);
    // the loss the model's forward returns (summed by the kernel after its own readback), before the step
    std::vector<std::int32_t> in(nt.tokens_per_step()), tg(nt.tokens_per_step());
    loom::train::split_windows(std::span<const std::int32_t>(windows, ids), std::size_t(T), in, tg);
    const auto din = upload<std::int32_t>(ctx, in), dtg = upload<std::int32_t>(ctx, tg);
    trainer_t::acts_t acts(ctx);
    double want = 0;
    for (int m = 0; m < cfg.grad_accum; ++m)
      want += double(nt.model().forward(ctx, acts, din.data() + m * B * T, dtg.data() + m * B * T, B, T));
    want /= double(nt.tokens_per_step());
    ctx.synchronize();
    const auto c0 = loomemu_get_counters();
    const auto r = nt.step(ctx, std::span<const std::int32_t>(windows, ids));
    const auto c1 = loomemu_get_counters();
    CAPTURE(s);
    CHECK(r.loss == want);  // the same float row losses, added in the same order
    CHECK(c1.host_waits - c0.host_waits == 1);  // the gradient norm's readback; the losses came with it
    CHECK(c1.sync_copies - c0.sync_copies == 1);  // the norm
    CHECK(c1.async_copies - c0.async_copies >= 3);  // the windows and two micro-batches' losses
  }
  npu::deallocate_host(windows);
}
