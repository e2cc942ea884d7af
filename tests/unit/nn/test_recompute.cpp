// Activation recomputation (nn::recompute): selective and full give the loss and every gradient
// bitwise equal to none, for both recipes (GPT-2 with dropout, Llama with grouped-query attention
// and RoPE), fp32 and bf16, with a micro-batch and sequence shorter than the table's capacity;
// the tables shrink as the mode says; and on a TP x PP layout with 1F1B (several micro-batches in
// flight, each with its own table) the trained parameters are bitwise those of none.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/trainer.hpp>

using namespace loom;

namespace {

constexpr nn::recompute modes[] = {nn::recompute::none, nn::recompute::selective, nn::recompute::full};

/// Loss and gradients of one forward/backward under recompute mode r, as raw bytes.
template <class M, class Prec>
std::vector<unsigned char> loss_and_gradients(nn::recompute r, double dropout, std::size_t* table_bytes) {
  using P = policy<device::cpu, Prec>;
  using model_t = nn::transformer<M, P>;
  context<device::cpu> ctx;
  model_t model(ctx, 11);
  constexpr int B = 3, T = 9;  // capacity
  const int b = 2, t = 7;      // used
  typename model_t::template activations<B, T> acts(ctx, r);
  *table_bytes = acts.bytes();
  std::vector<std::int32_t> in(b * t), tg(b * t);
  for (int i = 0; i < b * t; ++i) {
    in[i] = std::int32_t(random_below(M::vocab, 5, 0, i));
    tg[i] = std::int32_t(random_below(M::vocab, 5, 1, i));
  }
  tg[3] = kernels::ignore_index;
  const nn::dropout_state drop{dropout, 1234};
  model.zero_grad(ctx);
  const auto loss = model.forward(ctx, acts, in.data(), tg.data(), b, t, typename model_t::acc_t(1.0 / (b * t - 1)), drop);
  model.backward(ctx, acts, in.data(), b, t);
  const auto g = model.gradients();
  std::vector<unsigned char> out(sizeof loss + g.size() * sizeof(g[0]));
  std::memcpy(out.data(), &loss, sizeof loss);
  std::memcpy(out.data() + sizeof loss, g.data(), g.size() * sizeof(g[0]));
  return out;
}

template <class M, class Prec>
void check_bitwise(double dropout) {
  std::size_t bytes[3] = {};
  const auto ref = loss_and_gradients<M, Prec>(modes[0], dropout, &bytes[0]);
  for (int k = 1; k < 3; ++k) {
    CAPTURE(std::string(nn::recompute_name(modes[k])));
    const auto got = loss_and_gradients<M, Prec>(modes[k], dropout, &bytes[k]);
    REQUIRE(got.size() == ref.size());
    CHECK(std::memcmp(got.data(), ref.data(), ref.size()) == 0);
  }
  CHECK(bytes[2] < bytes[1]);
  CHECK(bytes[1] < bytes[0]);
  MESSAGE(std::string(M::name) << " " << std::string(Prec::name) << std::string(dropout > 0 ? " dropout" : "") << ": activation table "
                               << bytes[0] << " / " << bytes[1] << " / " << bytes[2]
                               << " bytes (none / selective / full); loss and gradients bitwise equal");
}

}  // namespace

TEST_CASE("recompute: selective and full give bitwise the loss and gradients of none (GPT-2 with dropout, Llama)") {
  check_bitwise<models::tiny, precision::fp32>(0.1);
  check_bitwise<models::tiny, precision::bf16>(0.0);
  check_bitwise<models::llama_tiny, precision::fp32>(0.0);
  check_bitwise<models::llama_tiny, precision::bf16>(0.1);
}

TEST_CASE("recompute: the table keeps per layer only what the mode keeps") {
  using model_t = nn::transformer<models::tiny, policy<device::cpu, precision::fp32>>;
  using acts = model_t::activations<2, 8>;
  const auto none = acts::sizes_of(nn::recompute::none), sel = acts::sizes_of(nn::recompute::selective),
             full = acts::sizes_of(nn::recompute::full);
  constexpr std::size_t L = models::tiny::n_layer;
  CHECK(none.residual3 == full.residual3);  // each block's output (the next one's input) stays
  CHECK(sel.qkv == none.qkv);
  CHECK(sel.fch == none.fch);
  CHECK(sel.atty * L == none.atty);          // the attention core's output: one block's slot
  CHECK(sel.fch_gelu * L == none.fch_gelu);  // the MLP activation's output: one block's slot
  CHECK(full.qkv * L == none.qkv);
  CHECK(full.ln1 * L == none.ln1);
  CHECK(full.residual2 * L == none.residual2);
  CHECK(full.ln_stats == 3 * nn::padded(2 * 2 * 8));  // the final norm's and one block's two norms'
  CHECK(full.dres == none.dres);          // backward scratch is not per layer
}

namespace {

/// Losses of 3 steps and world rank 0's parameters after them, on layout<2, 2> (4 threads), 4
/// micro-batches per step (1F1B keeps up to 2 in flight on stage 0), dropout 0.1.
template <class M>
std::vector<unsigned char> layout_run(nn::recompute r) {
  using P = policy<device::cpu, precision::fp32, layout<2, 2>>;
  constexpr int B = 2, T = 8, accum = 4;
  std::vector<unsigned char> out;
  comm::run_threads(4, [&](comm::threads& world) {
    context<device::cpu> ctx;
    train::trainer_config cfg;
    cfg.micro_batch = B;
    cfg.seq_len = T;
    cfg.grad_accum = accum;
    cfg.schedule = {3e-3, 3e-4, 1, 3};
    cfg.dropout = 0.1;
    cfg.recompute = r;
    train::trainer<M, P, B, T, comm::threads> tr(ctx, cfg, world);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      std::vector<std::int32_t> w(std::size_t(accum) * B * (T + 1));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 17, std::uint64_t(s), i));
      losses.push_back(tr.step(ctx, w).loss);
    }
    if (world.rank() == 0) {
      const auto p = tr.model().parameters();
      out.resize(losses.size() * sizeof(double) + p.size() * sizeof(p[0]));
      std::memcpy(out.data(), losses.data(), losses.size() * sizeof(double));
      std::memcpy(out.data() + losses.size() * sizeof(double), p.data(), p.size() * sizeof(p[0]));
    }
  });
  return out;
}

}  // namespace

TEST_CASE("recompute on tp2pp2 with 1F1B and dropout: losses and parameters bitwise those of none") {
  const auto ref = layout_run<models::tiny_parallel>(nn::recompute::none);
  REQUIRE(!ref.empty());
  for (auto r : {nn::recompute::selective, nn::recompute::full}) {
    CAPTURE(std::string(nn::recompute_name(r)));
    const auto got = layout_run<models::tiny_parallel>(r);
    REQUIRE(got.size() == ref.size());
    CHECK(std::memcmp(got.data(), ref.data(), ref.size()) == 0);
  }
  const auto llama_ref = layout_run<models::llama_tiny>(nn::recompute::none);
  const auto llama_full = layout_run<models::llama_tiny>(nn::recompute::full);
  REQUIRE(llama_full.size() == llama_ref.size());
  CHECK(std::memcmp(llama_full.data(), llama_ref.data(), llama_ref.size()) == 0);
}

TEST_CASE("memory plan: a one-rank trainer allocates what its type's plan says, in every recompute mode") {
  using P = policy<device::cpu, precision::bf16>;
  using tr_t = train::trainer<models::llama_tiny, P, 3, 9>;
  context<device::cpu> ctx;
  std::size_t previous = 0;
  for (auto r : {nn::recompute::full, nn::recompute::selective, nn::recompute::none}) {
    CAPTURE(std::string(nn::recompute_name(r)));
    train::trainer_config cfg;
    cfg.recompute = r;
    cfg.grad_accum = 2;
    const auto plan = tr_t::plan(cfg, 1, 0, 0, nullptr);
    tr_t tr(ctx, cfg);
    CHECK(plan.parameters == tr.model().parameters().bytes());
    CHECK(plan.gradients == tr.model().gradients().bytes());
    CHECK(plan.optimizer() == tr.optimizer_bytes());
    CHECK(plan.master_weights == plan.moments / 2);  // bf16 storage: fp32 masters and two fp32 moments
    CHECK(plan.activations == tr.activation_bytes());
    CHECK(plan.buckets == 0);
    CHECK(plan.host_optimizer == tr.host_optimizer_bytes());
    CHECK(plan.host_optimizer == 0);
    CHECK(plan.activations > previous);  // full < selective < none
    previous = plan.activations;
  }
  CHECK_THROWS_AS(tr_t::plan({}, 2, 2, 0, nullptr), input_error);
  // optimizer offload is for a device with its own memory: on the CPU the state is host memory already
  train::trainer_config off;
  off.offload_optimizer = true;
  CHECK_THROWS_WITH_AS(tr_t::plan(off, 1, 0, 0, nullptr), doctest::Contains("host memory already"), input_error);
  CHECK_THROWS_WITH_AS(tr_t(ctx, off), doctest::Contains("drop --offload-optimizer"), input_error);
}
