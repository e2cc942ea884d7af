// train::plan_shape (train/shape_plan.hpp), the run-time memory plan, against the compiled
// trainers' own plans (session_instance::plan, trainer::plan): every compiled and
// plan-only instance of this build, in every setting that changes a term (recompute modes,
// ZeRO-1 on and off, one to three data-parallel ranks, every stage and data-parallel rank, a
// micro-batch and sequence below the capacities, optimizer offload on the NPU), equal kind by
// kind; and the refusals the compiled trainer makes, made too. layout_options of a shape: the
// layouts it divides, each candidate planned at its own micro-batch.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/models/spec.hpp>
#include <loom/train/auto_layout.hpp>
#include <loom/train/session.hpp>
#include <loom/train/shape_plan.hpp>

namespace {

namespace lt = loom::train;
namespace lm = loom::models;
using loom::nn::recompute;

/// The spec of every config an instance of this build can name (the presets and the test configs).
std::optional<lm::model_spec> spec_named(std::string_view name) {
  for (auto s : {lm::spec_of<lm::tiny>(), lm::spec_of<lm::tiny_parallel>(), lm::spec_of<lm::tiny_untied>(),
                 lm::spec_of<lm::llama_tiny>()})
    if (s.name == name) return s;
  return lm::preset_spec(name);
}

lt::instance_request request_of(const lt::session_instance& i) {
  const auto s = spec_named(i.model);
  REQUIRE_MESSAGE(s, "no spec for model " << i.model << ": add its config to spec_named");
  lt::instance_request r;
  r.spec = *s, r.precision = i.precision, r.tp = i.tp, r.pp = i.pp, r.device = i.device, r.attention = i.attention;
  r.micro_batch = i.micro_batch, r.seq_len = i.seq_len;
  return r;
}

void check_equal(const lt::memory_plan& want, const lt::memory_plan& got) {
  CHECK(got.parameters == want.parameters);
  CHECK(got.gradients == want.gradients);
  CHECK(got.master_weights == want.master_weights);
  CHECK(got.moments == want.moments);
  CHECK(got.activations == want.activations);
  CHECK(got.buckets == want.buckets);
  CHECK(got.host_optimizer == want.host_optimizer);
}

}  // namespace

TEST_CASE("plan_shape equals every planned instance's compiled plan in every setting") {
  const int threads = loom::nn::max_threads();
  int compared = 0;
  for (const auto& i : lt::planned_sessions()) {
    if (!i.plan || !i.facts) continue;
    const auto r = request_of(i);
    const int tpp = i.tp * i.pp;
    for (const int dp : {1, 2, 3})
      for (const auto mode : {recompute::none, recompute::selective, recompute::full})
        for (const bool zero1 : {false, true}) {
          lt::session_args a;
          a.cfg.recompute = mode, a.cfg.grad_accum = 3, a.ddp.zero1 = zero1, a.ddp.bucket_mb = 0.01;
          if (dp == 2) a.cfg.micro_batch = (i.micro_batch + 1) / 2, a.cfg.seq_len = (i.seq_len + 2) / 3;
          for (int stage = 0; stage < i.pp; ++stage)
            for (int dp_rank = 0; dp_rank < dp; dp_rank += dp > 1 ? dp - 1 : 1) {
              CAPTURE(i.describe());
              CAPTURE(dp);
              CAPTURE(stage);
              CAPTURE(dp_rank);
              CAPTURE(loom::nn::recompute_name(mode));
              CAPTURE(zero1);
              check_equal(i.plan(a, tpp * dp, dp_rank, stage), lt::plan_shape(r, a, tpp * dp, dp_rank, stage, threads));
              ++compared;
            }
        }
    if (i.device == "ascend") {  // the pinned host copy of an offloaded optimizer
      lt::session_args a;
      a.cfg.offload_optimizer = true, a.cfg.offload_chunk = 96;
      CAPTURE(i.describe());
      check_equal(i.plan(a, tpp, 0, 0), lt::plan_shape(r, a, tpp, 0, 0, threads));
      ++compared;
    }
  }
  MESSAGE(compared << " plans compared");
  CHECK(compared > 500);
}

TEST_CASE("plan_shape refuses what the compiled trainer refuses, naming the fix") {
  lt::instance_request r;
  r.spec = lm::spec_of<lm::odd_gqa>(), r.micro_batch = 4, r.seq_len = 24;
  lt::session_args a;
  r.pp = 3;
  CHECK_THROWS_WITH_AS(lt::plan_shape(r, a, 2, 0, 0, 1), doctest::Contains("ranks are not a multiple"), loom::input_error);
  r.pp = 2;
  CHECK_THROWS_WITH_AS(lt::plan_shape(r, a, 2, 0, 0, 1), doctest::Contains("not divisible by PP=2"), loom::input_error);
  r.pp = 3;
  a.cfg.micro_batch = 5;
  CHECK_THROWS_WITH_AS(lt::plan_shape(r, a, 3, 0, 0, 1), doctest::Contains("--micro-batch <= 4"), loom::input_error);
  a.cfg.micro_batch = 0, a.cfg.offload_optimizer = true;
  CHECK_THROWS_WITH_AS(lt::plan_shape(r, a, 3, 0, 0, 1), doctest::Contains("drop --offload-optimizer"),
                       loom::input_error);
  a.cfg.offload_optimizer = false, a.cfg.dropout = 0.1, r.attention = "reference";
  CHECK_THROWS_WITH_AS(lt::plan_shape(r, a, 3, 0, 0, 1), doctest::Contains("--dropout 0"), loom::input_error);
  a.cfg.dropout = 0;
  CHECK_THROWS_WITH_AS(lt::plan_shape(r, a, 3, 0, 3, 1), doctest::Contains("is not a rank of the layout"),
                       loom::input_error);
  CHECK(lt::plan_shape(r, a, 3, 0, 2, 1).total() > 0);
}

TEST_CASE("plan_shape of a 7B Llama on one rank: parameters and AdamW state from the parameter count") {
  lt::instance_request r;
  r.spec = lm::spec_of<lm::llama2_7b>(), r.precision = "bf16", r.device = "ascend", r.micro_batch = 1, r.seq_len = 4096;
  const auto p = lt::plan_shape(r, lt::session_args{}, 1, 0, 0, 1);
  const auto n = std::size_t(r.spec.parameter_count());
  CHECK(p.parameters == 2 * n);
  CHECK(p.gradients == 4 * n);
  CHECK(p.master_weights == 4 * n);
  CHECK(p.moments == 8 * n);
  CHECK(p.buckets == 0);
  // every per-layer activation is at least one (B*T, C) bf16 tensor per layer per kept tensor
  CHECK(p.activations > std::size_t(r.spec.n_layer) * 4096 * 4096 * 2 * 4);
}

TEST_CASE("layout_options of a shape: every layout dividing the model and the world, planned at each candidate's "
          "micro-batch") {
  const auto spec = lm::spec_of<lm::odd_gqa>();  // 3 layers, 5 query heads, 1 key/value head
  const auto options = lt::layout_options(spec, "fp32", "cpu", "fused", 6, 4, 24, 1);
  REQUIRE(options.size() == 2);  // TP must divide the one key/value head; PP the 3 layers and 6 ranks
  CHECK(options[0].layout() == "tp1pp1");
  CHECK(options[1].layout() == "tp1pp3");
  CHECK(options[1].instance == nullptr);
  lt::layout_request r;
  r.model = spec.name, r.precision = "fp32", r.world_size = 6, r.global_batch = 12, r.seq_len = 24;
  r.peak_flops = 1e10, r.net.intra = {.bus_gbytes = 10, .latency_us = 5};
  const auto ranked = lt::rank_layouts(options, r);
  REQUIRE(ranked.size() > 10);
  for (const auto& c : ranked) {
    lt::instance_request want{.spec = spec, .precision = "fp32", .tp = c.option.tp, .pp = c.option.pp,
                              .micro_batch = c.micro_batch, .seq_len = 24};
    lt::session_args a;
    a.cfg.grad_accum = c.grad_accum, a.cfg.recompute = c.recompute, a.ddp.zero1 = c.zero1;
    CAPTURE(c.describe());
    CHECK(lt::plan_shape(want, a, 6, 0, c.largest_stage, 1).total() == c.largest.total());
  }
}
