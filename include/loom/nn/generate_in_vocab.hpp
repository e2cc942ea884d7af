#pragma once
/// \file nn::generate_in_vocab — nn::generate restricted to the first `vocab` ids, for a
/// tokenizer smaller than the model's vocabulary.
///
/// quickstart_bpe has 8192 output rows; a prepare_data tokenizer of --vocab-size 8000 (or 2000)
/// gives text to only the first 8000 (2000) ids. The rows above are never targets, so training
/// pushes them down, but they keep some probability, and a sampled id without a piece cannot
/// be decoded. Here every token is drawn from the model's distribution (temperature, top-k)
/// renormalised over [0, vocab): nn::sample_token over the first `vocab` logits — the same
/// distribution as rejection sampling of ids >= vocab, without redrawing. With vocab ==
/// M::vocab the draws are nn::generate's (random_uniform(seed, 7, j)) and the logits agree with
/// its to rounding (the key/value cache below), so the tokens are its tokens.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/nn/generate.hpp>
#include <loom/nn/kv_decode.hpp>

namespace loom::nn {

/// Appends `count` tokens in [0, vocab) to `tokens` (the prompt, at least one id in [0, vocab)).
/// Each is predicted from the last min(len, T) tokens; G is a loom::nn::transformer on a host-accessible
/// device, Acts its activations<1, T>. On device::cpu with layout<1,1> the window's keys and values
/// are cached (nn::decode_step): one forward over the prompt, then one position per token while
/// the sequence fits the T positions; once it is longer each token reruns the window (its
/// positions shift), as nn::generate does for every token. The tokens are nn::generate's: the
/// logits agree to rounding (tests/unit/nn/test_kv_decode.cpp). Throws loom::input_error for
/// vocab outside [1, M::vocab], an empty prompt, a prompt id outside [0, vocab), or a
/// temperature <= 0.
template <class G, class Acts, class Ctx>
void generate_in_vocab(const G& model, Ctx& ctx, Acts& acts, std::vector<std::int32_t>& tokens, int count,
                       const sampling& s, int vocab) {
  using M = typename G::model;
  if (vocab < 1 || vocab > M::vocab)
    throw input_error("generate_in_vocab: vocabulary " + std::to_string(vocab) + " is outside [1, " +
                      std::to_string(M::vocab) + "] of model " + std::string(M::name) +
                      "; use a tokenizer with at most as many pieces as the model has ids");
  if (tokens.empty()) throw input_error("the prompt is empty; pass at least one character with --prompt");
  if (!(s.temperature > 0)) throw input_error("temperature must be > 0; pass e.g. --temperature 0.8");
  for (auto id : tokens)
    if (id < 0 || id >= vocab)
      throw input_error("prompt token id " + std::to_string(id) + " is outside the tokenizer's vocabulary [0, " +
                        std::to_string(vocab) + ")");
  constexpr int T = Acts::seq;
  constexpr bool cached = std::is_same_v<typename G::device, device::cpu> && G::TP == 1 && G::PP == 1;
  std::conditional_t<cached, decode_scratch<G>, int> scratch{};
  int in_cache = 0;  // positions [0, in_cache) of tokens have their keys and values in acts
  for (int j = 0; j < count; ++j) {
    const int len = std::min<int>(int(tokens.size()), T);
    const typename G::storage_t* last = nullptr;
    if constexpr (cached)
      if (in_cache > 0 && int(tokens.size()) <= T) {  // the window starts at 0: the cache holds len - 1
        last = decode_step(model, ctx, acts, scratch, tokens.back(), in_cache);
        ++in_cache;
      }
    if (!last) {
      const std::int32_t* window = tokens.data() + tokens.size() - len;
      model.forward(ctx, acts, window, nullptr, 1, len);
      last = acts.logits() + std::size_t(len - 1) * M::vocab_padded;
      in_cache = int(tokens.size()) <= T ? len : 0;
    }
    tokens.push_back(sample_token(last, vocab, s, random_uniform(s.seed, 7, std::uint64_t(j))));
  }
}

}  // namespace loom::nn
