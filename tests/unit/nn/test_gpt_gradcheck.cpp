// The whole model in float64, for both recipes, without and with dropout: every parameter tensor's
// gradient against central finite differences (a sample of elements per tensor), on a random batch
// with an ignored target, with a micro-batch and sequence shorter than the activation capacity.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>

#include "../../support/gradcheck.hpp"

using namespace loom;

namespace {

/// Every parameter tensor's gradient (a sample of ~40 elements each) against central
/// differences of the mean loss, in float64, with the training dropout `drop` (the same masks
/// in every evaluation of the loss: they depend only on drop.key).
template <class M>
void check_gradients(const nn::dropout_state& drop) {
  using P = policy<device::cpu, precision::fp64>;
  context<device::cpu> ctx;
  nn::transformer<M, P> model(ctx, 7);
  // randomise every parameter (LayerNorm gains/biases included) so every path is exercised
  auto params = model.parameters();
  const auto r = test::random_vector(params.size(), 99, -0.3, 0.3);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] += r[i];
  constexpr int B = 3, T = 9;  // capacity
  const int b = 2, t = 7;      // used
  typename nn::transformer<M, P>::template activations<B, T> acts(ctx);
  std::vector<std::int32_t> in(b * t), tg(b * t);
  for (int i = 0; i < b * t; ++i) {
    in[i] = std::int32_t(random_below(M::vocab, 5, 0, i));
    tg[i] = std::int32_t(random_below(M::vocab, 5, 1, i));
  }
  tg[4] = kernels::ignore_index;
  const double scale = 1.0 / (b * t - 1);
  auto loss = [&] { return model.forward(ctx, acts, in.data(), tg.data(), b, t, 0.0, drop) * scale; };
  model.zero_grad(ctx);
  const double l0 = model.forward(ctx, acts, in.data(), tg.data(), b, t, scale, drop) * scale;
  CHECK(l0 > 3.0);  // near log(61) = 4.11 for a barely trained model
  CHECK(l0 < 6.0);
  model.backward(ctx, acts, in.data(), b, t);
  double worst = 0;
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    auto p = model.parameter(std::size_t(k));
    auto g = model.gradient(std::size_t(k));
    std::vector<double> analytic, numeric;
    for (std::size_t i = 0; i < p.size(); i += 1 + p.size() / 40) {  // ~40 elements per tensor
      const double old = p[i], h = 1e-5;
      p[i] = old + h;
      const double fp = loss();
      p[i] = old - h;
      const double fm = loss();
      p[i] = old;
      numeric.push_back((fp - fm) / (2 * h));
      analytic.push_back(g[i]);
    }
    INFO("tensor " << nn::transformer<M, P>::table[k].name);
    const double e = test::max_rel_error(analytic, numeric);
    worst = std::max(worst, e);
    CHECK(e < 1e-5);
  }
  MESSAGE(std::string(M::name) << std::string(drop.active() ? " with dropout" : "") << ": worst relative gradient error over "
                  << models::num_params<M> << " tensors " << worst << " (loss " << l0 << ")");
}

}  // namespace

// models::tiny is GPT-2; models::tiny_untied has no linear biases and an LM head of its own
// (models::gpt2_untied_nobias), so its table has 13 rows and the head's gradient is its own;
// models::llama_tiny is a Llama (RMSNorm, RoPE, SwiGLU, 6 query heads on 2 key/value heads),
// 9 rows.
TEST_CASE_TEMPLATE("gpt fp64: parameter gradients match central differences", M, models::tiny, models::tiny_untied,
                   models::llama_tiny) {
  check_gradients<M>({});
}

// Embedding, attention-probability and residual dropout on (nn/dropout.hpp), p = 0.2: the
// backward regenerates the forward's masks.
TEST_CASE_TEMPLATE("gpt fp64 with dropout 0.2: parameter gradients match central differences", M, models::tiny,
                   models::tiny_untied, models::llama_tiny) {
  check_gradients<M>({0.2, dropout_key(17, 4, 1)});
}

TEST_CASE("gpt: two forward/backward passes with the same inputs are bitwise equal") {
  using P = policy<device::cpu, precision::fp32>;
  using M = models::tiny;
  context<device::cpu> ctx;
  nn::transformer<M, P> a(ctx, 3), b(ctx, 3);
  constexpr int B = 4, T = 16;
  typename nn::transformer<M, P>::template activations<B, T> acts(ctx);
  std::vector<std::int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) in[i] = std::int32_t(random_below(M::vocab, 1, 0, i)), tg[i] = std::int32_t(random_below(M::vocab, 1, 1, i));
  a.zero_grad(ctx);
  b.zero_grad(ctx);
  const float la = a.forward(ctx, acts, in.data(), tg.data(), B, T, 1.0f / (B * T));
  a.backward(ctx, acts, in.data(), B, T);
  const float lb = b.forward(ctx, acts, in.data(), tg.data(), B, T, 1.0f / (B * T));
  b.backward(ctx, acts, in.data(), B, T);
  CHECK(la == lb);
  CHECK(std::memcmp(a.gradients().data(), b.gradients().data(), a.gradients().bytes()) == 0);
}

TEST_CASE("parameter table: GPT-2 small has 124,475,904 parameters with the padded vocabulary") {
  CHECK(models::parameter_count<models::gpt2_small>() == 124475904u);
  CHECK(models::parameter_count<models::gpt2_small>(false) == 124475904u - 1024u * 768u);
  constexpr auto t = models::param_table<models::gpt2_small, parallel::layout<4, 3>>();
  CHECK(t[int(models::param::qkv_w)].shape == std::array<long, 3>{4, 576, 768});
  CHECK(t[int(models::param::attproj_w)].shape == std::array<long, 3>{4, 768, 192});
  CHECK(t[int(models::param::wte)].shape[0] == 50304 / 4);
}
