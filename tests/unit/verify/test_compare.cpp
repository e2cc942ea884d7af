// verify::compare: fp32 against itself (reference vs fused attention) agrees to rounding;
// fp32 against bf16 and fp16 passes the per-precision tolerance with non-zero errors of the
// expected size; a tighter tolerance makes it name the first layer that exceeds it; models of
// different shapes are a clear error.
#include <doctest/doctest.h>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/verify/compare.hpp>

using namespace loom;

namespace {

template <class Prec>
using cpu_policy = policy<device::cpu, Prec>;
using M = models::tiny;
constexpr int B = 2, T = 11;

verify::batch<B, T> make_batch() {
  verify::batch<B, T> x;
  for (int i = 0; i < B * T; ++i) {
    x.inputs.push_back(std::int32_t(random_below(M::vocab, 3, 0, std::uint64_t(i))));
    x.targets.push_back(std::int32_t(random_below(M::vocab, 3, 1, std::uint64_t(i))));
  }
  x.targets[4] = kernels::ignore_index;
  return x;
}

template <class PA, class PB, class AttnA = kernels::fused, class AttnB = kernels::fused>
verify::report run(const verify::compare_options& opt = {}) {
  context<device::cpu> ctx;
  nn::transformer<M, cpu_policy<PA>, AttnA> a(ctx, 5);
  nn::transformer<M, cpu_policy<PB>, AttnB> b(ctx, 99);  // different init: compare copies A's weights
  return verify::compare(a, ctx, b, ctx, make_batch(), opt);
}

double worst(const verify::report& r, bool gradient) {
  double w = 0;
  for (const auto& s : r.rows)
    if (s.gradient == gradient) w = std::max(w, s.rel_error);
  return w;
}

}  // namespace

TEST_CASE("verify::compare: fp32 reference attention vs fp32 fused attention agree to fp32 rounding") {
  const auto r = run<precision::fp32, precision::fp32, kernels::reference, kernels::fused>();
  CHECK(r.pass());
  CHECK(r.first_failure() == nullptr);
  // 1 embedding + 8 per layer + lnf, logits, loss; dlogits + 4 + 12 per layer + wpe, wte
  CHECK(r.rows.size() == std::size_t(1 + 8 * M::n_layer + 3 + 1 + 2 + 12 * M::n_layer + 2));
  CHECK(r.loss_a == doctest::Approx(r.loss_b).epsilon(1e-6));
  CHECK(worst(r, false) < 1e-5);
  CHECK(worst(r, true) < 1e-4);
  CHECK(r.policy_a == "cpu/fp32");
  CHECK(verify::format(r).find("PASS") != std::string::npos);
}

TEST_CASE("verify::compare: bf16 and fp16 against fp32 pass their tolerance, with errors of their format's size") {
  const auto rb = run<precision::fp32, precision::bf16>();
  const auto rh = run<precision::fp32, precision::fp16>();
  MESSAGE("worst relative error vs fp32: bf16 " << worst(rb, false) << " (activations), " << worst(rb, true)
                                                << " (gradients); fp16 " << worst(rh, false) << ", " << worst(rh, true));
  CHECK(rb.pass());
  CHECK(rh.pass());
  CHECK(rb.policy_b == "cpu/bf16");
  // the storage rounding is visible: at least half an ulp-ish relative error somewhere
  CHECK(worst(rb, false) > 1e-3);
  CHECK(worst(rh, false) > 1e-4);
  CHECK(worst(rh, false) < worst(rb, false));
}

TEST_CASE("verify::compare: a tolerance below bf16's error fails and names the first tensor that exceeds it") {
  verify::compare_options opt;
  opt.tol = verify::tolerance{1e-3, 1.0};
  const auto r = run<precision::fp32, precision::bf16>(opt);
  CHECK_FALSE(r.pass());
  REQUIRE(r.first_failure() != nullptr);
  // the embedding sum is rounded to bf16 once (relative error about 2^-9 ~ 2e-3)
  CHECK(r.first_failure()->name == "embedding (token + position)");
  CHECK(verify::format(r).find("FAIL: first disagreement at 'embedding (token + position)'") != std::string::npos);
  // a tolerance between the first rows' errors moves the verdict to a later tensor
  const double emb = r.rows[0].rel_error;
  opt.tol = verify::tolerance{emb * 1.01, 1.0};
  const auto r2 = run<precision::fp32, precision::bf16>(opt);
  if (const auto* f = r2.first_failure()) {
    CHECK(f->name != "embedding (token + position)");
    CHECK(f->rel_error > emb * 1.01);
  }
}

TEST_CASE("verify::compare: models of different shapes are an input_error naming both") {
  context<device::cpu> ctx;
  nn::transformer<M, cpu_policy<precision::fp32>> a(ctx, 1);
  nn::transformer<models::char_tiny, cpu_policy<precision::bf16>> b(ctx, 1);
  verify::batch<2, 8> x{std::vector<std::int32_t>(16, 1), std::vector<std::int32_t>(16, 2)};
  CHECK_THROWS_WITH_AS(verify::compare(a, ctx, b, ctx, x), doctest::Contains("A is tiny (n_layer 2"), input_error);
  CHECK_THROWS_WITH_AS(verify::compare(a, ctx, b, ctx, x), doctest::Contains("B is char_tiny"), input_error);
  nn::transformer<M, cpu_policy<precision::bf16>> c(ctx, 1);
  verify::batch<2, 8> bad{std::vector<std::int32_t>(15, 1), std::vector<std::int32_t>(16, 2)};
  CHECK_THROWS_WITH_AS(verify::compare(a, ctx, c, ctx, bad), doctest::Contains("needs 16 inputs"), input_error);
}
