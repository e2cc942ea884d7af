// nn::decode_step: after a forward over a random prompt, each decoded position's logits equal
// the last row of a forward over the whole prefix (within 1e-5 of the largest logit), for a GPT-2
// (learned positions, tied head), an untied GPT-2, and two Llamas (RMSNorm, RoPE, SwiGLU, GQA 3:1
// and 5:1); its bad arguments are errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/kv_decode.hpp>
#include <loom/nn/transformer.hpp>

using namespace loom;

namespace {

/// Largest |a - b| over the first V logits, divided by the largest |b|.
double relative_gap(const float* a, const float* b, int V) {
  double gap = 0, scale = 0;
  for (int i = 0; i < V; ++i) {
    gap = std::max(gap, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return gap / scale;
}

template <class M>
void check_decode_equals_forward(int prompt) {
  using P = policy<device::cpu, precision::fp32>;
  using G = nn::transformer<M, P>;
  context<device::cpu> ctx;
  const G model(ctx, 99);
  typename G::template activations<1, M::max_seq> cached(ctx), whole(ctx);
  std::vector<std::int32_t> tokens(M::max_seq);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = std::int32_t(random_uniform(5, 1, i) * M::vocab) % M::vocab;

  nn::decode_scratch<G> scratch;
  model.forward(ctx, cached, tokens.data(), nullptr, 1, prompt);
  for (int pos = prompt; pos < M::max_seq; ++pos) {
    const float* got = nn::decode_step(model, ctx, cached, scratch, tokens[std::size_t(pos)], pos);
    model.forward(ctx, whole, tokens.data(), nullptr, 1, pos + 1);
    const float* want = whole.logits() + std::size_t(pos) * M::vocab_padded;
    CAPTURE(pos);
    CHECK(relative_gap(got, want, M::vocab) < 1e-5);
    CHECK(*std::max_element(want, want + M::vocab) != *std::min_element(want, want + M::vocab));  // not constant
  }
}

}  // namespace

TEST_CASE("decode_step: logits of each cached position equal a forward over the whole prefix") {
  check_decode_equals_forward<models::tiny>(3);          // GPT-2: LayerNorm, learned positions, tied head
  check_decode_equals_forward<models::tiny_untied>(1);   // untied LM head, a one-token prompt
  check_decode_equals_forward<models::llama_tiny>(5);    // RMSNorm, RoPE, SwiGLU, GQA 6:2
  check_decode_equals_forward<models::odd_gqa>(7);       // 5 heads of 16 on one key/value head, vocab 1999
}

TEST_CASE("decode_step: a token outside the vocabulary, a full table and a recompute table are refused") {
  using M = models::tiny;
  using G = nn::transformer<M, policy<device::cpu, precision::fp32>>;
  context<device::cpu> ctx;
  const G model(ctx, 3);
  typename G::template activations<1, M::max_seq> acts(ctx);
  nn::decode_scratch<G> scratch;
  const std::int32_t prompt[2] = {4, 7};
  model.forward(ctx, acts, prompt, nullptr, 1, 2);
  CHECK_THROWS_AS(nn::decode_step(model, ctx, acts, scratch, M::vocab, 2), input_error);
  CHECK_THROWS_AS(nn::decode_step(model, ctx, acts, scratch, -1, 2), input_error);
  CHECK_THROWS_AS(nn::decode_step(model, ctx, acts, scratch, 4, M::max_seq), input_error);
  typename G::template activations<1, M::max_seq> recomputed(ctx, nn::recompute::full);
  CHECK_THROWS_AS(nn::decode_step(model, ctx, recomputed, scratch, 4, 2), std::invalid_argument);
}
