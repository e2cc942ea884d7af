#pragma once
/// \file nn::decode_step — one new token through a loom::nn::transformer with a key/value cache.
///
/// Sampling a token from the whole window reruns every earlier position: 2 N P FLOPs for a
/// window of N tokens and P parameters, so a sample of n tokens costs O(n²). The keys and
/// values of earlier positions do not change when a token is appended (causal attention), so
/// they can be kept: one token then costs one position, 2 P FLOPs plus its attention over the
/// cache (the "KV cache" of every inference engine; Pope et al. 2022, "Efficiently Scaling
/// Transformer Inference", §2).
///
/// The cache here is the activation table itself: a forward over positions [0, len) leaves the
/// rotated q, k, v rows of every layer in acts.block(l).qkv (row t at t * QKV), and
/// decode_step writes position len's row in the same place, then attends over rows [0, len].
/// So after a forward of a prompt, decode_step continues it with no copy and no memory beyond
/// the table (the table must keep every layer's qkv: recompute::none, its default).
///
/// The arithmetic is the forward's with n = 1 row (the same kernels::ops calls: the norms, the
/// linear layers, GELU or SwiGLU, the residual adds, RoPE at the row's position), except the
/// attention of the one query row, which is computed here in double precision over the cached
/// keys and values (scale 1/sqrt(hd), key/value head h / (NH / KV) for query head h, as the
/// fused kernel's attention_shape). The logits equal the forward's last row to rounding
/// (tests/unit/nn/test_kv_decode.cpp checks 1e-5).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/kernels/rope_table.hpp>
#include <loom/models/params.hpp>
#include <loom/nn/activations.hpp>

namespace loom::nn {

/// Scratch of decode_step for model type G (an nn::transformer on device::cpu with layout<1,1>):
/// one row of each intermediate, the logits row, and the rotary tables. Allocated once
/// (C, H, FC and Vp values of the storage type; 2 max_seq hd/2 of the accumulator type).
template <class G>
struct decode_scratch {
  using storage_t = typename G::storage_t;
  using acc_t = typename G::acc_t;
  static_assert(std::is_same_v<typename G::device, device::cpu>, "nn::decode_step runs on device::cpu");
  static_assert(G::TP == 1 && G::PP == 1, "nn::decode_step needs the whole model on one rank (layout<1, 1>)");

  std::vector<storage_t> x = std::vector<storage_t>(G::C), ln = x, atty = x, proj = x, res = x;
  std::vector<storage_t> fch = std::vector<storage_t>(std::size_t(G::FCl)), fchg = std::vector<storage_t>(std::size_t(G::Hl));
  std::vector<storage_t> logits = std::vector<storage_t>(std::size_t(G::Vp));
  std::vector<acc_t> stats = std::vector<acc_t>(2);
  std::vector<acc_t> rope_cos, rope_sin;  ///< (max_seq, hd/2) each; rotary recipes only

  decode_scratch() {
    if constexpr (G::rotary) {
      const std::size_t half = std::size_t(G::model::max_seq) * G::HD / 2;
      rope_cos.resize(half);
      rope_sin.resize(half);
      kernels::rope_table(rope_cos.data(), rope_sin.data(), G::model::max_seq, G::HD, acc_t(models::rope_theta_of<typename G::model>()));
    }
  }
};

namespace detail {
/// Layer l's slice of role r's tensor in `model` (the start of a whole-model tensor for roles
/// without layers); null when the recipe has no tensor of role r (a bias-free recipe's biases).
template <class G>
const typename G::storage_t* decode_weight(const G& model, models::role r, int l = 0) noexcept {
  const int k = models::rows_by_role<typename G::model>[int(r)];
  if (k < 0) return nullptr;
  const auto& s = G::table[std::size_t(k)];
  return model.parameter(std::size_t(k)).data() + std::size_t(l) * (s.per_layer ? s.layer_size() : 0);
}

/// out (NH hd) = causal attention of position `pos`'s query row over the key and value rows
/// [0, pos] of qkv ((pos + 1) rows of ld = (NH + 2 KV) hd: [q | k | v]), in double precision.
template <class S>
void decode_attention(S* out, const S* qkv, int pos, int NH, int KV, int hd) {
  const std::size_t ld = std::size_t(NH + 2 * KV) * hd;
  const int group = NH / KV;
  const double scale = 1.0 / std::sqrt(double(hd));
#pragma omp parallel for schedule(static)
  for (int h = 0; h < NH; ++h) {
    const S* q = qkv + std::size_t(pos) * ld + std::size_t(h) * hd;
    const std::size_t k_off = std::size_t(NH + h / group) * hd, v_off = std::size_t(NH + KV + h / group) * hd;
    std::vector<double> p(std::size_t(pos) + 1);
    double mx = -INFINITY;
    for (int j = 0; j <= pos; ++j) {
      const S* k = qkv + std::size_t(j) * ld + k_off;
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(q[i]) * double(k[i]);
      p[std::size_t(j)] = d * scale;
      mx = std::max(mx, p[std::size_t(j)]);
    }
    double sum = 0;
    for (auto& e : p) sum += e = std::exp(e - mx);
    std::vector<double> y(std::size_t(hd), 0.0);
    for (int j = 0; j <= pos; ++j) {
      const S* v = qkv + std::size_t(j) * ld + v_off;
      const double w = p[std::size_t(j)] / sum;
      for (int i = 0; i < hd; ++i) y[std::size_t(i)] += w * double(v[i]);
    }
    for (int i = 0; i < hd; ++i) out[std::size_t(h) * hd + i] = S(y[std::size_t(i)]);
  }
}
}  // namespace detail

/// Runs token `token` at position `pos` through `model` (G: nn::transformer on device::cpu,
/// layout<1,1>) with the keys and values of positions [0, pos) taken from `acts` — a forward over
/// those positions (model.forward(ctx, acts, tokens, nullptr, 1, pos)) or earlier decode_steps —
/// and writes position pos's rotated q, k, v row into every layer's acts.block(l).qkv.
/// Returns the position's logits (G::Vp values, the first G::V meaningful) in `scratch.logits`.
/// Cost: ~2 P FLOPs for P parameters plus 4 (pos + 1) C per layer for the attention.
/// Throws loom::input_error for a token outside [0, vocab) or a position outside [0, T) of the
/// table; std::invalid_argument when the table does not keep every layer's qkv (a recompute mode).
template <class G, class Acts>
const typename G::storage_t* decode_step(const G& model, context<device::cpu>& ctx, Acts& acts, decode_scratch<G>& scratch,
                                         std::int32_t token, int pos) {
  using M = typename G::model;
  using ops = typename G::ops;
  using acc_t = typename G::acc_t;
  constexpr int C = G::C, HD = G::HD, NH = G::NHl, KV = G::KVl, QKV = G::QKVl, H = G::Hl, FC = G::FCl;
  if (token < 0 || token >= M::vocab)
    throw input_error("decode_step: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                      std::to_string(M::vocab) + ")");
  if (pos < 0 || pos >= Acts::seq)
    throw input_error("decode_step: position " + std::to_string(pos) + " is outside the table's [0, " +
                      std::to_string(Acts::seq) + "); start again from a forward of the last " +
                      std::to_string(Acts::seq) + " tokens");
  if (acts.mode != recompute::none)
    throw std::invalid_argument("decode_step: the activation table keeps one block's qkv only (a recompute mode); "
                      "decode from a table with recompute::none");
  auto& s = scratch;
  using models::role;
  const auto* wpe = detail::decode_weight(model, role::wpe);
  ops::encoder_forward(ctx, s.x.data(), &token, detail::decode_weight(model, role::wte),
                       wpe ? wpe + std::size_t(pos) * C : nullptr, 1, 1, C);
  auto norm = [&](typename G::storage_t* out, const typename G::storage_t* in, role wr, role br, int l) {
    if constexpr (G::rms)
      ops::rmsnorm_forward(ctx, out, s.stats.data() + 1, in, detail::decode_weight(model, wr, l), 1, C,
                           acc_t(models::norm_eps_of<M>()));
    else
      ops::layernorm_forward(ctx, out, s.stats.data(), s.stats.data() + 1, in, detail::decode_weight(model, wr, l),
                             detail::decode_weight(model, br, l), 1, C);
  };
  auto linear = [&](typename G::storage_t* out, const typename G::storage_t* in, role wr, role br, int l, int cin, int oc) {
    ops::matmul_forward(ctx, out, in, detail::decode_weight(model, wr, l), br == role::count ? nullptr : detail::decode_weight(model, br, l),
                        1, cin, oc);
  };
  for (int l = 0; l < G::L; ++l) {
    auto* qkv = acts.block(l).qkv;
    auto* row = qkv + std::size_t(pos) * QKV;
    norm(s.ln.data(), s.x.data(), role::ln1_w, role::ln1_b, l);
    linear(row, s.ln.data(), role::qkv_w, role::qkv_b, l, C, QKV);
    if constexpr (G::rotary)
      ops::rope_forward(ctx, row, s.rope_cos.data() + std::size_t(pos) * HD / 2, s.rope_sin.data() + std::size_t(pos) * HD / 2,
                        1, 1, NH + KV, HD, QKV);
    detail::decode_attention(s.atty.data(), qkv, pos, NH, KV, HD);
    linear(s.proj.data(), s.atty.data(), role::attproj_w, role::attproj_b, l, C, C);
    ops::residual_forward(ctx, s.res.data(), s.x.data(), s.proj.data(), C);
    norm(s.ln.data(), s.res.data(), role::ln2_w, role::ln2_b, l);
    linear(s.fch.data(), s.ln.data(), role::fc_w, role::fc_b, l, C, FC);
    if constexpr (G::swiglu) ops::swiglu_forward(ctx, s.fchg.data(), s.fch.data(), 1, H);
    else ops::gelu_forward(ctx, s.fchg.data(), s.fch.data(), std::size_t(H));
    linear(s.proj.data(), s.fchg.data(), role::fcproj_w, role::fcproj_b, l, H, C);
    ops::residual_forward(ctx, s.x.data(), s.res.data(), s.proj.data(), C);
  }
  norm(s.ln.data(), s.x.data(), role::lnf_w, role::lnf_b, 0);
  linear(s.logits.data(), s.ln.data(), G::head, role::count, 0, C, G::Vp);
  return s.logits.data();
}

}  // namespace loom::nn
