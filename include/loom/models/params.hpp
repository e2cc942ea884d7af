#pragma once
/// \file The compile-time parameter table of a model (llm.c's ParameterTensors, as data),
/// generated from the model's recipe (models/recipe.hpp).
///
/// One row per parameter tensor, in a fixed order; all rows of one rank live in one
/// contiguous buffer, addressed by the row's offset. Shapes are the per-rank (local) shapes
/// after the tensor-parallel split; `global` keeps the logical shape so checkpoints can be
/// resharded. Linear weights are (out, in) like torch.nn.Linear. Each row also carries what
/// the rest of the library needs to know about the tensor (shard rule, per-layer or global,
/// sections, which pipeline stages use it, which rank counts it in the gradient norm, init,
/// weight decay, its Hugging Face name): code outside nn/ and models/ iterates rows and never
/// names a tensor.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <loom/core/layout.hpp>
#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>
#include <loom/models/recipe.hpp>

namespace loom::models {

/// The roles a parameter tensor can play in a block or around the stack. A recipe's table holds
/// a subset of them (GPT-2 all but lm_head, in this order); the model code finds a role's row
/// with rows_by_role. Role values seed the initialisation streams, so a tensor draws the same
/// values whatever other rows its recipe has.
enum class role : int {
  wte, wpe, ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b,
  ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b, lnf_w, lnf_b, lm_head, count
};
/// The GPT-2 name of the role enum (GPT-2's table row k is role k).
using param = role;

/// How a tensor is split across tensor-parallel ranks (Megatron-LM semantics).
enum class shard : unsigned char {
  replicated,  ///< identical on every tp rank (norms, row-parallel bias, position embedding)
  column,      ///< output rows split (qkv, fc1: ColumnParallelLinear)
  row,         ///< input columns split (attention proj, fc2: RowParallelLinear)
  vocab,       ///< vocabulary rows split (VocabParallelEmbedding / LM head)
};

/// How a parameter is initialised (GPT-2, Radford et al. 2019; llm.c/nanoGPT practice).
enum class init : unsigned char { normal, residual_normal, ones, zeros };

/// Which pipeline stages use a global (not per-layer) tensor; per-layer tensors are used by
/// every stage (each its own layers). Megatron-LM's layout: the embedding on the first stage,
/// the final norm and the LM head on the last, a tied embedding on both.
enum class stages : unsigned char { all, first, last, first_and_last };

/// One row of the table. shape[0] is the per-stage layer count for per-layer tensors.
struct param_spec {
  std::string_view name;          ///< loom's name ("qkv_w"), used in checkpoints and weight files
  role id;
  int ndim;                       ///< 1..3
  std::array<long, 3> shape;      ///< local (per-rank) shape, unused dims = 1
  std::array<long, 3> global;     ///< logical shape across tp ranks (same layer count)
  bool decay;                     ///< receives AdamW weight decay by default
  shard rule;
  init how;
  bool per_layer;                 ///< first dimension is the layer (split across pipeline stages)
  int sections;                   ///< a column tensor's independent sections (qkv: 3), each split by tp
  std::array<int, 3> parts;       ///< relative section sizes (grouped-query qkv: {NH, KV, KV}; else 1s)
  stages used;                    ///< global tensors: the stages that use it
  std::string_view hf_name;       ///< Hugging Face name, "{}" = layer index; empty = none
  bool hf_transposed;             ///< Hugging Face stores the transpose (GPT-2's Conv1D)
  constexpr std::size_t size() const { return std::size_t(shape[0]) * shape[1] * shape[2]; }
  /// Elements of one layer's slice (per-layer rows), of the whole tensor otherwise.
  constexpr std::size_t layer_size() const { return per_layer ? size() / std::size_t(shape[0]) : size(); }
};

/// What a parameter table is built from: the recipe and the model's sizes (a model config's at
/// compile time, model_spec's at run time). C the width, Vp the padded vocabulary,
/// NH / KV the query / key-value heads, H the MLP's hidden width.
struct table_shape {
  recipe r;
  long n_layer = 0, C = 0, NH = 0, KV = 0, H = 0, Vp = 0, max_seq = 0;
};

/// The table_shape of model config M.
template <model_config M>
constexpr table_shape table_shape_of() noexcept {
  return {arch_of<M>(), M::n_layer, M::d_model, M::n_head, kv_heads_of<M>(), mlp_hidden_of<M>(),
          M::vocab_padded, M::max_seq};
}

/// Up to role::count rows and how many are used; the recipe decides which rows exist.
struct table_builder {
  std::array<param_spec, std::size_t(role::count)> rows{};
  std::size_t n = 0;
};

/// The table of model m on tp x pp (layers per stage n_layer / pp), at compile time or at run
/// time (the run-time memory plan, train/shape_plan.hpp). The sizes must divide as
/// fits requires (the caller checks: model_facts::layout_problem).
constexpr table_builder build_table(const table_shape& m, long tp, long pp) {
  const recipe r = m.r;
  const long C = m.C, Vp = m.Vp, Ls = m.n_layer / pp;
  const long NH = m.NH, KV = m.KV, hd = C / NH, H = m.H;
  const bool ln = r.norm == norm_kind::layernorm, swiglu = r.mlp == mlp_kind::swiglu;
  using enum shard;
  using enum init;
  table_builder b;
  auto global = [&](std::string_view name, role id, long rows, long cols, bool decay, shard rule, init how,
                    stages used, std::string_view hf, bool hf_t = false) {
    const long local_rows = rule == vocab ? rows / tp : rows;
    b.rows[b.n++] = {name, id, cols == 1 ? 1 : 2, {local_rows, cols, 1}, {rows, cols, 1}, decay, rule, how,
                     false, 1, {1, 1, 1}, used, hf, hf_t};
  };
  // A per-layer (Ls, rows) vector (cols == 1) or (Ls, rows, cols) matrix; a column tensor's
  // sections are split by tp each, in proportion `parts`.
  auto layer = [&](std::string_view name, role id, long rows, long cols, bool decay, shard rule, init how,
                   std::string_view hf, bool hf_t = false, int sections = 1, std::array<int, 3> parts = {1, 1, 1}) {
    const long lr = rule == column ? rows / tp : rows, lc = rule == row ? cols / tp : cols;
    b.rows[b.n++] = {name, id, cols == 1 ? 2 : 3, {Ls, lr, lc}, {Ls, rows, cols}, decay, rule, how,
                     true, sections, parts, stages::all, hf, hf_t};
  };
  const bool bias = r.linear_bias;
  global("wte", role::wte, Vp, C, false, vocab, normal, r.tied_head ? stages::first_and_last : stages::first,
         "wte.weight");
  if (r.position == position_kind::learned)
    global("wpe", role::wpe, m.max_seq, C, false, replicated, normal, stages::first, "wpe.weight");
  layer("ln1_w", role::ln1_w, C, 1, false, replicated, ones, "h.{}.ln_1.weight");
  if (ln) layer("ln1_b", role::ln1_b, C, 1, false, replicated, zeros, "h.{}.ln_1.bias");
  // [q: NH heads | k: KV heads | v: KV heads] of hd rows each
  const std::array<int, 3> qkv_parts = KV == NH ? std::array<int, 3>{1, 1, 1} : std::array<int, 3>{int(NH), int(KV), int(KV)};
  layer("qkv_w", role::qkv_w, (NH + 2 * KV) * hd, C, true, column, normal, "h.{}.attn.c_attn.weight", true, 3, qkv_parts);
  if (bias)
    layer("qkv_b", role::qkv_b, (NH + 2 * KV) * hd, 1, false, column, zeros, "h.{}.attn.c_attn.bias", false, 3, qkv_parts);
  layer("attproj_w", role::attproj_w, C, C, true, row, residual_normal, "h.{}.attn.c_proj.weight", true);
  if (bias) layer("attproj_b", role::attproj_b, C, 1, false, replicated, zeros, "h.{}.attn.c_proj.bias");
  layer("ln2_w", role::ln2_w, C, 1, false, replicated, ones, "h.{}.ln_2.weight");
  if (ln) layer("ln2_b", role::ln2_b, C, 1, false, replicated, zeros, "h.{}.ln_2.bias");
  // SwiGLU: [gate | up], each H rows, split by tp each
  layer("fc_w", role::fc_w, swiglu ? 2 * H : H, C, true, column, normal, "h.{}.mlp.c_fc.weight", true, swiglu ? 2 : 1);
  if (bias) layer("fc_b", role::fc_b, swiglu ? 2 * H : H, 1, false, column, zeros, "h.{}.mlp.c_fc.bias", false, swiglu ? 2 : 1);
  layer("fcproj_w", role::fcproj_w, C, H, true, row, residual_normal, "h.{}.mlp.c_proj.weight", true);
  if (bias) layer("fcproj_b", role::fcproj_b, C, 1, false, replicated, zeros, "h.{}.mlp.c_proj.bias");
  global("lnf_w", role::lnf_w, C, 1, false, replicated, ones, stages::last, "ln_f.weight");
  if (ln) global("lnf_b", role::lnf_b, C, 1, false, replicated, zeros, stages::last, "ln_f.bias");
  if (!r.tied_head) global("lm_head", role::lm_head, Vp, C, false, vocab, normal, stages::last, "lm_head.weight");
  if (r.hf_model_type != "gpt2")  // the names above are GPT-2's; io/hf_llama.hpp maps Llama's itself
    for (std::size_t k = 0; k < b.n; ++k) b.rows[k].hf_name = {};
  return b;
}

namespace detail {
template <model_config M, parallel::layout_policy L>
consteval table_builder build_table() {
  return models::build_table(table_shape_of<M>(), L::tp, L::pp);
}
}  // namespace detail

/// Number of rows of model M's table (the same on every layout).
template <model_config M>
inline constexpr std::size_t num_params = detail::build_table<M, parallel::layout<1, 1>>().n;

/// rows_by_role<M>[r]: the table row of role r in model M's table, or -1 when its recipe has
/// no such tensor.
template <model_config M>
inline constexpr std::array<int, std::size_t(role::count)> rows_by_role = [] {
  constexpr auto b = detail::build_table<M, parallel::layout<1, 1>>();
  std::array<int, std::size_t(role::count)> r{};
  r.fill(-1);
  for (std::size_t k = 0; k < b.n; ++k) r[std::size_t(b.rows[k].id)] = int(k);
  return r;
}();

/// The table for model M under layout L (layers per pipeline stage = n_layer / pp).
template <model_config M, parallel::layout_policy L>
consteval std::array<param_spec, num_params<M>> param_table() {
  (void)fits<L, M>();
  constexpr auto b = detail::build_table<M, L>();
  std::array<param_spec, num_params<M>> t{};
  for (std::size_t k = 0; k < t.size(); ++k) t[k] = b.rows[k];
  return t;
}

/// Element offsets of each table row in the parameter buffer, plus the total at the end.
template <model_config M, parallel::layout_policy L>
consteval std::array<std::size_t, num_params<M> + 1> param_offsets() {
  constexpr auto t = param_table<M, L>();
  std::array<std::size_t, num_params<M> + 1> off{};
  for (std::size_t i = 0; i < t.size(); ++i) off[i + 1] = off[i] + t[i].size();
  return off;
}

/// Number of parameters of the whole (unsharded) model. `with_lookups` false excludes the
/// tables that are only looked up, never multiplied: the position table, and the token
/// embedding when the LM head is untied (a tied one is the LM head's matrix). That is the N of
/// the MFU formula (Kaplan et al. 2020, "Scaling Laws", §2.1; PaLM appendix B).
template <model_config M>
consteval std::size_t parameter_count(bool with_lookups = true) {
  constexpr auto t = param_table<M, parallel::layout<1, 1>>();
  constexpr bool untied = rows_by_role<M>[std::size_t(role::lm_head)] >= 0;
  std::size_t n = 0;
  for (const auto& s : t)
    if (with_lookups || (s.id != role::wpe && !(untied && s.id == role::wte))) n += s.size();
  return n;
}

/// Whether pipeline stage `stage` of `pp` uses table row s: per-layer rows everywhere, global
/// rows on the stages of s.used.
constexpr bool stage_uses(const param_spec& s, int stage, int pp) noexcept {
  if (s.per_layer) return true;
  const bool first = stage == 0, last = stage == pp - 1;
  switch (s.used) {
    case stages::first: return first;
    case stages::last: return last;
    case stages::first_and_last: return first || last;
    case stages::all: break;
  }
  return true;
}

/// The stage whose copy of global row s is read when the model is gathered or resharded: the
/// last for tensors only the last stage uses, the first otherwise (a tied embedding's last-stage
/// copy equals the first's after nn::transformer::tie_embedding_gradients and the update).
constexpr int owner_stage(const param_spec& s, int pp) noexcept { return s.used == stages::last ? pp - 1 : 0; }

/// Whether rank (tp_rank, stage)'s copy of row s counts in the global gradient norm (and is
/// the copy written when gathering the model), so that summing over all ranks counts every
/// element of the unsharded model exactly once: sharded rows on every tp rank, replicated ones
/// on tp rank 0 only; per-layer rows on every stage, global rows on their owner stage.
constexpr bool counts_in_norm(const param_spec& s, int tp_rank, int stage, int pp) noexcept {
  if (s.rule == shard::replicated && tp_rank != 0) return false;
  return s.per_layer ? true : stage == owner_stage(s, pp);
}

/// The ready() event of a backward pass after which row s's gradient is final on its stage:
/// the layer index for per-layer rows (their slice of that layer), `layers` (the stage's layer
/// count: after the final norm and the LM head) for rows only the last stage uses, -1 (the end
/// of backward: the embedding) for the others.
constexpr int ready_event(const param_spec& s, int layers) noexcept {
  return s.used == stages::last ? layers : -1;
}

/// The Hugging Face name of row s at layer `layer` ("{}" replaced), empty when it has none.
inline std::string hf_name(const param_spec& s, int layer) {
  std::string n(s.hf_name);
  if (const auto at = n.find("{}"); at != std::string::npos) n.replace(at, 2, std::to_string(layer));
  return n;
}

/// Visits every (row, layer) of a table in forward order: the global rows before the first
/// per-layer row, then layer 0..layers-1 with every per-layer row, then the remaining global
/// rows; layer = -1 for global rows. With reverse = true, the exact reverse (backward order).
/// f(std::size_t row, int layer).
template <std::size_t N, class F>
constexpr void for_each_tensor(const std::array<param_spec, N>& t, int layers, F&& f, bool reverse = false) {
  std::size_t first = N, last = 0;
  for (std::size_t k = 0; k < N; ++k)
    if (t[k].per_layer) {
      first = first < k ? first : k;
      last = k + 1;
    }
  if (first == N) first = last = N;
  auto globals = [&](std::size_t a, std::size_t e) {
    if (!reverse) for (std::size_t k = a; k < e; ++k) f(k, -1);
    else for (std::size_t k = e; k-- > a;) f(k, -1);
  };
  auto block = [&](int l) {
    if (!reverse) for (std::size_t k = first; k < last; ++k) { if (t[k].per_layer) f(k, l); }
    else for (std::size_t k = last; k-- > first;) { if (t[k].per_layer) f(k, l); }
  };
  if (!reverse) {
    globals(0, first);
    for (int l = 0; l < layers; ++l) block(l);
    globals(last, N);
  } else {
    globals(last, N);
    for (int l = layers; l-- > 0;) block(l);
    globals(0, first);
  }
}

static_assert(param_offsets<gpt2_small, parallel::ddp>().back() == 124475904);  // GPT-2 small, 50304 rows
static_assert(num_params<gpt2_small> == 16 && rows_by_role<gpt2_small>[std::size_t(role::lm_head)] == -1);

}  // namespace loom::models
