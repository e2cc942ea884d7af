// generate_in_vocab: with the model's whole vocabulary it is nn::generate; with a smaller one
// every token is below it and equals sample_token over the first `vocab` logits of an
// independent forward pass; bad arguments are input errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate_in_vocab.hpp>
#include <loom/nn/transformer.hpp>

using namespace loom;

TEST_CASE("generate_in_vocab: nn::generate for the full vocabulary, renormalised over a smaller one") {
  using M = models::tiny;  // vocab 61, 16 positions
  using P = policy<device::cpu, precision::fp32>;
  context<device::cpu> ctx;
  nn::transformer<M, P> model(ctx, 2024);
  nn::transformer<M, P>::activations<1, M::max_seq> acts(ctx);
  const nn::sampling s{1.3, 0, 77};  // hot: ids above the limit get real probability

  std::vector<std::int32_t> a = {5, 9}, b = a;
  nn::generate(model, ctx, acts, a, 20, s);
  nn::generate_in_vocab(model, ctx, acts, b, 20, s, M::vocab);
  CHECK(a == b);

  for (const auto& smp : {s, nn::sampling{0.9, 4, 3}}) {
    constexpr int limit = 17;
    std::vector<std::int32_t> t = {5, 9};
    nn::generate_in_vocab(model, ctx, acts, t, 24, smp, limit);  // 26 > 16 positions: the window slides
    REQUIRE(t.size() == 26);
    for (std::size_t j = 2; j < t.size(); ++j) {
      CHECK(t[j] >= 0);
      CHECK(t[j] < limit);
      // independently: forward over the preceding window, sample among the first `limit` logits
      const int len = std::min<int>(int(j), M::max_seq);
      model.forward(ctx, acts, t.data() + j - len, nullptr, 1, len);
      const float* last = acts.logits() + std::size_t(len - 1) * M::vocab_padded;
      CHECK(t[j] == nn::sample_token(last, limit, smp, random_uniform(smp.seed, 7, j - 2)));
    }
  }
  // with the full vocabulary and the hot temperature some id above 17 does occur, so the
  // restriction above was not vacuous
  CHECK(std::any_of(a.begin() + 2, a.end(), [](std::int32_t id) { return id >= 17; }));

  std::vector<std::int32_t> p = {20};
  CHECK_THROWS_AS(nn::generate_in_vocab(model, ctx, acts, p, 1, s, 17), input_error);  // prompt above the limit
  CHECK_THROWS_AS(nn::generate_in_vocab(model, ctx, acts, p, 1, s, 0), input_error);
  CHECK_THROWS_AS(nn::generate_in_vocab(model, ctx, acts, p, 1, s, M::vocab + 1), input_error);
  std::vector<std::int32_t> empty;
  CHECK_THROWS_AS(nn::generate_in_vocab(model, ctx, acts, empty, 1, s, 17), input_error);
}
