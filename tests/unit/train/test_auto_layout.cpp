// train::choose_layout and train::estimate_step: the step estimate's terms against their
// formulas in float64; the choice among synthetic instances (a limit only recomputation meets
// picks it, nothing fitting names the smallest footprint, the fastest fitting candidate wins)
// and among the compiled instances by their real plans; parse_bytes; measure_link on threads.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <loom/models/registry.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/link_probe.hpp>
#include <loom/train/auto_layout.hpp>
#include <loom/train/session.hpp>

namespace {

namespace lt = loom::train;
using loom::nn::recompute;

constexpr loom::models::model_facts facts{.name = "synthetic", .n_layer = 8, .n_head = 4, .d_model = 64,
                                          .vocab = 97, .vocab_padded = 128, .max_seq = 32, .mlp_columns = 256,
                                          .n_kv_head = 4, .arch = "gpt2"};

/// A synthetic instance's plan (bytes): parameters 1000/(TP*PP), optimizer 3000/(TP*PP), halved
/// with ZeRO-1 on 2+ dp ranks; activations by recompute mode 9000 / 5000 / 1500, per stage
/// divided by PP and doubled on stage 0 (1F1B keeps more micro-batches there).
template <int TP, int PP>
lt::memory_plan fake_plan(const lt::session_args& a, int world, int, int stage) {
  if (a.cfg.micro_batch > 4) throw loom::input_error("above capacity");
  if (a.cfg.offload_optimizer && a.ddp.zero1) throw loom::input_error("offload with ZeRO-1");
  lt::memory_plan p;
  const int dp = world / (TP * PP);
  p.parameters = 1000 / (TP * PP);
  p.moments = 3000 / (TP * PP) / (a.ddp.zero1 && dp > 1 ? 2 : 1);
  if (a.cfg.offload_optimizer) p.host_optimizer = std::exchange(p.moments, 0);
  const std::size_t act = a.cfg.recompute == recompute::full ? 1500 : a.cfg.recompute == recompute::selective ? 5000 : 9000;
  p.activations = act / PP * (stage == 0 && PP > 1 ? 2 : 1);
  return p;
}

const std::vector<lt::session_instance> synthetic = {
    {"synthetic", "fp32", 1, 1, "cpu", "fused", 4, 32, nullptr, nullptr, &fake_plan<1, 1>, &facts, 200000},
    {"synthetic", "fp32", 2, 1, "cpu", "fused", 4, 32, nullptr, nullptr, &fake_plan<2, 1>, &facts, 200000},
    {"synthetic", "fp32", 1, 2, "cpu", "fused", 4, 32, nullptr, nullptr, &fake_plan<1, 2>, &facts, 200000},
    {"synthetic", "bf16", 1, 1, "cpu", "fused", 4, 32, nullptr, nullptr, &fake_plan<1, 1>, &facts, 200000},
    {"synthetic", "bf16", 1, 1, "ascend", "fused", 4, 32, nullptr, nullptr, &fake_plan<1, 1>, &facts, 200000},
};

lt::layout_request request(std::size_t limit, int world = 2) {
  lt::layout_request r;
  r.model = "synthetic", r.precision = "fp32", r.world_size = world, r.global_batch = 8;
  r.memory_limit = limit, r.overhead = 100, r.peak_flops = 1e9;
  r.net.intra = {.bus_gbytes = 10, .latency_us = 5};
  return r;
}

}  // namespace

TEST_CASE("estimate_step: each term is its formula (float64)") {
  const lt::network net{.intra = {.bus_gbytes = 20, .latency_us = 7}, .inter = {.bus_gbytes = 3, .latency_us = 30},
                        .devices_per_node = 4, .host = {}};
  const lt::step_shape s{.facts = &facts, .parameters = 123457, .tp = 2, .pp = 3, .dp = 2, .micro_batch = 3,
                         .grad_accum = 5, .seq_len = 29, .recompute = recompute::selective, .zero1 = true,
                         .storage_bytes = 2, .grad_bytes = 4, .peak_flops = 3.5e9};
  const auto e = lt::estimate_step(s, net);
  const double tokens = 3.0 * 29 * 5 * 2, ltc = 8.0 * 29 * 64;
  const double flops = (6.0 * 123457 + 12 * ltc + 4 * ltc) * tokens;  // selective: the attention core again
  CHECK(e.flops == doctest::Approx(flops).epsilon(1e-12));
  CHECK(e.compute == doctest::Approx(flops / (12 * 3.5e9)).epsilon(1e-12));
  CHECK(e.bubble == doctest::Approx(2.0 / 5));
  const double act = 3.0 * 29 * 64 * 2;  // one micro-batch's activations, bf16
  // tp group: ranks 0,1 of a 4-rank node (intra); 5 micro-batches x 8/3 -> 2 layers x 4 all-reduces
  const double ar = 2.0 * 1 / 2 * act / 20e9 + 2.0 * 1 * 7e-6;
  CHECK(e.tp_comm == doctest::Approx(5 * 2 * 4 * ar).epsilon(1e-12));
  // pp group: stride tp*dp = 4, 3 stages span 12 ranks: between nodes
  CHECK(e.pp_comm == doctest::Approx(2.0 * 5 * (act / 2 / 3e9 + 30e-6)).epsilon(1e-12));
  // dp group: stride 2, 2 ranks span 4: within a node; ZeRO-1 moves (4 + 2)/2 bytes per element
  const double local = 123457.0 / 6, dp_t = 2.0 * 1 / 2 * local * 3 / 20e9 + 2 * 7e-6;
  CHECK(e.dp_comm == doctest::Approx(std::max(0.0, dp_t - e.compute / 5 * 2 / 3)).epsilon(1e-12));
  CHECK(e.seconds() == doctest::Approx(e.compute * 1.4 + e.tp_comm + e.pp_comm + e.dp_comm));
  // full recompute adds a block forward and two all-reduces per layer
  auto f = s;
  f.recompute = recompute::full;
  const auto ef = lt::estimate_step(f, net);
  CHECK(ef.flops == doctest::Approx((6.0 * 123457 + 12 * ltc + 2 * (123457.0 - 128 * 64) + 4 * ltc) * tokens));  // tied
  CHECK(ef.tp_comm == doctest::Approx(e.tp_comm * 6 / 4));
  f.peak_flops = 0;
  CHECK_THROWS_AS(lt::estimate_step(f, net), loom::input_error);
  // optimizer offload over a slow host link: a fp32 gradient down and a bf16 parameter up per
  // local parameter; overlapped, one micro-batch's forward (a third of 6N + 12LTC) hides part
  auto o = s;
  o.offload = true, o.zero1 = false;
  auto host = net;
  host.host = {.bus_gbytes = 0.01, .latency_us = 0};
  const auto eo = lt::estimate_step(o, host);
  const double copies = 123457.0 / 6 * (4 + 2) / 0.01e9;
  const double forward = eo.compute / 5 * ((6.0 * 123457 + 12 * ltc) / 3) / (6.0 * 123457 + 12 * ltc + 4 * ltc);
  CHECK(eo.offload_copies == doctest::Approx(copies).epsilon(1e-12));
  REQUIRE(copies > forward);
  CHECK(eo.offload == doctest::Approx(copies - forward).epsilon(1e-12));
  o.offload_overlap = false;
  CHECK(lt::estimate_step(o, host).offload == doctest::Approx(copies).epsilon(1e-12));
  o.offload = false;
  CHECK(lt::estimate_step(o, host).offload == 0);
}

TEST_CASE("choose_layout: a limit only recomputation meets picks recomputation") {
  // on 2 ranks: tp2pp1 (dp 1) holds 500 + 1500 + activations; tp1pp1 dp 2 with ZeRO-1 1000 + 1500 + ...
  const auto none = lt::choose_layout(synthetic, request(1u << 30));
  CHECK(none.recompute == recompute::none);  // everything fits: no recomputation (it costs FLOPs)
  CHECK(none.micro_batch == 4);               // equal compute, fewer latencies: the largest micro-batch
  // the smallest footprint without recomputation: tp1pp2 stage 0, 500 + 1500 + 9000 + 100 overhead
  const auto ranked = lt::rank_layouts(synthetic, request(1u << 30));
  std::size_t smallest_none = ~std::size_t(0);
  for (const auto& c : ranked)
    if (c.recompute == recompute::none) smallest_none = std::min(smallest_none, c.footprint);
  CHECK(smallest_none == 500 + 1500 + 9000 + 100);
  const auto pick = lt::choose_layout(synthetic, request(smallest_none - 1));
  CHECK(pick.recompute != recompute::none);
  CHECK(pick.fits);
  CHECK(pick.footprint <= smallest_none - 1);
  // a limit only full recomputation meets
  const auto full = lt::choose_layout(synthetic, request(500 + 1500 + 5000 + 100 - 1));
  CHECK(full.recompute == recompute::full);
}

TEST_CASE("choose_layout: nothing fits names the smallest footprint and the limit that reaches it") {
  // smallest: tp2pp1 or tp1pp2 with full recompute: 500 + 1500 + 1500 (tp2) + 100 = 3600
  try {
    (void)lt::choose_layout(synthetic, request(1000));
    FAIL("no error");
  } catch (const loom::input_error& e) {
    const std::string m = e.what();
    CHECK(m.find("nothing fits") != std::string::npos);
    CHECK(m.find("recompute full") != std::string::npos);
    CHECK(m.find("--memory-limit") != std::string::npos);
  }
  // no instance divides 3 ranks with a global batch of 8: none of 1, 2 (TP or PP) gives dp | 8 / b
  auto r = request(1u << 30, 3);
  CHECK_THROWS_AS(lt::choose_layout(synthetic, r), loom::input_error);
  r.model = "nosuch";
  CHECK_THROWS_WITH_AS(lt::choose_layout(synthetic, r), doctest::Contains("no compiled instance"), loom::input_error);
}

TEST_CASE("choose_layout: on an NPU a limit only optimizer offload meets picks offload; its copies count, less what "
          "the next forward hides") {
  auto r = request(1u << 30, 1);
  r.precision = "bf16", r.device = "ascend", r.offload = true;
  r.net.host = {.bus_gbytes = 16, .latency_us = 0};
  const auto roomy = lt::choose_layout(synthetic, r);
  CHECK(!roomy.offload);  // not chosen when the state fits (at equal time the candidate without wins)
  CHECK(roomy.recompute == recompute::none);
  // 1000 + 0 + 1500 (full recompute) + 100 fits only offloaded; 1000 + 3000 + 1500 + 100 does not
  r.memory_limit = 1000 + 1500 + 100;
  const auto pick = lt::choose_layout(synthetic, r);
  CHECK(pick.offload);
  CHECK(pick.recompute == recompute::full);
  CHECK(pick.largest.host_optimizer == 3000);
  CHECK(pick.time.offload_copies == doctest::Approx(200000.0 * (4 + 2) / 16e9));
  CHECK(pick.time.offload == 0);  // overlapped: hidden behind the next step's first forward (slow peak)
  CHECK(pick.describe().find("optimizer offload") != std::string::npos);
  r.offload = false;  // not asked: nothing fits
  CHECK_THROWS_WITH_AS(lt::choose_layout(synthetic, r), doctest::Contains("nothing fits"), loom::input_error);
  r.offload = true, r.net.host = {};  // asked without the host link: the estimate refuses
  CHECK_THROWS_AS(lt::choose_layout(synthetic, r), loom::input_error);
}

TEST_CASE("choose_layout: the compiled char_tiny instances by their real plans") {
  const auto all = lt::compiled_sessions();
  auto r = request(std::size_t(1) << 40, 4);
  r.model = "char_tiny";
  r.global_batch = 32;
  r.args.cfg.seq_len = 32;
  const auto ranked = lt::rank_layouts(all, r);
  REQUIRE(!ranked.empty());
  std::size_t smallest_none = ~std::size_t(0), smallest = ~std::size_t(0);
  for (const auto& c : ranked) {
    CHECK(c.option.instance->model == "char_tiny");
    CHECK(4 % (c.option.instance->tp * c.option.instance->pp) == 0);
    CHECK(c.micro_batch * c.dp * c.grad_accum == 32);
    smallest = std::min(smallest, c.footprint);
    if (c.recompute == recompute::none) smallest_none = std::min(smallest_none, c.footprint);
  }
  REQUIRE(smallest < smallest_none);
  r.memory_limit = smallest_none - 1;
  const auto pick = lt::choose_layout(all, r);
  CHECK(pick.recompute != recompute::none);
  // the chosen candidate's plan is its instance's plan for those settings
  lt::session_args a = r.args;
  a.cfg.micro_batch = pick.micro_batch;
  a.cfg.grad_accum = pick.grad_accum;
  a.cfg.recompute = pick.recompute;
  a.ddp.zero1 = pick.zero1;
  CHECK(pick.option.instance->plan(a, 4, 0, pick.largest_stage).total() + r.overhead == pick.footprint);
  r.memory_limit = smallest - 1;
  CHECK_THROWS_WITH_AS(lt::choose_layout(all, r), doctest::Contains("nothing fits"), loom::input_error);
}

TEST_CASE("planned_sessions: the compiled instances, then the plan-only ones") {
  const auto trained = lt::compiled_sessions(), planned = lt::planned_sessions();
  REQUIRE(planned.size() >= trained.size());
  CHECK(planned.data() == trained.data());
  for (const auto& i : trained) CHECK((i.make && i.whole && i.plan && i.facts && i.parameters > 0));
  for (const auto& i : planned.subspan(trained.size())) CHECK((!i.make && !i.whole && i.plan && i.facts));
}

TEST_CASE("parse_bytes: units, and errors naming the flag") {
  CHECK(lt::parse_bytes("24GiB", "--memory-limit") == std::size_t(24) << 30);
  CHECK(lt::parse_bytes("512 MiB", "--memory-limit") == std::size_t(512) << 20);
  CHECK(lt::parse_bytes("64GB", "--memory-limit") == std::size_t(64000000000));
  CHECK(lt::parse_bytes("1.5KiB", "--memory-limit") == 1536);
  CHECK(lt::parse_bytes("4096", "--memory-limit") == 4096);
  for (const char* bad : {"", "GiB", "24G", "-1GiB", "24 gib", "1e30TB", "x24GiB"})
    CHECK_THROWS_WITH_AS(lt::parse_bytes(bad, "--memory-limit"), doctest::Contains("--memory-limit"), loom::input_error);
}

TEST_CASE("measure_link: a threads world's all-reduce has a positive latency and bandwidth, the same on every rank") {
  std::vector<lt::link> seen(3);
  loom::comm::run_threads(3, [&](loom::comm::threads& w) {
    seen[std::size_t(w.rank())] = loom::train::measure_link(w, 1 << 20, 2);
  });
  for (const auto& l : seen) {
    CHECK(l.bus_gbytes > 0);
    CHECK(l.latency_us > 0);
    CHECK(std::isfinite(l.bus_gbytes));
    CHECK(l.bus_gbytes == seen[0].bus_gbytes);
    CHECK(l.latency_us == seen[0].latency_us);
  }
}
