#pragma once
/// \file loom::nn::gpt_parallel<Model, Policy, Attention>: one rank's part of a GPT under
/// layout<TP, PP> — tensor-parallel rank r of pipeline stage s — forward and backward.
///
/// Same model and same numbers as loom::gpt (nn/gpt.hpp) on one rank; the split follows
/// Megatron-LM (Shoeybi et al. 2019 §3; Narayanan et al. 2021 §2):
///   tensor parallel   qkv and fc column-parallel (a rank owns NH/TP whole heads and 4C/TP MLP
///                     columns), attention projection and fc2 row-parallel, token embedding and
///                     tied LM head vocab-parallel with the vocab-parallel cross-entropy
///                     (parallel/tensor_parallel.hpp); LayerNorms, position embedding and
///                     row-parallel biases replicated (identical values and gradients on every
///                     tp rank). Two all-reduces of (N, C) per block forward, two backward.
///   pipeline parallel stage s owns layers [s*L/PP, (s+1)*L/PP); the first stage also the
///                     embedding (wte, wpe), the last the final LayerNorm and the LM head (its own
///                     copy of wte: tie_embedding_gradients sums the two copies' gradients).
///                     Activations enter a stage through activations::input() and leave through
///                     output(); gradients come back through output_grad() and leave through
///                     input_grad() — the pipeline executor (parallel/pipeline.hpp) moves them.
///
/// The parameter buffer is laid out by nn::param_table<M, layout> (local shapes). Every stage
/// holds every row of that table (so checkpoints and the optimizer see one layout), but only
/// uses wte on the first and last stage, wpe on the first, lnf on the last (stage_uses()); the
/// others stay at their initial values with zero gradients (memory: wte+wpe on middle stages is
/// wasted, noted in docs/tensor_pipeline.md).
///
/// Initialisation equals the single-rank model with the same seed: element i of a local tensor
/// is drawn at its index in the unsharded tensor (global_index()), so the gathered model is
/// bitwise loom::gpt's.
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/random.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/models/configs.hpp>
#include <loom/nn/gpt.hpp>
#include <loom/nn/params.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/parallel/tensor_parallel.hpp>
#include <loom/policy.hpp>

namespace loom::nn {

/// True for the per-layer tensors (ln1_w .. fcproj_b), whose first dimension is the layer.
constexpr bool is_per_layer(param p) noexcept { return int(p) >= int(param::ln1_w) && int(p) <= int(param::fcproj_b); }

/// Whether pipeline stage `stage` of `stages` uses tensor p: per-layer tensors everywhere, wte on
/// the first (embedding) and last (tied LM head) stage, wpe on the first, lnf on the last.
constexpr bool stage_uses(param p, int stage, int stages) noexcept {
  if (is_per_layer(p)) return true;
  const bool first = stage == 0, last = stage == stages - 1;
  switch (p) {
    case param::wte: return first || last;
    case param::wpe: return first;
    case param::lnf_w:
    case param::lnf_b: return last;
    default: return true;
  }
}

/// Whether rank (tp_rank, stage)'s copy of tensor p counts in the global gradient norm, so that
/// summing over all ranks counts every element of the unsharded model exactly once: sharded
/// tensors on every tp rank, replicated ones on tp rank 0 only; wte on the first stage only (after
/// tie_embedding_gradients the last stage's copy holds the same gradient), wpe on the first, lnf
/// on the last, per-layer tensors on every stage.
template <models::model_config M, parallel::layout_policy L>
constexpr bool counts_in_norm(param p, int tp_rank, int stage) noexcept {
  constexpr auto t = param_table<M, L>();
  if (t[std::size_t(p)].rule == shard::replicated && tp_rank != 0) return false;
  if (p == param::wte) return stage == 0;
  return stage_uses(p, stage, L::pp);
}

/// Index, in the unsharded tensor p of the single-rank model (layout<1,1>), of element i of the
/// local tensor p held by tensor-parallel rank tp_rank of pipeline stage `stage` under layout L.
/// Shard rules as io::shard_tensor: vocab/column split rows (qkv per q, k, v section), row split
/// columns, replicated copies; per-layer tensors of stage s start at layer s*n_layer/PP.
template <models::model_config M, parallel::layout_policy L>
constexpr std::size_t global_index(param p, int tp_rank, int stage, std::size_t i) noexcept {
  constexpr auto t = param_table<M, L>();
  const auto& s = t[std::size_t(p)];
  const bool per_layer = is_per_layer(p);
  // (layers, rows, cols) views of the local and the global tensor
  const std::size_t rows = std::size_t(per_layer ? s.shape[1] : s.shape[0]);
  const std::size_t cols = std::size_t(per_layer ? s.shape[2] : s.shape[1]);
  const std::size_t grows = std::size_t(per_layer ? s.global[1] : s.global[0]);
  const std::size_t gcols = std::size_t(per_layer ? s.global[2] : s.global[1]);
  const std::size_t layer = i / (rows * cols), a = (i / cols) % rows, c = i % cols;
  const std::size_t glayer = per_layer ? std::size_t(stage) * std::size_t(s.shape[0]) + layer : 0;
  std::size_t ga = a, gc = c;
  switch (s.rule) {
    case shard::replicated: break;
    case shard::vocab:
    case shard::column: {
      const std::size_t sections = (p == param::qkv_w || p == param::qkv_b) ? 3 : 1;
      const std::size_t part = rows / sections, gpart = grows / sections;
      ga = (a / part) * gpart + std::size_t(tp_rank) * part + a % part;
      break;
    }
    case shard::row: gc = std::size_t(tp_rank) * cols + c; break;
  }
  return (glayer * grows + ga) * gcols + gc;
}

/// One rank's part of a GPT under Policy::layout = layout<TP, PP>: tensor-parallel rank
/// tp_rank() of pipeline stage stage(). With layout<1,1> it computes what loom::gpt computes.
///
/// Template arguments as loom::gpt (attention fused by default, as loom::gpt; each rank runs it
/// on its NH/TP heads with width C/TP). Communication goes through the groups passed to forward,
/// backward and the gradient helpers (explicit, never stored): `tp` is the tensor-parallel group
/// (size TP, make_groups(...).tp), `pp` the pipeline group (size PP).
/// Memory: num_parameters * (sizeof(storage_t) + sizeof(grad_t)) bytes (+ one wte shard of
/// gradient scratch on the first and last stage when PP > 1), allocated at construction.
template <models::model_config M, class Policy, class Attn = kernels::fused>
class gpt_parallel {
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
  /// Parameter-gradient element type: fp32 for 16-bit storage (kernels::gradient_t), as
  /// loom::gpt — gradients accumulate over micro-batches and enter the norm, the tied-embedding
  /// sum and the dp all-reduce in fp32.
  using grad_t = kernels::gradient_t<device, precision>;

  static_assert(parallel::fits<layout, M>());
  static constexpr int TP = layout::tp, PP = layout::pp;
  static constexpr int C = M::d_model, NH = M::n_head, L = M::n_layer / PP;
  static constexpr int Cl = C / TP, NHl = NH / TP, Hl = 4 * C / TP;  // per-rank widths
  static constexpr int V = M::vocab, Vp = M::vocab_padded, Vl = Vp / TP;
  static constexpr auto table = param_table<M, layout>();
  static constexpr auto offsets = param_offsets<M, layout>();
  static constexpr std::size_t num_parameters = offsets.back();

  /// Allocates this rank's parameters and gradients (zero) and initialises the parameters with
  /// `seed` exactly as loom::gpt would, restricted to this rank's slices.
  /// Throws loom::input_error if tp_rank is outside [0, TP) or stage outside [0, PP).
  gpt_parallel(context<device>& ctx, int tp_rank, int stage, std::uint64_t seed = 1337)
      : tp_rank_(tp_rank), stage_(stage), params_(num_parameters, ctx.stream), grads_(num_parameters, ctx.stream) {
    if (tp_rank < 0 || tp_rank >= TP || stage < 0 || stage >= PP)
      throw input_error("gpt_parallel: rank (tp " + std::to_string(tp_rank) + ", stage " + std::to_string(stage) +
                        ") is outside layout<" + std::to_string(TP) + ", " + std::to_string(PP) +
                        ">; pass groups.tp.rank() and groups.pp.rank() of make_groups<layout>(world)");
    if constexpr (PP > 1)
      if (first_stage() || last_stage()) tie_scratch_ = buffer<device, grad_t>(table[int(param::wte)].size(), ctx.stream);
    initialize(ctx, seed);
  }

  int tp_rank() const noexcept { return tp_rank_; }
  int stage() const noexcept { return stage_; }
  bool first_stage() const noexcept { return stage_ == 0; }
  bool last_stage() const noexcept { return stage_ == PP - 1; }

  /// GPT-2 initialisation as loom::gpt::initialize, element by element at its global index.
  void initialize(context<device>& ctx, std::uint64_t seed) {
    std::vector<storage_t> host(num_parameters);
    for (int k = 0; k < num_param_tensors; ++k) {
      const auto& p = table[std::size_t(k)];
      storage_t* dst = host.data() + offsets[std::size_t(k)];
      const double stdev = p.how == init::residual_normal ? 0.02 / std::sqrt(2.0 * M::n_layer) : 0.02;
      for (std::size_t i = 0; i < p.size(); ++i) {
        switch (p.how) {
          case init::ones: dst[i] = storage_t(1); break;
          case init::zeros: dst[i] = storage_t(0); break;
          default:
            dst[i] = storage_t(stdev * random_normal(seed, std::uint64_t(k),
                                                     global_index<M, layout>(param(k), tp_rank_, stage_, i)));
        }
      }
    }
    device::copy_to_device(params_.data(), host.data(), params_.bytes(), ctx.stream);
    ctx.synchronize();
  }

  view<device, storage_t> parameters() const noexcept { return params_.all(); }
  view<device, grad_t> gradients() const noexcept { return grads_.all(); }
  view<device, storage_t> parameter(param p) const noexcept {
    return params_.all().subview(offsets[std::size_t(p)], table[std::size_t(p)].size());
  }
  view<device, grad_t> gradient(param p) const noexcept {
    return grads_.all().subview(offsets[std::size_t(p)], table[std::size_t(p)].size());
  }
  void zero_grad(context<device>& ctx) { device::memset(grads_.data(), 0, grads_.bytes(), ctx.stream); }

  /// Saved activations and scratch of one micro-batch on this rank, capacity (B, T). A pipeline
  /// stage needs parallel::max_in_flight(PP, m, stage) of them (one per micro-batch in flight).
  template <int B, int T>
  struct activations {
    static_assert(B >= 1, "the micro-batch size B must be at least 1");
    static_assert(T >= 1 && T <= M::max_seq,
                  "the sequence length T must be between 1 and the model's max_seq (learned "
                  "position embeddings exist only for max_seq positions)");
    static constexpr int batch = B, seq = T;
    static constexpr std::size_t BT = std::size_t(B) * T;
    // storage-type tensors, in buffer order
    enum s_id { encoded, ln1, qkv, atty, res2, ln2, fch, fchg, res3, lnf, logits, proj_out, dres, dln, dqkv, datty,
                dfch, dfchg, s_count };
    enum a_id { ln_stats, att, losses_, ce_scratch, attn_scratch, a_count };
    static std::array<std::size_t, s_count> storage_sizes() {
      const std::size_t l = std::size_t(L);
      return {BT * C, l * BT * C, l * BT * 3 * Cl, l * BT * Cl, l * BT * C, l * BT * C, l * BT * Hl, l * BT * Hl,
              l * BT * C, BT * C, BT * Vl, BT * C, BT * C, BT * C, BT * 3 * Cl, BT * Cl, BT * Hl, BT * Hl};
    }
    static std::array<std::size_t, a_count> acc_sizes() {
      return {(2 * std::size_t(L) + 1) * 2 * BT, std::size_t(L) * attention::saved_elems(B, NHl, T), BT,
              parallel::vocab_parallel_crossentropy_scratch(int(BT)),
              attention::scratch_elems(std::size_t(max_threads()), T)};
    }
    template <std::size_t N>
    static std::size_t total(const std::array<std::size_t, N>& a) {
      std::size_t n = 0;
      for (auto x : a) n += x;
      return n;
    }
    buffer<device, storage_t> s;
    buffer<device, acc_t> a;
    explicit activations(context<device>& ctx) : s(total(storage_sizes()), ctx.stream), a(total(acc_sizes()), ctx.stream) {}
    std::size_t bytes() const noexcept { return s.bytes() + a.bytes(); }
    storage_t* sp(s_id k) const noexcept {
      const auto z = storage_sizes();
      std::size_t off = 0;
      for (int i = 0; i < int(k); ++i) off += z[std::size_t(i)];
      return s.data() + off;
    }
    acc_t* ap(a_id k) const noexcept {
      const auto z = acc_sizes();
      std::size_t off = 0;
      for (int i = 0; i < int(k); ++i) off += z[std::size_t(i)];
      return a.data() + off;
    }
    /// The stage's input (b*t, C): written by the embedding on the first stage, by the caller
    /// (received from stage s-1) before forward() on the others.
    storage_t* input() const noexcept { return sp(encoded); }
    /// The stage's output (b*t, C) after forward() on stages other than the last.
    storage_t* output() const noexcept { return L > 0 ? sp(res3) + std::size_t(L - 1) * BT * C : sp(encoded); }
    /// Gradient of the stage's output (b*t, C): written by the caller (received from stage s+1)
    /// before backward() on stages other than the last. backward() turns it, in place, into
    /// input_grad(), the gradient of the stage's input, to send to stage s-1.
    storage_t* output_grad() const noexcept { return sp(dres); }
    storage_t* input_grad() const noexcept { return sp(dres); }
    /// Per-token losses of the last forward on the last stage (b*t values).
    const acc_t* losses() const noexcept { return ap(losses_); }
  };

  /// Forward pass of this rank's part over a micro-batch of b sequences of length t.
  ///   inputs  (b,t) int32 token ids in [0, vocab): read on the first stage
  ///   targets (b,t) int32 in [0, vocab) or ignore_index, or null: read on the last stage
  /// First stage: embeds inputs into acts.input(); others: acts.input() must hold the received
  /// activation. Last stage: computes the loss (vocab-parallel, as loom::gpt::forward: when
  /// grad_scale != 0 the logits become dlogits) and returns the sum of per-token losses
  /// (identical on every tp rank); other stages leave acts.output() and return 0.
  template <int B, int T, class Comm>
  acc_t forward(context<device>& ctx, activations<B, T>& acts, Comm& tp, const std::int32_t* inputs,
                const std::int32_t* targets, int b, int t, acc_t grad_scale = 0) const {
    using A = activations<B, T>;
    constexpr std::size_t BT = A::BT;
    const std::size_t N = std::size_t(b) * t;
    const int n = int(N);
    storage_t* encoded = acts.sp(A::encoded);
    if (first_stage())
      parallel::vocab_parallel_embedding_forward(ctx, encoded, inputs, w(param::wte), w(param::wpe), b, t, C, Vp, tp);
    const storage_t* residual = encoded;
    acc_t* stats = acts.ap(A::ln_stats);
    storage_t* proj = acts.sp(A::proj_out);
    for (int l = 0; l < L; ++l) {
      storage_t* ln1 = acts.sp(A::ln1) + l * BT * C;
      storage_t* qkv = acts.sp(A::qkv) + l * BT * 3 * Cl;
      storage_t* atty = acts.sp(A::atty) + l * BT * Cl;
      storage_t* res2 = acts.sp(A::res2) + l * BT * C;
      storage_t* ln2 = acts.sp(A::ln2) + l * BT * C;
      storage_t* fch = acts.sp(A::fch) + l * BT * Hl;
      storage_t* fchg = acts.sp(A::fchg) + l * BT * Hl;
      storage_t* res3 = acts.sp(A::res3) + l * BT * C;
      acc_t* st1 = stats + (2 * l) * 2 * BT;
      acc_t* st2 = stats + (2 * l + 1) * 2 * BT;
      acc_t* att = acts.ap(A::att) + l * attention::saved_elems(B, NHl, T);
      ops::layernorm_forward(ctx, ln1, st1, st1 + BT, residual, w(param::ln1_w, l), w(param::ln1_b, l), n, C);
      parallel::column_parallel_linear_forward(ctx, qkv, ln1, w(param::qkv_w, l), w(param::qkv_b, l), n, C, 3 * Cl, tp);
      attention::forward(ctx, atty, att, qkv, b, t, Cl, NHl);
      parallel::row_parallel_linear_forward(ctx, proj, atty, w(param::attproj_w, l), w(param::attproj_b, l), n, Cl, C, tp);
      ops::residual_forward(ctx, res2, residual, proj, N * C);
      ops::layernorm_forward(ctx, ln2, st2, st2 + BT, res2, w(param::ln2_w, l), w(param::ln2_b, l), n, C);
      parallel::column_parallel_linear_forward(ctx, fch, ln2, w(param::fc_w, l), w(param::fc_b, l), n, C, Hl, tp);
      ops::gelu_forward(ctx, fchg, fch, N * Hl);
      parallel::row_parallel_linear_forward(ctx, proj, fchg, w(param::fcproj_w, l), w(param::fcproj_b, l), n, Hl, C, tp);
      ops::residual_forward(ctx, res3, res2, proj, N * C);
      residual = res3;
    }
    if (!last_stage()) return 0;
    acc_t* stf = stats + (2 * L) * 2 * BT;
    storage_t* lnf = acts.sp(A::lnf);
    storage_t* logits = acts.sp(A::logits);
    ops::layernorm_forward(ctx, lnf, stf, stf + BT, residual, w(param::lnf_w), w(param::lnf_b), n, C);
    parallel::column_parallel_linear_forward(ctx, logits, lnf, w(param::wte), static_cast<const storage_t*>(nullptr), n,
                                             C, Vl, tp);
    if (!targets) return 0;
    return parallel::vocab_parallel_crossentropy(ctx, logits, acts.ap(A::losses_), targets, acts.ap(A::ce_scratch), n, V,
                                                 Vp, grad_scale != acc_t(0), grad_scale, tp);
  }

  /// Backward pass of the last forward on `acts` (on the last stage that forward must have had
  /// targets and grad_scale != 0; on the others acts.output_grad() must hold the received
  /// gradient). Accumulates (+=) this rank's parameter gradients; on stages other than the first
  /// leaves the input gradient in acts.input_grad(). inputs, b, t as given to forward.
  template <int B, int T, class Comm>
  void backward(context<device>& ctx, activations<B, T>& acts, Comm& tp, const std::int32_t* inputs, int b, int t) {
    using A = activations<B, T>;
    constexpr std::size_t BT = A::BT;
    const std::size_t N = std::size_t(b) * t;
    const int n = int(N);
    storage_t* dres = acts.sp(A::dres);
    storage_t* dln = acts.sp(A::dln);
    acc_t* stats = acts.ap(A::ln_stats);
    storage_t* encoded = acts.sp(A::encoded);
    if (last_stage()) {
      // LM head (tied, vocab-parallel): dlnf = sum over tp of dlogits_r wte_r; dwte_r += dlogits_r^T lnf
      parallel::column_parallel_linear_backward(ctx, dln, g(param::wte), static_cast<grad_t*>(nullptr),
                                                acts.sp(A::logits), acts.sp(A::lnf), w(param::wte), n, C, Vl, tp);
      device::memset(dres, 0, N * C * sizeof(storage_t), ctx.stream);
      acc_t* stf = stats + (2 * L) * 2 * BT;
      ops::layernorm_backward(ctx, dres, g(param::lnf_w), g(param::lnf_b), dln, acts.output(), w(param::lnf_w), stf,
                              stf + BT, n, C);
    }
    for (int l = L - 1; l >= 0; --l) {
      const storage_t* residual = l == 0 ? encoded : acts.sp(A::res3) + (l - 1) * BT * C;
      storage_t* ln1 = acts.sp(A::ln1) + l * BT * C;
      storage_t* qkv = acts.sp(A::qkv) + l * BT * 3 * Cl;
      storage_t* atty = acts.sp(A::atty) + l * BT * Cl;
      storage_t* res2 = acts.sp(A::res2) + l * BT * C;
      storage_t* ln2 = acts.sp(A::ln2) + l * BT * C;
      storage_t* fch = acts.sp(A::fch) + l * BT * Hl;
      storage_t* fchg = acts.sp(A::fchg) + l * BT * Hl;
      acc_t* st1 = stats + (2 * l) * 2 * BT;
      acc_t* st2 = stats + (2 * l + 1) * 2 * BT;
      acc_t* att = acts.ap(A::att) + l * attention::saved_elems(B, NHl, T);
      storage_t* dfchg = acts.sp(A::dfchg);
      storage_t* dfch = acts.sp(A::dfch);
      storage_t* datty = acts.sp(A::datty);
      storage_t* dqkv = acts.sp(A::dqkv);
      parallel::row_parallel_linear_backward(ctx, dfchg, g(param::fcproj_w, l), g(param::fcproj_b, l), dres, fchg,
                                             w(param::fcproj_w, l), n, Hl, C, tp);
      ops::gelu_backward(ctx, dfch, fch, dfchg, N * Hl);
      parallel::column_parallel_linear_backward(ctx, dln, g(param::fc_w, l), g(param::fc_b, l), dfch, ln2,
                                                w(param::fc_w, l), n, C, Hl, tp);
      ops::layernorm_backward(ctx, dres, g(param::ln2_w, l), g(param::ln2_b, l), dln, res2, w(param::ln2_w, l), st2,
                              st2 + BT, n, C);
      parallel::row_parallel_linear_backward(ctx, datty, g(param::attproj_w, l), g(param::attproj_b, l), dres, atty,
                                             w(param::attproj_w, l), n, Cl, C, tp);
      attention::backward(ctx, dqkv, datty, qkv, atty, att, acts.ap(A::attn_scratch), b, t, Cl, NHl);
      parallel::column_parallel_linear_backward(ctx, dln, g(param::qkv_w, l), g(param::qkv_b, l), dqkv, ln1,
                                                w(param::qkv_w, l), n, C, 3 * Cl, tp);
      ops::layernorm_backward(ctx, dres, g(param::ln1_w, l), g(param::ln1_b, l), dln, residual, w(param::ln1_w, l), st1,
                              st1 + BT, n, C);
    }
    if (first_stage())
      parallel::vocab_parallel_embedding_backward(ctx, g(param::wte), g(param::wpe), dres, inputs, b, t, C, Vp, tp);
  }

  /// Sums the gradients of the two copies of the tied embedding (first stage: token embedding,
  /// last stage: LM head) so both hold the full gradient (Megatron's embedding-group all-reduce).
  /// Call after the last micro-batch's backward, before the gradient norm and the update. A
  /// no-op when PP == 1 (one copy) and on middle stages. Collective over the first and last
  /// stage of `pp` (send/recv of Vp/TP * C elements each way).
  template <class Comm>
  void tie_embedding_gradients(context<device>& ctx, Comm& pp) {
    if constexpr (PP > 1) {
      if (!first_stage() && !last_stage()) return;
      ctx.synchronize();
      const auto gw = gradient(param::wte);
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
      // bitwise (fp addition commutes), so both copies stay identical.
      for (std::size_t i = 0; i < mine.size(); ++i)
        mine[i] = grad_t(acc_t(first_stage() ? mine[i] : theirs[i]) + acc_t(first_stage() ? theirs[i] : mine[i]));
    } else {
      (void)ctx;
      (void)pp;
    }
  }

  /// Sum of squares of this rank's gradients that count in the global norm (counts_in_norm).
  double local_grad_sum_of_squares(context<device>& ctx) const {
    double s = 0;
    for (int k = 0; k < num_param_tensors; ++k)
      if (counts_in_norm<M, layout>(param(k), tp_rank_, stage_)) {
        const auto gk = gradient(param(k));
        s += ops::sum_of_squares(ctx, gk.data(), gk.size());
      }
    return s;
  }

  /// Global L2 norm of the gradient of the whole (unsharded) model, identical on every rank:
  /// local_grad_sum_of_squares summed over the tp group, then over the pp group, square root.
  /// Every element is counted once (replicated tensors on tp rank 0 only, the tied embedding
  /// on the first stage only; call tie_embedding_gradients first). Data-parallel replicas hold
  /// the same (all-reduced) gradients, so the dp group is not involved. Collective over tp, pp.
  template <class Comm>
  double grad_norm(context<device>& ctx, Comm& tp, Comm& pp) const {
    double s = local_grad_sum_of_squares(ctx);
    tp.all_reduce(std::span<double>(&s, 1), parallel::reduce_op::sum);
    pp.all_reduce(std::span<double>(&s, 1), parallel::reduce_op::sum);
    return std::sqrt(s);
  }

 private:
  storage_t* w(param p, int l = 0) const noexcept { return slice(params_.data(), p, l); }
  grad_t* g(param p, int l = 0) const noexcept { return slice(grads_.data(), p, l); }
  template <class X>
  static X* slice(X* base, param p, int l) noexcept {
    const auto& s = table[std::size_t(p)];
    const std::size_t per = is_per_layer(p) ? s.size() / std::size_t(s.shape[0]) : 0;
    return base + offsets[std::size_t(p)] + std::size_t(l) * per;
  }

  int tp_rank_ = 0, stage_ = 0;
  buffer<device, storage_t> params_;
  buffer<device, grad_t> grads_;
  buffer<device, grad_t> tie_scratch_;
};

/// Any per-parameter buffer of this rank (parameters, gradients, AdamW moments: `local` holds
/// Model::num_parameters values of type V in param_table<M, layout> order, on the host) in the
/// global shape of the single-rank loom::gpt<M, ...> (param_table<M, layout<1,1>> order), on
/// every rank of the tp x pp group. Each element of the unsharded model is written by exactly
/// one rank (the owner rule of counts_in_norm: sharded tensors by every tp rank at their global
/// indices, replicated ones by tp rank 0, wte by the first stage, lnf by the last), the others
/// contribute zeros, and the buffers are summed over tp, then pp (x + 0 is exact: the result is
/// bitwise the owners' values). V must be reducible (float, double, bfloat16, half). Memory:
/// one global buffer per rank. Collective over tp and pp; data-parallel replicas hold the same
/// values and need not take part. Throws loom::input_error when local has the wrong size.
template <class Model, class V, class Comm>
std::vector<V> gather_to_global(const Model& model, std::span<const V> local, Comm& tp, Comm& pp) {
  using M = typename Model::model;
  using L = typename Model::layout;
  constexpr auto global_offsets = param_offsets<M, parallel::layout<1, 1>>();
  if (local.size() != Model::num_parameters)
    throw input_error("gather_to_global: " + std::to_string(local.size()) + " values, but this rank of model " +
                      std::string(M::name) + " has " + std::to_string(Model::num_parameters) +
                      " parameters; pass a buffer laid out like model.parameters()");
  std::vector<V> global(global_offsets.back(), V(0));
  for (int k = 0; k < num_param_tensors; ++k) {
    const auto p = param(k);
    if (!counts_in_norm<M, L>(p, model.tp_rank(), model.stage())) continue;
    const std::size_t off = Model::offsets[std::size_t(k)], n = Model::table[std::size_t(k)].size();
    for (std::size_t i = 0; i < n; ++i)
      global[global_offsets[std::size_t(k)] + global_index<M, L>(p, model.tp_rank(), model.stage(), i)] = local[off + i];
  }
  if constexpr (Model::TP > 1) tp.all_reduce(std::span<V>(global), parallel::reduce_op::sum);
  if constexpr (Model::PP > 1) pp.all_reduce(std::span<V>(global), parallel::reduce_op::sum);
  return global;
}

/// This rank's slices of a whole-model buffer: local[offset(p) + i] = global[global offset(p) +
/// global_index(p, tp_rank, stage, i)] for every tensor p (also those the stage does not use).
/// The inverse of gather_to_global; re-shards single-rank parameters or optimizer moments onto
/// any layout. Local, no communication. Throws loom::input_error on wrong sizes.
template <class Model, class V>
void scatter_from_global(const Model& model, std::span<const V> global, std::span<V> local) {
  using M = typename Model::model;
  using L = typename Model::layout;
  constexpr auto global_offsets = param_offsets<M, parallel::layout<1, 1>>();
  if (global.size() != global_offsets.back() || local.size() != Model::num_parameters)
    throw input_error("scatter_from_global: " + std::to_string(global.size()) + " global and " +
                      std::to_string(local.size()) + " local values for model " + std::string(M::name) + ", which has " +
                      std::to_string(global_offsets.back()) + " parameters (" + std::to_string(Model::num_parameters) +
                      " on this rank); pass the single-rank model's buffer (gather_to_global)");
  for (int k = 0; k < num_param_tensors; ++k) {
    const std::size_t off = Model::offsets[std::size_t(k)], n = Model::table[std::size_t(k)].size();
    for (std::size_t i = 0; i < n; ++i)
      local[off + i] = global[global_offsets[std::size_t(k)] + global_index<M, L>(param(k), model.tp_rank(), model.stage(), i)];
  }
}

/// The parameters of the whole model in the buffer order of the single-rank loom::gpt (copy them
/// into gpt::parameters() to run the unsharded model: sampling, export), on every rank of the
/// tp x pp group: gather_to_global of model.parameters() (copied to the host first).
/// Collective over tp and pp.
template <class Model, class Comm>
std::vector<typename Model::storage_t> gather_parameters(context<typename Model::device>& ctx, const Model& model,
                                                         Comm& tp, Comm& pp) {
  using S = typename Model::storage_t;
  std::vector<S> local(Model::num_parameters);
  Model::device::copy_to_host(local.data(), model.parameters().data(), local.size() * sizeof(S), ctx.stream);
  ctx.synchronize();
  return gather_to_global(model, std::span<const S>(local), tp, pp);
}

/// Sets this rank's parameters from the whole model's `global` parameters (the single-rank
/// loom::gpt buffer order, as gather_parameters returns): scatter_from_global, then a copy to
/// the device. Re-shards a single-rank checkpoint or imported weights onto any layout. Local,
/// no communication. Throws loom::input_error when global has the wrong size.
template <class Model>
void load_global_parameters(context<typename Model::device>& ctx, Model& model,
                            std::span<const typename Model::storage_t> global) {
  using S = typename Model::storage_t;
  std::vector<S> local(Model::num_parameters);
  scatter_from_global(model, global, std::span<S>(local));
  Model::device::copy_to_device(model.parameters().data(), local.data(), local.size() * sizeof(S), ctx.stream);
  ctx.synchronize();
}

/// One optimizer step's forward and backward passes over m micro-batches on this rank, in the
/// 1F1B order of parallel::one_f_one_b(PP, m, model.stage()), moving activations down and
/// gradients up the pipeline over `pp` (tags 0 and 1). With PP == 1 this is plain gradient
/// accumulation: forward m, backward m, for m = 0..m-1.
///   ring     activation sets; micro-batch i uses ring[i % ring.size()]. Needs at least
///            parallel::max_in_flight(PP, m, stage) sets (input_error otherwise): 1F1B guarantees
///            micro-batch i - ring.size() has finished its backward when i starts its forward.
///   inputs, targets  (m, b, t) int32: micro-batch i at offset i*b*t (inputs read on the first
///            stage, targets on the last; every stage may pass the same pointers)
///   grad_scale       as gpt::forward (1 / non-ignored targets of the whole step for a mean)
/// Accumulates (+=) the parameter gradients; call tie_embedding_gradients afterwards when PP > 1.
/// Returns the sum of the per-token losses over all micro-batches, identical on every rank
/// (computed on the last stage, broadcast over pp). Collective over tp and pp.
/// Sends are issued before the matching receives are posted on the peer (1F1B's order): the
/// communicator's send must not wait for its receiver (comm::threads: eager). See
/// parallel/schedule.hpp.
/// `observe(action, seconds)` is called after every action with its wall time (including the
/// wait of a receive), after synchronizing the stream; the default does nothing and costs nothing.
struct no_observer {
  void operator()(const parallel::pipe_action&, double) const noexcept {}
};
template <class Model, int B, int T, class Comm, class Observer = no_observer>
typename Model::acc_t pipeline_forward_backward(context<typename Model::device>& ctx, Model& model,
                                                std::span<typename Model::template activations<B, T>> ring, Comm& tp,
                                                Comm& pp, int m, const std::int32_t* inputs,
                                                const std::int32_t* targets, int b, int t,
                                                typename Model::acc_t grad_scale, Observer&& observe = {}) {
  constexpr bool timed = !std::is_same_v<std::remove_cvref_t<Observer>, no_observer>;
  using acc = typename Model::acc_t;
  using S = typename Model::storage_t;
  constexpr int PP = Model::PP;
  const int stage = model.stage();
  const int need = parallel::max_in_flight(PP, m, stage);
  if (int(ring.size()) < need)
    throw input_error("pipeline_forward_backward: " + std::to_string(ring.size()) +
                      " activation sets for stage " + std::to_string(stage) + " of " + std::to_string(PP) +
                      " with " + std::to_string(m) + " micro-batches; 1F1B keeps up to " + std::to_string(need) +
                      " in flight: pass parallel::max_in_flight(PP, m, stage) sets");
  const std::size_t N = std::size_t(b) * t, NC = N * std::size_t(Model::C);
  constexpr int tag_activation = 0, tag_gradient = 1;
  acc loss = 0;
  for (const auto& a : parallel::one_f_one_b(PP, m, stage)) {
    [[maybe_unused]] const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    auto& acts = ring[std::size_t(a.micro) % ring.size()];
    const std::int32_t* in = inputs + std::size_t(a.micro) * N;
    const std::int32_t* tg = targets ? targets + std::size_t(a.micro) * N : nullptr;
    switch (a.op) {
      case parallel::pipe_op::recv_forward: pp.recv(std::span<S>(acts.input(), NC), stage - 1, tag_activation); break;
      case parallel::pipe_op::forward: loss += model.forward(ctx, acts, tp, in, tg, b, t, grad_scale); break;
      case parallel::pipe_op::send_forward:
        ctx.synchronize();
        pp.send(std::span<const S>(acts.output(), NC), stage + 1, tag_activation);
        break;
      case parallel::pipe_op::recv_backward: pp.recv(std::span<S>(acts.output_grad(), NC), stage + 1, tag_gradient); break;
      case parallel::pipe_op::backward: model.backward(ctx, acts, tp, in, b, t); break;
      case parallel::pipe_op::send_backward:
        ctx.synchronize();
        pp.send(std::span<const S>(acts.input_grad(), NC), stage - 1, tag_gradient);
        break;
    }
    if constexpr (timed) {
      ctx.synchronize();
      observe(a, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  pp.broadcast(std::span<acc>(&loss, 1), PP - 1);
  return loss;
}

}  // namespace loom::nn
