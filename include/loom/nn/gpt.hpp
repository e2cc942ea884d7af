#pragma once
/// \file loom::gpt<Model, Policy, Attention>: a GPT-2 style decoder, forward and backward.
///
/// Architecture (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners";
/// llm.c's train_gpt2.c): token + learned position embeddings; n_layer pre-LayerNorm blocks
/// of causal multi-head self-attention and a 4x GELU(tanh) MLP, each added to the residual
/// stream; a final LayerNorm; the LM head tied to the token embedding (its gradient
/// accumulates both uses); fused softmax cross-entropy over the real vocabulary.
///
/// Shape legend: B micro-batch, T sequence, C = d_model, NH heads, HD = C/NH, Vp padded
/// vocabulary, L layers. Parameters and their gradients each live in one contiguous buffer
/// laid out by nn::param_table; activations in the buffers of gpt::activations<B,T>.
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/random.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/models/configs.hpp>
#include <loom/nn/activations.hpp>
#include <loom/nn/params.hpp>
#include <loom/policy.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace loom::nn {

/// Worker threads the kernels may use (sizes per-thread scratch).
inline int max_threads() noexcept {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// The default `ready` hook of gpt::backward: does nothing.
struct no_ready_hook {
  constexpr void operator()(int) const noexcept {}
};

/// A GPT model's parameters and gradients on one rank, and its forward/backward passes.
///
/// Template arguments: M a models::model_config; Policy a loom::policy<Device, Precision,
/// Layout>; Attn the attention implementation tag: kernels::fused (the default: flash-style,
/// saves O(B·NH·T) statistics) or kernels::reference (unfused, saves the O(B·NH·T²)
/// probabilities; for debugging and consistency checks).
/// Memory: parameter_count * (sizeof(storage) + sizeof(grad_t)) bytes, allocated once at construction.
/// Errors: construction throws what Device::allocate throws.
template <models::model_config M, class Policy, class Attn = kernels::fused>
class gpt {
 public:
  using model = M;
  using policy = Policy;
  using device = typename Policy::device;
  using precision = typename Policy::precision;
  using layout = typename Policy::layout;
  using storage_t = typename precision::storage;
  using ops = kernels::ops<device, storage_t>;
  using attention = kernels::attention<device, storage_t, Attn>;
  using acc_t = typename ops::acc;
  /// Parameter-gradient element type: fp32 for 16-bit storage (kernels::gradient_t).
  using grad_t = kernels::gradient_t<device, precision>;

  static_assert(parallel::fits<layout, M>());
  static_assert(kernels::coverage<device, precision>::ok);  // names a missing (operator, precision) pair
  static_assert(layout::tp == 1 && layout::pp == 1,
                "loom::gpt: this build executes layout<1,1> (one replica per rank, data parallel "
                "only); tensor- and pipeline-parallel execution is not implemented yet");

  static constexpr auto table = param_table<M, layout>();
  static constexpr auto offsets = param_offsets<M, layout>();
  static constexpr std::size_t num_parameters = offsets.back();
  static constexpr int C = M::d_model, NH = M::n_head, L = M::n_layer / layout::pp;
  static constexpr int V = M::vocab, Vp = M::vocab_padded;

  /// Allocates parameters and gradients (zero) and initialises the parameters with `seed`.
  explicit gpt(context<device>& ctx, std::uint64_t seed = 1337)
      : params_(num_parameters, ctx.stream), grads_(num_parameters, ctx.stream) {
    initialize(ctx, seed);
  }

  /// GPT-2 initialisation: weights N(0, 0.02²), residual projections N(0, (0.02/sqrt(2L))²),
  /// LayerNorm gains 1, biases 0. Element i of tensor k is a pure function of (seed, k, i)
  /// (core/random.hpp), so any shard of a tensor can be drawn on its own.
  void initialize(context<device>& ctx, std::uint64_t seed) {
    std::vector<storage_t> host(num_parameters);
    for (int k = 0; k < num_param_tensors; ++k) {
      const auto& p = table[k];
      storage_t* dst = host.data() + offsets[k];
      const double stdev = p.how == init::residual_normal ? 0.02 / std::sqrt(2.0 * M::n_layer) : 0.02;
      for (std::size_t i = 0; i < p.size(); ++i) {
        switch (p.how) {
          case init::ones: dst[i] = storage_t(1); break;
          case init::zeros: dst[i] = storage_t(0); break;
          default: dst[i] = storage_t(stdev * random_normal(seed, std::uint64_t(k), i));
        }
      }
    }
    device::copy_to_device(params_.data(), host.data(), params_.bytes(), ctx.stream);
    ctx.synchronize();
  }

  view<device, storage_t> parameters() const noexcept { return params_.all(); }
  view<device, grad_t> gradients() const noexcept { return grads_.all(); }
  /// The whole tensor `p` (all layers of this stage).
  view<device, storage_t> parameter(param p) const noexcept {
    return params_.all().subview(offsets[int(p)], table[int(p)].size());
  }
  view<device, grad_t> gradient(param p) const noexcept {
    return grads_.all().subview(offsets[int(p)], table[int(p)].size());
  }
  /// Zeroes every gradient (call once per optimizer step, before the first micro-batch).
  void zero_grad(context<device>& ctx) { device::memset(grads_.data(), 0, grads_.bytes(), ctx.stream); }

  /// Saved activations and backward scratch for micro-batch capacity B and sequence
  /// capacity T (T <= max_seq, checked at compile time). Allocated once.
  template <int B, int T>
  struct activations {
    static_assert(B >= 1, "the micro-batch size B must be at least 1");
    static_assert(T >= 1 && T <= M::max_seq,
                  "the sequence length T must be between 1 and the model's max_seq (learned "
                  "position embeddings exist only for max_seq positions)");
    static constexpr int batch = B, seq = T;
    static inline const activation_sizes sizes = activation_table<M>(
        B, T, attention::saved_elems(B, NH, T), attention::scratch_elems(std::size_t(max_threads()), T));
    buffer<device, storage_t> s;  // storage-type activations
    buffer<device, acc_t> a;      // accumulator-type activations
    explicit activations(context<device>& ctx)
        : s(sizes.storage_total, ctx.stream), a(sizes.acc_total, ctx.stream) {}
    /// Bytes held by this activation table.
    std::size_t bytes() const noexcept { return s.bytes() + a.bytes(); }
    /// Per-token losses of the last forward (B*T values, accumulator type).
    const acc_t* losses() const noexcept { return a.data() + sizes.ln_stats + sizes.att; }
    /// Logits of the last forward (B,T,Vp), or dlogits if it was asked to write them.
    const storage_t* logits() const noexcept { return ptrs().logits; }

    struct pointers {
      storage_t *encoded, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3, *lnf, *logits;
      storage_t *proj_out, *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu;
      acc_t *ln_stats, *att, *losses, *attn_scratch;
    };
    pointers ptrs() const noexcept {
      pointers p{};
      storage_t* q = s.data();
      auto take = [&q](std::size_t n) { storage_t* r = q; q += n; return r; };
      p.encoded = take(sizes.encoded); p.ln1 = take(sizes.ln1); p.qkv = take(sizes.qkv);
      p.atty = take(sizes.atty); p.residual2 = take(sizes.residual2); p.ln2 = take(sizes.ln2);
      p.fch = take(sizes.fch); p.fch_gelu = take(sizes.fch_gelu); p.residual3 = take(sizes.residual3);
      p.lnf = take(sizes.lnf); p.logits = take(sizes.logits); p.proj_out = take(sizes.proj_out);
      p.dres = take(sizes.dres); p.dln = take(sizes.dln); p.dqkv = take(sizes.dqkv);
      p.datty = take(sizes.datty); p.dfch = take(sizes.dfch); p.dfch_gelu = take(sizes.dfch_gelu);
      acc_t* r = a.data();
      p.ln_stats = r; r += sizes.ln_stats;
      p.att = r; r += sizes.att;
      p.losses = r; r += sizes.losses;
      p.attn_scratch = r;
      return p;
    }
  };

  /// Forward pass over a micro-batch of b sequences of length t (b <= B, t <= T).
  ///   inputs  (b,t) int32 token ids in [0, vocab) — the caller validates them
  ///   targets (b,t) int32 in [0, vocab) or kernels::ignore_index (-1), or null for
  ///           logits only
  /// Writes the activations; when targets are given, the per-token losses; when grad_scale
  /// is non-zero, also overwrites the logits with dlogits = grad_scale * d(sum of losses)
  /// (fused softmax cross-entropy), ready for backward(). For a mean loss over the global
  /// batch pass grad_scale = 1 / (number of non-ignored targets in the global batch).
  /// Returns the sum of the per-token losses (0 without targets).
  template <int B, int T>
  acc_t forward(context<device>& ctx, activations<B, T>& acts, const std::int32_t* inputs,
                const std::int32_t* targets, int b, int t, acc_t grad_scale = 0) const {
    const auto p = acts.ptrs();
    const std::size_t BT = std::size_t(B) * T, N = std::size_t(b) * t;
    const int n = int(N);
    ops::encoder_forward(ctx, p.encoded, inputs, w(param::wte), w(param::wpe), b, t, C);
    const storage_t* residual = p.encoded;
    for (int l = 0; l < L; ++l) {
      storage_t* ln1 = p.ln1 + l * BT * C;
      storage_t* qkv = p.qkv + l * BT * 3 * C;
      storage_t* atty = p.atty + l * BT * C;
      storage_t* res2 = p.residual2 + l * BT * C;
      storage_t* ln2 = p.ln2 + l * BT * C;
      storage_t* fch = p.fch + l * BT * 4 * C;
      storage_t* fchg = p.fch_gelu + l * BT * 4 * C;
      storage_t* res3 = p.residual3 + l * BT * C;
      acc_t* st1 = p.ln_stats + (2 * l) * 2 * BT;
      acc_t* st2 = p.ln_stats + (2 * l + 1) * 2 * BT;
      acc_t* att = p.att + l * (acts.sizes.att / L);
      ops::layernorm_forward(ctx, ln1, st1, st1 + BT, residual, w(param::ln1_w, l), w(param::ln1_b, l), n, C);
      ops::matmul_forward(ctx, qkv, ln1, w(param::qkv_w, l), w(param::qkv_b, l), n, C, 3 * C);
      attention::forward(ctx, atty, att, qkv, b, t, C, NH);
      ops::matmul_forward(ctx, p.proj_out, atty, w(param::attproj_w, l), w(param::attproj_b, l), n, C, C);
      ops::residual_forward(ctx, res2, residual, p.proj_out, N * C);
      ops::layernorm_forward(ctx, ln2, st2, st2 + BT, res2, w(param::ln2_w, l), w(param::ln2_b, l), n, C);
      ops::matmul_forward(ctx, fch, ln2, w(param::fc_w, l), w(param::fc_b, l), n, C, 4 * C);
      ops::gelu_forward(ctx, fchg, fch, N * 4 * C);
      ops::matmul_forward(ctx, p.proj_out, fchg, w(param::fcproj_w, l), w(param::fcproj_b, l), n, 4 * C, C);
      ops::residual_forward(ctx, res3, res2, p.proj_out, N * C);
      residual = res3;
    }
    acc_t* stf = p.ln_stats + (2 * L) * 2 * BT;
    ops::layernorm_forward(ctx, p.lnf, stf, stf + BT, residual, w(param::lnf_w), w(param::lnf_b), n, C);
    ops::matmul_forward(ctx, p.logits, p.lnf, w(param::wte), nullptr, n, C, Vp);
    if (!targets) return 0;
    return ops::crossentropy(ctx, p.logits, p.losses, targets, n, V, Vp, grad_scale != acc_t(0), grad_scale);
  }

  /// Backward pass of the last forward (which must have had targets and grad_scale != 0).
  /// Accumulates (+=) every parameter gradient; the activation buffers' gradient scratch
  /// is overwritten. inputs, b, t as given to forward.
  /// `ready(layer)` is called as soon as this pass will not touch some gradients again (data
  /// parallelism starts their all-reduce while backward goes on, parallel/data_parallel.hpp):
  ///   ready(L)            after the final LayerNorm: lnf_w, lnf_b are final
  ///   ready(l), l = L-1..0  after block l: its slices of ln1_w..fcproj_b are final
  ///   ready(-1)           at the end: wte (LM head and embedding uses) and wpe are final
  /// Work queued on ctx before the call is part of those gradients (synchronize before reading
  /// them on an asynchronous device). The default does nothing.
  template <int B, int T, class Ready = no_ready_hook>
  void backward(context<device>& ctx, activations<B, T>& acts, const std::int32_t* inputs, int b, int t,
                Ready&& ready = {}) {
    const auto p = acts.ptrs();
    const std::size_t BT = std::size_t(B) * T, N = std::size_t(b) * t;
    const int n = int(N);
    // LM head (tied): dlnf = dlogits wte; dwte += dlogits^T lnf
    ops::matmul_backward(ctx, p.dln, g(param::wte), static_cast<grad_t*>(nullptr), p.logits, p.lnf, w(param::wte), n, C, Vp, false);
    device::memset(p.dres, 0, N * C * sizeof(storage_t), ctx.stream);
    const storage_t* last = L > 0 ? p.residual3 + (L - 1) * BT * C : p.encoded;
    acc_t* stf = p.ln_stats + (2 * L) * 2 * BT;
    ops::layernorm_backward(ctx, p.dres, g(param::lnf_w), g(param::lnf_b), p.dln, last, w(param::lnf_w), stf,
                            stf + BT, n, C);
    ready(L);
    for (int l = L - 1; l >= 0; --l) {
      const storage_t* residual = l == 0 ? p.encoded : p.residual3 + (l - 1) * BT * C;
      storage_t* ln1 = p.ln1 + l * BT * C;
      storage_t* qkv = p.qkv + l * BT * 3 * C;
      storage_t* atty = p.atty + l * BT * C;
      storage_t* res2 = p.residual2 + l * BT * C;
      storage_t* ln2 = p.ln2 + l * BT * C;
      storage_t* fch = p.fch + l * BT * 4 * C;
      storage_t* fchg = p.fch_gelu + l * BT * 4 * C;
      acc_t* st1 = p.ln_stats + (2 * l) * 2 * BT;
      acc_t* st2 = p.ln_stats + (2 * l + 1) * 2 * BT;
      acc_t* att = p.att + l * (acts.sizes.att / L);
      // MLP: dres holds d(residual3) = d(fcproj out) and the direct part of d(residual2)
      ops::matmul_backward(ctx, p.dfch_gelu, g(param::fcproj_w, l), g(param::fcproj_b, l), p.dres, fchg,
                           w(param::fcproj_w, l), n, 4 * C, C, false);
      ops::gelu_backward(ctx, p.dfch, fch, p.dfch_gelu, N * 4 * C);
      ops::matmul_backward(ctx, p.dln, g(param::fc_w, l), g(param::fc_b, l), p.dfch, ln2, w(param::fc_w, l), n, C,
                           4 * C, false);
      ops::layernorm_backward(ctx, p.dres, g(param::ln2_w, l), g(param::ln2_b, l), p.dln, res2, w(param::ln2_w, l),
                              st2, st2 + BT, n, C);
      // attention: dres now holds d(residual2) = d(attproj out) and the direct part of d(input)
      ops::matmul_backward(ctx, p.datty, g(param::attproj_w, l), g(param::attproj_b, l), p.dres, atty,
                           w(param::attproj_w, l), n, C, C, false);
      attention::backward(ctx, p.dqkv, p.datty, qkv, atty, att, p.attn_scratch, b, t, C, NH);
      ops::matmul_backward(ctx, p.dln, g(param::qkv_w, l), g(param::qkv_b, l), p.dqkv, ln1, w(param::qkv_w, l), n,
                           C, 3 * C, false);
      ops::layernorm_backward(ctx, p.dres, g(param::ln1_w, l), g(param::ln1_b, l), p.dln, residual,
                              w(param::ln1_w, l), st1, st1 + BT, n, C);
      ready(l);
    }
    ops::encoder_backward(ctx, g(param::wte), g(param::wpe), p.dres, inputs, b, t, C);
    ready(-1);
  }

 private:
  /// Pointer to tensor p (layer l's slice for per-layer tensors).
  storage_t* w(param p, int l = 0) const noexcept { return slice(params_.data(), p, l); }
  grad_t* g(param p, int l = 0) const noexcept { return slice(grads_.data(), p, l); }
  template <class E>
  static E* slice(E* base, param p, int l) noexcept {
    const auto& s = table[int(p)];
    const std::size_t per = s.ndim >= 2 && int(p) >= int(param::ln1_w) && int(p) <= int(param::fcproj_b)
                                ? s.size() / std::size_t(s.shape[0])
                                : 0;
    return base + offsets[int(p)] + std::size_t(l) * per;
  }

  buffer<device, storage_t> params_;
  buffer<device, grad_t> grads_;
};

}  // namespace loom::nn

namespace loom {
using nn::gpt;
}
