#pragma once
/// \file loom::nn::transformer<Model, Policy, Attention>: one rank's part of a decoder-only
/// Transformer under layout<TP, PP> — tensor-parallel rank tp_rank() of pipeline stage stage() —
/// forward and backward. One class for every layout: at TP = 1 its tensor-parallel collectives
/// compile away (Megatron-LM's `_reduce` returns its input for a one-rank group) and the
/// embedding and loss are the fused single-rank kernels; at PP = 1 the stage slice is the whole
/// model. nn::transformer (layout<1,1>) and nn::transformer are this class.
///
/// Architecture, as the model's recipe (models/recipe.hpp) chooses: GPT-2 (Radford et al. 2019,
/// "Language Models are Unsupervised Multitask Learners"; llm.c's train_gpt2.c) or Llama
/// (Touvron et al. 2023; Hugging Face's LlamaForCausalLM). Token embeddings (+ learned position
/// embeddings for GPT-2); n_layer pre-norm blocks
///   norm1 -> qkv (column-parallel) [-> RoPE on q, k] -> causal attention -> proj (row-parallel) -> + residual
///   norm2 -> fc (column-parallel) -> GELU(tanh) | SwiGLU -> proj (row-parallel) -> + residual
/// a final norm (LayerNorm or RMSNorm); the LM head tied to the token embedding (its gradient
/// accumulates both uses) or a matrix of its own; fused softmax cross-entropy over the real
/// vocabulary. Grouped-query attention when the config has n_kv_head < n_head: qkv rows are
/// [q: NH heads | k: KV heads | v: KV heads]. Which tensors exist (biases, positions, the head)
/// is the model's parameter table (models/params.hpp), generated from its recipe.
///
/// The split follows Megatron-LM (Shoeybi et al. 2019 §3; Narayanan et al. 2021 §2):
///   tensor parallel   qkv and fc column-parallel (a rank owns NH/TP whole query heads, KV/TP
///                     key/value heads and H/TP MLP columns of each fc section), attention projection and fc2 row-parallel, token embedding and
///                     LM head vocab-parallel with the vocab-parallel cross-entropy
///                     (parallel/tensor_parallel.hpp); norms, position embedding and row-parallel
///                     biases replicated. Two all-reduces of (N, C) per block forward, two backward.
///   pipeline parallel stage s owns layers [s*L/PP, (s+1)*L/PP); the first stage also the
///                     embedding, the last the final norm and the LM head (a tied head is a copy
///                     of wte: tie_embedding_gradients sums the two copies' gradients).
///                     Activations enter a stage through activations::input() and leave through
///                     output(); gradients come back through output_grad() and leave through
///                     input_grad() — the pipeline executor (parallel::pipeline_forward_backward) moves
///                     them.
///
/// Shape legend: B micro-batch, T sequence, C = d_model, NH heads, KV key/value heads, HD = C/NH,
/// H the MLP width (d_ff; 4C for GPT-2), Vp padded vocabulary, L layers of this stage; per rank
/// Cl = C/TP, NHl = NH/TP, KVl = KV/TP, QKVl = (NHl + 2 KVl) HD, Hl = H/TP, FCl = Hl (GELU) or
/// 2 Hl (SwiGLU: gate and up), Vl = Vp/TP.
///
/// The parameter buffer is laid out by models::param_table<M, layout> (local shapes). Every stage
/// holds every row of that table (so checkpoints and the optimizer see one layout), but uses
/// the global rows only on the stages of their `used` field (models::stage_uses); the others stay at
/// their initial values with zero gradients. Initialisation is the same for every layout: element
/// i of a local tensor is drawn at its index in the unsharded tensor (nn::global_index), so the
/// gathered model is bitwise the single-rank one.
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/random.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/kernels/rope_table.hpp>
#include <loom/models/configs.hpp>
#include <loom/nn/activations.hpp>
#include <loom/nn/dropout.hpp>
#include <loom/models/params.hpp>
#include <loom/nn/shard.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/pipeline.hpp>
#include <loom/parallel/scalars.hpp>
#include <loom/parallel/tensor_parallel.hpp>
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

/// One rank's part of a model under Policy::layout = layout<TP, PP>.
///
/// Template arguments: M a models::model_config (its recipe: models::arch_of<M>); Policy a
/// loom::policy<Device, Precision, Layout>; Attn the attention implementation tag:
/// kernels::fused (the default: flash-style, saves O(B·NH·T) statistics) or kernels::reference
/// (unfused, saves the O(B·NH·T²) probabilities; for debugging and consistency checks).
/// Communication goes through the groups passed to forward, backward and the gradient helpers
/// (explicit, never stored): `tp` the tensor-parallel group (size TP), `pp` the pipeline group.
/// At TP = 1 forward and backward may be called without a group.
/// Memory: num_parameters * (sizeof(storage_t) + sizeof(grad_t)) bytes (+ one wte shard of
/// gradient scratch on the first and last stage when PP > 1 and the head is tied), allocated at
/// construction. Errors: construction throws what Device::allocate throws.
template <models::model_config M, class Policy, class Attn = kernels::fused>
class transformer {
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
  /// The dropout of one optimizer step's micro-batches (parallel::pipeline_forward_backward's `drop`).
  using dropout_plan = nn::dropout_plan;
  /// Parameter-gradient element type: fp32 for 16-bit storage (kernels::gradient_t) —
  /// gradients accumulate over micro-batches and enter the norm, the tied-embedding sum and the
  /// dp all-reduce in fp32.
  using grad_t = kernels::gradient_t<device, precision>;

  static_assert(models::fits<layout, M>());
  static constexpr models::recipe arch = models::arch_of<M>();
  static constexpr bool rms = arch.norm == models::norm_kind::rmsnorm, rotary = arch.position == models::position_kind::rotary,
                        swiglu = arch.mlp == models::mlp_kind::swiglu;
  static_assert(!(rms || rotary || swiglu) || kernels::has_llama_ops<device, storage_t>,
                "loom::nn::transformer: this recipe asks for RMSNorm, rotary positions or SwiGLU, whose kernels "
                "(rmsnorm_*, rope_*, swiglu_* of kernels::ops) this device lacks; train it on device::cpu, or add "
                "them to the device's kernels::ops");
  static_assert(kernels::coverage<device, precision>::ok);  // names a missing (operator, precision) pair
  static constexpr int TP = layout::tp, PP = layout::pp;
  static_assert(TP == 1 || kernels::has_vocab_parallel<device, storage_t>,
                "loom::nn::transformer: tensor parallelism (TP > 1) needs the vocab-parallel embedding and "
                "cross-entropy pieces in kernels::ops for this device (embedding_shard_forward/backward, "
                "vocab_shard_max/sums/finish), which it lacks; use layout<1, PP> on this device");
  static constexpr int C = M::d_model, NH = M::n_head, L = M::n_layer / PP, HD = C / NH;
  static constexpr int KV = models::kv_heads_of<M>(), H = models::mlp_hidden_of<M>();
  static constexpr int Cl = C / TP, NHl = NH / TP, KVl = KV / TP, Hl = H / TP;  // per-rank widths
  static constexpr int QKVl = (NHl + 2 * KVl) * HD, FCl = swiglu ? 2 * Hl : Hl;
  /// Grouped-query attention: fewer key/value heads than query heads.
  static constexpr bool gqa = KV != NH;
  static_assert(!gqa || kernels::has_gqa<attention>,
                "loom::nn::transformer: this model has fewer key/value heads than query heads (grouped-query "
                "attention), which this attention implementation does not compute; use kernels::fused on the CPU");
  static constexpr int V = M::vocab, Vp = M::vocab_padded, Vl = Vp / TP;
  static constexpr auto table = models::param_table<M, layout>();
  static constexpr std::size_t num_tensors = table.size();
  static constexpr auto offsets = models::param_offsets<M, layout>();
  static constexpr std::size_t num_parameters = offsets.back();
  /// Whether this (device, precision, attention) can train with dropout: the device has the
  /// elementwise dropout kernel and the attention implementation applies probability dropout.
  /// Today: the CPU with kernels::fused.
  static constexpr bool supports_dropout = kernels::has_dropout<device, storage_t> && kernels::has_attention_dropout<attention>;
  /// The LM head's weight: the token embedding when the recipe ties them.
  static constexpr bool tied = models::rows_by_role<M>[int(models::role::lm_head)] < 0;
  static constexpr models::role head = tied ? models::role::wte : models::role::lm_head;

  /// Throws loom::input_error for a probability outside [0, 1) and for p > 0 where dropout is
  /// not implemented (!supports_dropout): on a device without dropout kernels (Ascend: dropout
  /// runs on the CPU only so far) or with kernels::reference attention.
  static void check_dropout(const dropout_state& drop) {
    check_dropout_probability(drop.p, "dropout probability");
    if (!drop.active() || supports_dropout) return;
    if constexpr (!kernels::has_dropout<device, storage_t>)
      throw input_error("dropout " + std::to_string(drop.p) + " on device " + std::string(device::name) +
                        ": dropout runs on the CPU only so far (this device has no dropout kernels); "
                        "train with --dropout 0 here, or on device::cpu");
    else
      throw input_error("dropout " + std::to_string(drop.p) +
                        " needs the fused attention (kernels::fused), which applies attention-probability "
                        "dropout; kernels::reference does not: use kernels::fused or --dropout 0");
  }

  /// The whole model on one rank (layout<1,1>): allocates parameters and gradients (zero) and
  /// initialises the parameters with `seed`.
  explicit transformer(context<device>& ctx, std::uint64_t seed = 1337)
    requires(TP == 1 && PP == 1)
      : transformer(ctx, 0, 0, seed) {}

  /// Rank (tp_rank, stage)'s part: allocates its parameters and gradients (zero) and
  /// initialises the parameters with `seed` exactly as the single-rank model would, restricted
  /// to this rank's slices. Throws loom::input_error if tp_rank is outside [0, TP) or stage
  /// outside [0, PP).
  transformer(context<device>& ctx, int tp_rank, int stage, std::uint64_t seed = 1337)
      : tp_rank_(tp_rank), stage_(stage), params_(num_parameters, ctx.stream), grads_(num_parameters, ctx.stream),
        rope_(rotary ? std::size_t(M::max_seq) * HD : 0, ctx.stream) {
    if (tp_rank < 0 || tp_rank >= TP || stage < 0 || stage >= PP)
      throw input_error("nn::transformer: rank (tp " + std::to_string(tp_rank) + ", stage " + std::to_string(stage) +
                        ") is outside layout<" + std::to_string(TP) + ", " + std::to_string(PP) +
                        ">; pass groups.tp.rank() and groups.pp.rank() of make_groups<layout>(world)");
    if constexpr (PP > 1 && tied)
      if (first_stage() || last_stage())
        tie_scratch_ = buffer<device, grad_t>(table[std::size_t(models::rows_by_role<M>[int(models::role::wte)])].size(), ctx.stream);
    if constexpr (rotary) {  // cos then sin, (max_seq, HD/2) each (kernels/rope_table.hpp)
      std::vector<acc_t> host(rope_.size());
      const std::size_t half = std::size_t(M::max_seq) * HD / 2;
      kernels::rope_table(host.data(), host.data() + half, M::max_seq, HD, acc_t(models::rope_theta_of<M>()));
      device::copy_to_device(rope_.data(), host.data(), rope_.bytes(), ctx.stream);
    }
    initialize(ctx, seed);
  }

  int tp_rank() const noexcept { return tp_rank_; }
  int stage() const noexcept { return stage_; }
  bool first_stage() const noexcept { return PP == 1 || stage_ == 0; }
  bool last_stage() const noexcept { return PP == 1 || stage_ == PP - 1; }

  /// GPT-2 initialisation: weights N(0, 0.02²), residual projections N(0, (0.02/sqrt(2L))²),
  /// norm gains 1, biases 0. Element i of a tensor of role r is a pure function of (seed, r,
  /// its index in the unsharded tensor) (core/random.hpp), so any shard is drawn on its own.
  void initialize(context<device>& ctx, std::uint64_t seed) {
    std::vector<storage_t> host(num_parameters);
    for (std::size_t k = 0; k < num_tensors; ++k) {
      const auto& p = table[k];
      storage_t* dst = host.data() + offsets[k];
      const double stdev = p.how == models::init::residual_normal ? 0.02 / std::sqrt(2.0 * M::n_layer) : 0.02;
      for (std::size_t i = 0; i < p.size(); ++i) {
        switch (p.how) {
          case models::init::ones: dst[i] = storage_t(1); break;
          case models::init::zeros: dst[i] = storage_t(0); break;
          default:
            dst[i] = storage_t(stdev * random_normal(seed, std::uint64_t(p.id),
                                                     TP == 1 && PP == 1 ? i : global_index<M, layout>(k, tp_rank_, stage_, i)));
        }
      }
    }
    device::copy_to_device(params_.data(), host.data(), params_.bytes(), ctx.stream);
    ctx.synchronize();
  }

  view<device, storage_t> parameters() const noexcept { return params_.all(); }
  view<device, grad_t> gradients() const noexcept { return grads_.all(); }
  /// The whole local tensor of table row k (all layers of this stage).
  view<device, storage_t> parameter(std::size_t k) const noexcept {
    return params_.all().subview(offsets[k], table[k].size());
  }
  view<device, grad_t> gradient(std::size_t k) const noexcept { return grads_.all().subview(offsets[k], table[k].size()); }
  /// The local tensor of role p; the recipe must have it (rows_by_role).
  view<device, storage_t> parameter(models::role p) const noexcept { return parameter(std::size_t(models::rows_by_role<M>[int(p)])); }
  view<device, grad_t> gradient(models::role p) const noexcept { return gradient(std::size_t(models::rows_by_role<M>[int(p)])); }
  /// Called by forward() before it reads a layer's parameters, with the layer: -1 before the
  /// embedding (first stage), l before block l, L after the blocks (every stage; the final norm
  /// and LM head follow on the last). Empty by default. An overlapped offloaded optimizer's
  /// update (optim::offload_adamw::await_layer, installed by train::trainer) makes the
  /// stream wait for that layer's updated parameters here.
  std::function<void(context<device>&, int layer)> before_layer;

  /// Zeroes every gradient (call once per optimizer step, before the first micro-batch).
  void zero_grad(context<device>& ctx) { device::memset(grads_.data(), 0, grads_.bytes(), ctx.stream); }

  /// Pointers into an activation table (nn/activations.hpp): one block's saved state, and every
  /// tensor's start.
  using block_saved = block_pointers<storage_t, acc_t>;
  using act_pointers = activation_pointers<storage_t, acc_t>;

  /// Saved activations and scratch of one micro-batch on this rank, capacity (B, T) (T <=
  /// max_seq, checked at compile time); allocated once. A pipeline stage needs
  /// parallel::max_in_flight(PP, m, stage) of them (one per micro-batch in flight).
  template <int B, int T>
  struct activations {
    static_assert(B >= 1, "the micro-batch size B must be at least 1");
    static_assert(T >= 1 && T <= M::max_seq,
                  "the sequence length T must be between 1 and the model's max_seq (learned "
                  "position embeddings exist only for max_seq positions)");
    static constexpr int batch = B, seq = T;
    static constexpr std::size_t BT = std::size_t(B) * T;
    /// Element counts of every activation (nn/activations.hpp), for this rank's widths, under
    /// recompute mode r.
    static activation_sizes sizes_of(recompute r = recompute::none) {
      return activation_table(
          activation_dims{.B = B, .T = T, .layers = L, .C = C, .qkv = QKVl, .att_out = Cl, .mlp_in = FCl, .hidden = Hl,
                          .logits = Vl,
                          .attn_saved = attention::saved_elems(B, NHl, T),
                          .attn_scratch = attention::scratch_elems(std::size_t(max_threads()), T),
                          .ce_scratch = TP > 1 ? parallel::vocab_parallel_crossentropy_scratch(int(BT)) : 0,
                          .mode = r});
    }
    recompute mode;               // what backward reruns (nn/activations.hpp)
    activation_sizes sizes;       // this table's element counts (sizes_of(mode))
    buffer<device, storage_t> s;  // storage-type activations
    buffer<device, acc_t> a;      // accumulator-type activations
    /// The dropout of the last forward on this table (written by forward, read by backward, which
    /// regenerates its masks: Note [dropout masks are regenerated] in nn/dropout.hpp).
    dropout_state dropout{};
    /// Where forward() on the last stage puts the per-token losses (b*t floats) on the host
    /// instead of returning their sum: null (the default) = summed and returned (on a device
    /// that reads them back, a stream synchronize); else, where the kernels can (the NPU,
    /// TP = 1), pinned host memory they are copied to on the stream, and forward() returns 0 —
    /// read them after synchronizing (train::trainer reads them with the gradient norm).
    acc_t* host_losses = nullptr;
    /// The table for recompute mode r (default: every block keeps what its backward reads).
    explicit activations(context<device>& ctx, recompute r = recompute::none)
        : mode(r), sizes(sizes_of(r)), s(sizes.storage_total, ctx.stream), a(sizes.acc_total, ctx.stream) {}
    /// Bytes held by this activation table.
    std::size_t bytes() const noexcept { return s.bytes() + a.bytes(); }

    using pointers = act_pointers;
    /// Every tensor's start, in buffer order (the whole layer range of per-layer tensors).
    pointers ptrs() const noexcept { return carve(sizes, s.data(), a.data(), BT); }
    /// Block l's saved state (nn::block_of: under recompute, the slot the rerun rewrites).
    block_saved block(int l) const noexcept { return block_of(sizes, ptrs(), mode, l); }
    /// The stage's input (b*t, C): written by the embedding on the first stage, by the caller
    /// (received from stage s-1) before forward() on the others.
    storage_t* input() const noexcept { return ptrs().encoded; }
    /// The stage's output (b*t, C) after forward() on stages other than the last.
    storage_t* output() const noexcept { return L > 0 ? ptrs().residual3 + std::size_t(L - 1) * sizes.layer.C : input(); }
    /// Gradient of the stage's output (b*t, C): written by the caller (received from stage s+1)
    /// before backward() on stages other than the last. backward() turns it, in place, into
    /// input_grad(), the gradient of the stage's input, to send to stage s-1.
    storage_t* output_grad() const noexcept { return ptrs().dres; }
    storage_t* input_grad() const noexcept { return ptrs().dres; }
    /// Per-token losses of the last forward on the last stage (b*t values, accumulator type).
    const acc_t* losses() const noexcept { return ptrs().losses; }
    /// This rank's logits (B,T,Vl) of the last forward, or dlogits if it was asked to write them.
    const storage_t* logits() const noexcept { return ptrs().logits; }
  };

  /// Forward pass of this rank's part over a micro-batch of b sequences of length t (b <= B,
  /// t <= T).
  ///   inputs  (b,t) int32 token ids in [0, vocab): read on the first stage; the caller
  ///           validates them
  ///   targets (b,t) int32 in [0, vocab) or kernels::ignore_index (-1), or null for logits
  ///           only: read on the last stage
  /// First stage: embeds inputs into acts.input(); others: acts.input() must hold the received
  /// activation. Last stage: when targets are given, writes the per-token losses; when
  /// grad_scale is non-zero, also overwrites the logits with dlogits = grad_scale * d(sum of
  /// losses) (fused softmax cross-entropy), ready for backward(). For a mean loss over the
  /// global batch pass grad_scale = 1 / (number of non-ignored targets in the global batch).
  /// Returns the sum of the per-token losses on the last stage (identical on every tp rank), 0
  /// elsewhere and without targets. Collective over tp when TP > 1.
  /// `drop`: training dropout of this pass (nn/dropout.hpp; default off, as evaluation and
  /// sampling need): embedding, attention-probability and both residual dropouts with
  /// probability drop.p, masks keyed by drop.key; stored in acts.dropout for backward. Throws
  /// loom::input_error unless 0 <= drop.p < 1, and for drop.p > 0 when !supports_dropout (the
  /// Ascend device: dropout runs on the CPU only so far; kernels::reference attention).
  template <int B, int T, class Comm>
  acc_t forward(context<device>& ctx, activations<B, T>& acts, Comm& tp, const std::int32_t* inputs,
                const std::int32_t* targets, int b, int t, acc_t grad_scale = 0, const dropout_state& drop = {}) const {
    check_dropout(drop);
    acts.dropout = drop;
    const auto p = acts.ptrs();
    const int n = b * t;
    if (first_stage()) {
      gate(ctx, -1);
      embedding_forward(ctx, p.encoded, inputs, b, t, tp);
      if constexpr (supports_dropout)
        if (drop.active())
          ops::dropout(ctx, p.encoded, p.encoded, std::size_t(n) * C, drop.mask(dropout_site::embedding, 0));
    }
    const storage_t* residual = p.encoded;
    for (int l = 0; l < L; ++l) {
      const block_saved s = acts.block(l);
      gate(ctx, l);
      block_forward(ctx, s, p.proj_out, residual, l, n, b, t, tp, drop);
      residual = s.res3;
    }
    gate(ctx, L);
    if (!last_stage()) return 0;
    return head_forward(ctx, p, residual, targets, n, grad_scale, tp, acts.host_losses);
  }
  /// The same without a tensor-parallel group (TP = 1).
  template <int B, int T>
    requires(TP == 1)
  acc_t forward(context<device>& ctx, activations<B, T>& acts, const std::int32_t* inputs, const std::int32_t* targets,
                int b, int t, acc_t grad_scale = 0, const dropout_state& drop = {}) const {
    parallel::local_group tp;
    return forward(ctx, acts, tp, inputs, targets, b, t, grad_scale, drop);
  }

  /// Backward pass of the last forward on `acts`, with that forward's dropout masks (regenerated
  /// from acts.dropout) (on the last stage that forward must have had
  /// targets and grad_scale != 0; on the others acts.output_grad() must hold the received
  /// gradient). Accumulates (+=) this rank's parameter gradients; the activation buffers'
  /// gradient scratch is overwritten; on stages other than the first leaves the input gradient
  /// in acts.input_grad(). inputs, b, t as given to forward. Collective over tp when TP > 1.
  /// Under acts.mode's recomputation (nn::recompute) each block first reruns the forward parts
  /// the table did not keep (full: the whole block, with its tp collectives; selective: the
  /// attention core and the MLP activation).
  /// `ready(layer)` is called as soon as this pass will not touch some gradients again (data
  /// parallelism starts their reduction while backward goes on, parallel/data_parallel.hpp):
  ///   ready(L)            after the LM head and the final norm: the rows only the last stage
  ///                       uses (models::ready_event) are final (on other stages: at once)
  ///   ready(l), l = L-1..0  after block l: its slices of the per-layer rows are final
  ///   ready(-1)           at the end: the embedding rows (wte, also a tied LM head; wpe)
  /// Work queued on ctx before the call is part of those gradients (synchronize before reading
  /// them on an asynchronous device). The default does nothing.
  template <int B, int T, class Comm, class Ready = parallel::no_ready_hook>
  void backward(context<device>& ctx, activations<B, T>& acts, Comm& tp, const std::int32_t* inputs, int b, int t,
                Ready&& ready = {}) {
    const auto p = acts.ptrs();
    const int n = b * t;
    const dropout_state& drop = acts.dropout;
    if (last_stage()) head_backward(ctx, p, acts.output(), n, tp);
    ready(L);
    for (int l = L - 1; l >= 0; --l) {
      const block_saved s = acts.block(l);
      const storage_t* residual = l == 0 ? p.encoded : acts.block(l - 1).res3;
      if (acts.mode == recompute::full) block_forward(ctx, s, p.proj_out, residual, l, n, b, t, tp, drop);
      if (acts.mode == recompute::selective) {
        attention_forward(ctx, s, b, t, l, drop);
        mlp_activation_forward(ctx, s, n);
      }
      block_backward(ctx, s, p, residual, l, n, b, t, tp, drop);
      ready(l);
    }
    if (first_stage()) {
      if constexpr (supports_dropout)
        if (drop.active())
          ops::dropout(ctx, p.dres, p.dres, std::size_t(n) * C, drop.mask(dropout_site::embedding, 0));
      embedding_backward(ctx, p.dres, inputs, b, t, tp);
    }
    ready(-1);
  }
  /// The same without a tensor-parallel group (TP = 1).
  template <int B, int T, class Ready = parallel::no_ready_hook>
    requires(TP == 1)
  void backward(context<device>& ctx, activations<B, T>& acts, const std::int32_t* inputs, int b, int t,
                Ready&& ready = {}) {
    parallel::local_group tp;
    backward(ctx, acts, tp, inputs, b, t, std::forward<Ready>(ready));
  }

  /// Sums the gradients of the two copies of a tied embedding (first stage: token embedding,
  /// last stage: LM head) so both hold the full gradient (Megatron's embedding-group all-reduce).
  /// Call after the last micro-batch's backward, before the gradient norm and the update. A
  /// no-op when PP == 1 (one copy), on middle stages, and when the recipe unties the head.
  /// Collective over the first and last stage of `pp` (send/recv of Vp/TP * C elements each way).
  template <class Comm>
  void tie_embedding_gradients(context<device>& ctx, Comm& pp) {
    if constexpr (PP > 1 && tied) {
      if (!first_stage() && !last_stage()) return;
      ctx.synchronize();
      const auto gw = gradient(models::role::wte);
      const std::span<grad_t> mine(gw.data(), gw.size());
      const std::span<grad_t> theirs(tie_scratch_.data(), tie_scratch_.size());
      constexpr int tag = 7;  // distinct from the pipeline executor's activation/gradient tags
      if (first_stage()) {
        pp.send(std::span<const grad_t>(mine), PP - 1, tag);
        pp.recv(theirs, PP - 1, tag);
      } else {
        pp.recv(theirs, 0, tag);
        pp.send(std::span<const grad_t>(mine), 0, tag);
      }
      // first: mine + theirs; last: mine + theirs with the operands swapped — the same sum
      // bitwise (fp addition commutes), so both copies stay identical. On a device whose memory
      // the host cannot read, the device adds them (ops<device, grad_t>::residual_forward).
      if constexpr (loom::device::host_accessible_v<device>) {
        for (std::size_t i = 0; i < mine.size(); ++i)
          mine[i] = grad_t(acc_t(first_stage() ? mine[i] : theirs[i]) + acc_t(first_stage() ? theirs[i] : mine[i]));
      } else {
        kernels::ops<device, grad_t>::residual_forward(ctx, mine.data(), first_stage() ? mine.data() : theirs.data(),
                                                       first_stage() ? theirs.data() : mine.data(), mine.size());
      }
    } else {
      (void)ctx;
      (void)pp;
    }
  }

  /// Sum of squares of this rank's gradients that count in the global norm (models::counts_in_norm).
  double local_grad_sum_of_squares(context<device>& ctx) const {
    double s = 0;
    for (std::size_t k = 0; k < num_tensors; ++k)
      if (models::counts_in_norm(table[k], tp_rank_, stage_, PP)) {
        const auto gk = gradient(k);
        s += ops::sum_of_squares(ctx, gk.data(), gk.size());
      }
    return s;
  }

  /// Global L2 norm of the gradient of the whole (unsharded) model, identical on every rank:
  /// local_grad_sum_of_squares summed over the tp group, then over the pp group, square root.
  /// Every element is counted once (replicated tensors on tp rank 0 only, a tied embedding on
  /// the first stage only; call tie_embedding_gradients first). Data-parallel replicas hold the
  /// same (all-reduced) gradients, so the dp group is not involved. Collective over tp, pp.
  template <class Comm>
  double grad_norm(context<device>& ctx, Comm& tp, Comm& pp) const {
    double s = local_grad_sum_of_squares(ctx);
    if constexpr (TP > 1) s = parallel::sum_over(ctx, tp, s);  // Note [host scalars]
    if constexpr (PP > 1) s = parallel::sum_over(ctx, pp, s);
    return std::sqrt(s);
  }

 private:
  /// before_layer(ctx, layer) when set.
  void gate(context<device>& ctx, int layer) const {
    if (before_layer) before_layer(ctx, layer);
  }
  using pointers_t = act_pointers;

  // --- embedding: out (n, C) = wte[inputs] + wpe[t]; vocab-parallel when TP > 1 -------------
  template <class Comm>
  void embedding_forward(context<device>& ctx, storage_t* out, const std::int32_t* inputs, int b, int t, Comm& tp) const {
    if constexpr (TP == 1) ops::encoder_forward(ctx, out, inputs, w(models::role::wte), w(models::role::wpe), b, t, C);
    else parallel::vocab_parallel_embedding_forward(ctx, out, inputs, w(models::role::wte), w(models::role::wpe), b, t, C, Vp, tp);
  }
  template <class Comm>
  void embedding_backward(context<device>& ctx, const storage_t* dout, const std::int32_t* inputs, int b, int t, Comm& tp) {
    if constexpr (TP == 1) ops::encoder_backward(ctx, g(models::role::wte), g(models::role::wpe), dout, inputs, b, t, C);
    else parallel::vocab_parallel_embedding_backward(ctx, g(models::role::wte), g(models::role::wpe), dout, inputs, b, t, C, Vp, tp);
  }

  // --- linear layers: plain at TP = 1, Megatron's column/row-parallel otherwise -------------
  /// How a linear layer is split across tp ranks: output rows (column-parallel) or input
  /// columns (row-parallel: its output is all-reduced over tp, its bias added once).
  enum class split : bool { column, row };
  /// out (n, OC) = in (n, Cin) W^T + bias with W = role wr's (layer l) local slice; br the bias
  /// role (role::count: none). Cin, OC are this rank's widths.
  template <split S, class Comm>
  void linear_forward(context<device>& ctx, storage_t* out, const storage_t* in, models::role wr, models::role br, int l, int n, int Cin,
                      int OC, Comm& tp) const {
    if constexpr (TP == 1) ops::matmul_forward(ctx, out, in, w(wr, l), w(br, l), n, Cin, OC);
    else if constexpr (S == split::column)
      parallel::column_parallel_linear_forward(ctx, out, in, w(wr, l), w(br, l), n, Cin, OC, tp);
    else parallel::row_parallel_linear_forward(ctx, out, in, w(wr, l), w(br, l), n, Cin, OC, tp);
  }
  /// din (n, Cin) =, dW +=, dbias += from dout (n, OC) and the forward's input `in`.
  template <split S, class Comm>
  void linear_backward(context<device>& ctx, storage_t* din, const storage_t* dout, const storage_t* in, models::role wr,
                       models::role br, int l, int n, int Cin, int OC, Comm& tp) {
    if constexpr (TP == 1) ops::matmul_backward(ctx, din, g(wr, l), g(br, l), dout, in, w(wr, l), n, Cin, OC, false);
    else if constexpr (S == split::column)
      parallel::column_parallel_linear_backward(ctx, din, g(wr, l), g(br, l), dout, in, w(wr, l), n, Cin, OC, tp);
    else parallel::row_parallel_linear_backward(ctx, din, g(wr, l), g(br, l), dout, in, w(wr, l), n, Cin, OC, tp);
  }

  // --- one block: residual (n, C) -> s.res3 (n, C) --------------------------------------------
  /// With dropout (drop.active()): attention-probability dropout inside the kernel and
  /// dropout on both projections' outputs (replicated over tp: every rank draws the same mask)
  /// before their residual adds.
  template <class Comm>
  void block_forward(context<device>& ctx, const block_saved& s, storage_t* proj, const storage_t* residual, int l, int n,
                     int b, int t, Comm& tp, const dropout_state& drop) const {
    const std::size_t N = std::size_t(n);
    norm_forward(ctx, s.ln1, s.st1, s.cap, residual, models::role::ln1_w, models::role::ln1_b, l, n);
    linear_forward<split::column>(ctx, s.qkv, s.ln1, models::role::qkv_w, models::role::qkv_b, l, n, C, QKVl, tp);
    if constexpr (rotary) ops::rope_forward(ctx, s.qkv, rope_cos(), rope_sin(), b, t, NHl + KVl, HD, QKVl);
    attention_forward(ctx, s, b, t, l, drop);
    linear_forward<split::row>(ctx, proj, s.atty, models::role::attproj_w, models::role::attproj_b, l, n, Cl, C, tp);
    if constexpr (supports_dropout)
      if (drop.active()) ops::dropout(ctx, proj, proj, N * C, drop.mask(dropout_site::attention_residual, global_layer(l)));
    ops::residual_forward(ctx, s.res2, residual, proj, N * C);
    norm_forward(ctx, s.ln2, s.st2, s.cap, s.res2, models::role::ln2_w, models::role::ln2_b, l, n);
    linear_forward<split::column>(ctx, s.fch, s.ln2, models::role::fc_w, models::role::fc_b, l, n, C, FCl, tp);
    mlp_activation_forward(ctx, s, n);
    linear_forward<split::row>(ctx, proj, s.fchg, models::role::fcproj_w, models::role::fcproj_b, l, n, Hl, C, tp);
    if constexpr (supports_dropout)
      if (drop.active()) ops::dropout(ctx, proj, proj, N * C, drop.mask(dropout_site::mlp_residual, global_layer(l)));
    ops::residual_forward(ctx, s.res3, s.res2, proj, N * C);
  }
  /// p.dres holds d(res3) on entry (+= contributions) and d(residual input) on exit.
  /// With dropout, d(projection output) = mask .* d(residual) goes through p.proj_out (free
  /// during backward) and the attention kernel regenerates its mask.
  template <class Comm>
  void block_backward(context<device>& ctx, const block_saved& s, const pointers_t& p, const storage_t* residual, int l,
                      int n, int b, int t, Comm& tp, const dropout_state& drop) {
    const std::size_t N = std::size_t(n);
    [[maybe_unused]] const bool dropped = supports_dropout && drop.active();
    const storage_t* dproj = p.dres;  // d(projection output): d(residual), or its dropout
    if constexpr (supports_dropout)
      if (dropped) {
        ops::dropout(ctx, p.proj_out, p.dres, N * C, drop.mask(dropout_site::mlp_residual, global_layer(l)));
        dproj = p.proj_out;
      }
    // MLP: dres holds d(res3) = d(fcproj out) and the direct part of d(res2)
    linear_backward<split::row>(ctx, p.dfch_gelu, dproj, s.fchg, models::role::fcproj_w, models::role::fcproj_b, l, n, Hl, C, tp);
    if constexpr (swiglu) ops::swiglu_backward(ctx, p.dfch, p.dfch_gelu, s.fch, n, Hl);
    else ops::gelu_backward(ctx, p.dfch, s.fch, p.dfch_gelu, N * Hl);
    linear_backward<split::column>(ctx, p.dln, p.dfch, s.ln2, models::role::fc_w, models::role::fc_b, l, n, C, FCl, tp);
    norm_backward(ctx, p.dres, p.dln, s.res2, s.st2, s.cap, models::role::ln2_w, models::role::ln2_b, l, n);
    // attention: dres now holds d(res2) = d(attproj out) and the direct part of d(input)
    if constexpr (supports_dropout)
      if (dropped)
        ops::dropout(ctx, p.proj_out, p.dres, N * C, drop.mask(dropout_site::attention_residual, global_layer(l)));
    linear_backward<split::row>(ctx, p.datty, dproj, s.atty, models::role::attproj_w, models::role::attproj_b, l, n, Cl, C, tp);
    attention_backward(ctx, s, p, b, t, l, drop);
    if constexpr (rotary) ops::rope_backward(ctx, p.dqkv, rope_cos(), rope_sin(), b, t, NHl + KVl, HD, QKVl);
    linear_backward<split::column>(ctx, p.dln, p.dqkv, s.ln1, models::role::qkv_w, models::role::qkv_b, l, n, C, QKVl, tp);
    norm_backward(ctx, p.dres, p.dln, residual, s.st1, s.cap, models::role::ln1_w, models::role::ln1_b, l, n);
  }

  // --- the parts a recipe chooses: norm, attention (MHA or GQA, with or without dropout) ------
  /// out (n, C) = norm(in) with role wr's gain (and br's bias for LayerNorm); stats holds the
  /// mean (first cap values) and rstd (next cap values; RMSNorm writes only these).
  void norm_forward(context<device>& ctx, storage_t* out, acc_t* stats, std::size_t cap, const storage_t* in, models::role wr,
                    models::role br, int l, int n) const {
    if constexpr (rms) ops::rmsnorm_forward(ctx, out, stats + cap, in, w(wr, l), n, C, acc_t(models::norm_eps_of<M>()));
    else ops::layernorm_forward(ctx, out, stats, stats + cap, in, w(wr, l), w(br, l), n, C);
  }
  /// din (n, C) += d(norm) from dout (n, C); the gain's (and bias') gradients +=.
  void norm_backward(context<device>& ctx, storage_t* din, const storage_t* dout, const storage_t* in, const acc_t* stats,
                     std::size_t cap, models::role wr, models::role br, int l, int n) {
    if constexpr (rms) ops::rmsnorm_backward(ctx, din, g(wr, l), dout, in, w(wr, l), stats + cap, n, C);
    else ops::layernorm_backward(ctx, din, g(wr, l), g(br, l), dout, in, w(wr, l), stats, stats + cap, n, C);
  }
  /// s.fchg (n, Hl) = the MLP activation of s.fch: GELU, or SwiGLU of its [gate | up] sections.
  void mlp_activation_forward(context<device>& ctx, const block_saved& s, int n) const {
    if constexpr (swiglu) ops::swiglu_forward(ctx, s.fchg, s.fch, n, Hl);
    else ops::gelu_forward(ctx, s.fchg, s.fch, std::size_t(n) * Hl);
  }
  /// s.atty = attention(s.qkv), saving s.att; with drop.active(), attention-probability dropout.
  /// The optional arguments follow the implementation's signature: key padding (none), then the
  /// dropout where it has one, then the key/value heads under grouped-query attention.
  void attention_forward(context<device>& ctx, const block_saved& s, int b, int t, int l, const dropout_state& drop) const {
    with_attention_args(drop, l, [&](auto... extra) { attention::forward(ctx, s.atty, s.att, s.qkv, b, t, Cl, NHl, extra...); });
  }
  /// p.dqkv = d(attention input) from p.datty, with the forward's dropout masks regenerated.
  void attention_backward(context<device>& ctx, const block_saved& s, const pointers_t& p, int b, int t, int l,
                          const dropout_state& drop) const {
    with_attention_args(drop, l, [&](auto... extra) {
      attention::backward(ctx, p.dqkv, p.datty, s.qkv, s.atty, s.att, p.attn_scratch, b, t, Cl, NHl, extra...);
    });
  }
  /// Calls f with the trailing attention arguments of layer l: none for multi-head attention
  /// without dropout; (key_padding = null, dropout) where the implementation applies dropout;
  /// (..., KVl) under grouped-query attention.
  template <class F>
  void with_attention_args(const dropout_state& drop, int l, F&& f) const {
    const std::uint8_t* no_padding = nullptr;
    if constexpr (supports_dropout) {
      const attention_dropout ad = drop.active() ? attention_drop(drop, l) : attention_dropout{};
      if constexpr (gqa) f(no_padding, ad, KVl);
      else if (drop.active()) f(no_padding, ad);
      else f();
    } else if constexpr (gqa) {
      f(no_padding, KVl);
    } else {
      f();
    }
  }
  /// The rotary tables (kernels/rope_table.hpp), (max_seq, HD/2) each; rotary recipes only.
  const acc_t* rope_cos() const noexcept { return rope_.data(); }
  const acc_t* rope_sin() const noexcept { return rope_.data() + std::size_t(M::max_seq) * HD / 2; }

  // --- dropout (nn/dropout.hpp) ----------------------------------------------------------------
  /// Index of this stage's layer l in the whole model (masks are keyed by it, so PP > 1 = PP = 1).
  int global_layer(int l) const noexcept { return stage_ * L + l; }
  /// Layer l's attention-probability dropout: keyed by global heads (this rank owns
  /// [tp_rank * NHl, (tp_rank + 1) * NHl) of NH).
  attention_dropout attention_drop(const dropout_state& drop, int l) const {
    return {drop.mask(dropout_site::attention, global_layer(l)), tp_rank_ * NHl, NH};
  }

  // --- head: final norm, LM head, loss (last stage) -------------------------------------------
  template <class Comm>
  acc_t head_forward(context<device>& ctx, const pointers_t& p, const storage_t* residual, const std::int32_t* targets,
                     int n, acc_t grad_scale, Comm& tp, acc_t* host_losses = nullptr) const {
    acc_t* stf = lnf_stats(p);
    norm_forward(ctx, p.lnf, stf, p.cap, residual, models::role::lnf_w, models::role::lnf_b, 0, n);
    linear_forward<split::column>(ctx, p.logits, p.lnf, head, models::role::count, 0, n, C, Vl, tp);
    if (!targets) return 0;
    const bool dl = grad_scale != acc_t(0);
    if constexpr (TP == 1 && requires { ops::crossentropy(ctx, p.logits, p.losses, targets, n, V, Vp, dl, grad_scale, host_losses); })
      if (host_losses) return ops::crossentropy(ctx, p.logits, p.losses, targets, n, V, Vp, dl, grad_scale, host_losses);
    if constexpr (TP == 1)
      return ops::crossentropy(ctx, p.logits, p.losses, targets, n, V, Vp, dl, grad_scale);
    else
      return parallel::vocab_parallel_crossentropy(ctx, p.logits, p.losses, targets, p.ce_scratch, n, V, Vp,
                                                   grad_scale != acc_t(0), grad_scale, tp);
  }
  /// Writes p.dres = d(last block's output) from the dlogits in p.logits.
  template <class Comm>
  void head_backward(context<device>& ctx, const pointers_t& p, const storage_t* last, int n, Comm& tp) {
    // LM head (vocab-parallel when TP > 1; W = wte when tied): dlnf = dlogits W; dW += dlogits^T lnf
    linear_backward<split::column>(ctx, p.dln, p.logits, p.lnf, head, models::role::count, 0, n, C, Vl, tp);
    device::memset(p.dres, 0, std::size_t(n) * C * sizeof(storage_t), ctx.stream);
    acc_t* stf = lnf_stats(p);
    norm_backward(ctx, p.dres, p.dln, last, stf, p.cap, models::role::lnf_w, models::role::lnf_b, 0, n);
  }
  /// The final norm's mean and rstd come first in the statistics (cap rows each), the blocks' after.
  static acc_t* lnf_stats(const pointers_t& p) noexcept { return p.ln_stats; }

  /// Pointer to the local tensor of role p (layer l's slice for per-layer rows); null when the
  /// recipe has no such tensor (a bias of a bias-free recipe: the kernels then skip it) and for
  /// role::count (no bias).
  storage_t* w(models::role p, int l = 0) const noexcept { return slice(params_.data(), p, l); }
  grad_t* g(models::role p, int l = 0) const noexcept { return slice(grads_.data(), p, l); }
  template <class X>
  static X* slice(X* base, models::role p, int l) noexcept {
    const int k = p == models::role::count ? -1 : models::rows_by_role<M>[int(p)];
    if (k < 0) return nullptr;
    const auto& s = table[std::size_t(k)];
    return base + offsets[std::size_t(k)] + std::size_t(l) * (s.per_layer ? s.layer_size() : 0);
  }

  int tp_rank_ = 0, stage_ = 0;
  buffer<device, storage_t> params_;
  buffer<device, grad_t> grads_;
  buffer<device, grad_t> tie_scratch_;
  buffer<device, acc_t> rope_;  ///< rotary cos and sin tables (empty without rotary positions)
};

}  // namespace loom::nn
