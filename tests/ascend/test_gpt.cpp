// The whole loom::gpt forward, backward and AdamW step on device::ascend (through loom's host
// emulation of ACL/aclnn) against the same model on device::cpu, from identical parameters.
#include <doctest/doctest.h>

#include <cmath>
#include <string_view>

#include <loom/device/cpu.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/gpt.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/train/trainer.hpp>

#include "support.hpp"

using namespace loom_test;

namespace {

/// bf16 storage with fp32 compute and masters (a local stand-in until precision::bf16 exists).
struct bf16_storage {
  using storage = Eigen::bfloat16;
  using compute = float;
  using master = float;
  static constexpr bool needs_loss_scaling = false;
  static constexpr std::string_view name = "bf16";
};

template <class Precision>
void compare_with_cpu(double loss_rel, double grad_nmse, double param_nmse) {
  using M = loom::models::tiny;
  using S = typename Precision::storage;
  using cpu_model = loom::gpt<M, loom::policy<loom::device::cpu, loom::precision::fp32>, loom::kernels::reference>;
  using npu_model = loom::gpt<M, loom::policy<npu, Precision>, loom::kernels::fused>;
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
  for (std::size_t i = 0; i < cp.size(); ++i) cp[i] = float(S(cp[i] + r[i]));
  {
    const auto host = to<S>(std::vector<float>(cp.begin(), cp.end()));
    npu::copy_to_device(nm.parameters().data(), host.data(), host.size() * sizeof(S), nctx.stream);
  }
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

  cm.backward(cctx, cacts, in.data(), b, t);
  nm.backward(nctx, nacts, din.data(), b, t);
  for (int k = 0; k < loom::nn::num_param_tensors; ++k) {
    const auto g = nm.gradient(loom::nn::param(k));
    const auto cg = cm.gradient(loom::nn::param(k));
    INFO("gradient of " << cpu_model::table[k].name);
    CHECK(nmse(download(nctx, g.data(), g.size()), std::vector<float>(cg.begin(), cg.end())) < grad_nmse);
  }

  // one AdamW step with clipping, the optimizer running through ops::adamw on each device
  loom::optim::adamw_config cfg;
  loom::optim::adamw<cpu_model> copt(cctx, cfg);
  loom::optim::adamw<npu_model> nopt(nctx, cfg, nm);
  const double cnorm = loom::optim::adamw<cpu_model>::grad_norm(cctx, cm);
  const double nnorm = loom::optim::adamw<npu_model>::grad_norm(nctx, nm);
  CHECK(nnorm == doctest::Approx(cnorm).epsilon(loss_rel));
  copt.update(cctx, cm, 1e-2, loom::optim::clip_coefficient(cnorm, cfg.max_grad_norm));
  nopt.update(nctx, nm, 1e-2, loom::optim::clip_coefficient(nnorm, cfg.max_grad_norm));
  // the updates are ~lr relative to the parameters, so a wrong or missing update fails this
  const auto np = download(nctx, nm.parameters().data(), nm.parameters().size());
  const auto cp_after = cm.parameters();
  CHECK(nmse(np, std::vector<float>(cp_after.begin(), cp_after.end())) < param_nmse);
}

}  // namespace

TEST_CASE("gpt<tiny> on ascend/fp32 (deliberate fp32 matmul, emulated): loss, every gradient and an AdamW step match cpu/fp32") {
  compare_with_cpu<loom::precision::fp32_ascend_matmul>(1e-5, 1e-9, 1e-8);  // Adam amplifies tiny-gradient noise
}

TEST_CASE("gpt<tiny> on ascend/bf16 storage (emulated): forward and backward agree with cpu/fp32") {
  compare_with_cpu<bf16_storage>(2e-2, 5e-3, 5e-4);
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
  loom::train::trainer<M, loom::policy<npu, loom::precision::fp32_ascend_matmul>, B, T, loom::kernels::fused> nt(dev.context(), cfg);
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
