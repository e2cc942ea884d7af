#pragma once
/// \file Autoregressive sampling from a loom::nn::transformer with temperature and top-k.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/random.hpp>

namespace loom::nn {

/// Sampling settings.
struct sampling {
  double temperature = 1.0;  ///< > 0; logits are divided by it (below 1: more conservative)
  int top_k = 0;             ///< keep the k most likely tokens (0: all of the vocabulary)
  std::uint64_t seed = 42;   ///< draw j uses random_uniform(seed, 7, j): reproducible
};

/// Chooses a token from `logits` (V values) under `s`, using uniform draw `u` in [0,1).
/// Ties in top-k are broken by the lower id. Pure function (tests call it directly).
template <class S>
std::int32_t sample_token(const S* logits, int V, const sampling& s, double u) {
  std::vector<int> ids(static_cast<std::size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  int k = s.top_k > 0 && s.top_k < V ? s.top_k : V;
  if (k < V)
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
      return double(logits[a]) > double(logits[b]) || (double(logits[a]) == double(logits[b]) && a < b);
    });
  double mx = -INFINITY;
  for (int i = 0; i < k; ++i) mx = std::max(mx, double(logits[ids[i]]));
  std::vector<double> p(static_cast<std::size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((double(logits[ids[i]]) - mx) / s.temperature);
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[i] / sum;
    if (u < acc) return ids[i];
  }
  return ids[k - 1];
}

/// Appends `count` sampled tokens to `tokens` (which holds the prompt, at least one id).
/// Each new token is predicted from the last min(len, T) tokens (a sliding window over the
/// learned positions). G is a loom::nn::transformer on a host-accessible device; Acts its
/// activations<1, T>. Throws loom::input_error for an empty prompt, an id outside
/// [0, vocab), or a temperature <= 0.
template <class G, class Acts, class Ctx>
void generate(const G& model, Ctx& ctx, Acts& acts, std::vector<std::int32_t>& tokens, int count, const sampling& s) {
  using M = typename G::model;
  if (tokens.empty()) throw input_error("the prompt is empty; pass at least one character with --prompt");
  if (!(s.temperature > 0)) throw input_error("temperature must be > 0; pass e.g. --temperature 0.8");
  for (auto id : tokens)
    if (id < 0 || id >= M::vocab)
      throw input_error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(M::vocab) + ")");
  constexpr int T = Acts::seq;
  for (int j = 0; j < count; ++j) {
    const int len = std::min<int>(int(tokens.size()), T);
    const std::int32_t* window = tokens.data() + tokens.size() - len;
    model.forward(ctx, acts, window, nullptr, 1, len);
    const auto* last = acts.logits() + std::size_t(len - 1) * M::vocab_padded;
    tokens.push_back(sample_token(last, M::vocab, s, random_uniform(s.seed, 7, std::uint64_t(j))));
  }
}

}  // namespace loom::nn
