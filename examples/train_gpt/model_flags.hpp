#pragma once
// train_gpt's model-shape flags, with Megatron-LM's names (--num-layers, --hidden-size, ...),
// --model-config (a Hugging Face config.json) and --init-from-hf's config.json, and the
// instance they make: the model_spec, precision, layout, device, attention and capacities that
// train::instance_cache compiles on first use when the build has no such instance. Not a
// library header: examples/ only.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include <loom/core/error.hpp>
#include <loom/data/source.hpp>
#include <loom/io/hf_config.hpp>
#include <loom/models/spec.hpp>
#include <loom/train/instance_source.hpp>

#include "options.hpp"

namespace train_gpt_cli {

/// The model-shape flags (Megatron-LM's names and defaults; 0 or empty: not given).
struct model_options {
  int num_layers = 0, hidden_size = 0, num_attention_heads = 0, num_query_groups = 0, ffn_hidden_size = 0;
  int max_position_embeddings = 0, vocab_size = 0, make_vocab_size_divisible_by = 128;
  bool group_query_attention = false, swiglu = false, untie = false, disable_bias_linear = false;
  std::string position_embedding_type = "learned_absolute", normalization = "LayerNorm", model_config;
  double rotary_base = 10000, norm_epsilon = 1e-5;
  bool compile_only = false;
};

/// The flags that give a shape (any of them given: the shape comes from flags, not --model).
inline constexpr const char* shape_flags[] = {
    "--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups", "--group-query-attention",
    "--ffn-hidden-size", "--max-position-embeddings", "--position-embedding-type", "--rotary-base",
    "--normalization", "--norm-epsilon", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear"};

/// Registers the model-shape flags on `app` (parsing writes `m`, which must outlive `app`):
/// train_gpt's and plan's.
inline void add_model_flags(CLI::App& app, model_options& m) {
  auto* g = app.add_option_group("model shape", "Megatron-LM's names; any of them replaces --model's preset");
  g->add_option("--num-layers", m.num_layers, "transformer layers")->check(CLI::Range(1, 1 << 12));
  g->add_option("--hidden-size", m.hidden_size, "model width")->check(CLI::Range(1, 1 << 17));
  g->add_option("--num-attention-heads", m.num_attention_heads, "query heads (dividing --hidden-size)")
      ->check(CLI::Range(1, 1 << 12));
  g->add_flag("--group-query-attention", m.group_query_attention, "grouped-query attention (with --num-query-groups)");
  g->add_option("--num-query-groups", m.num_query_groups,
                "key/value heads with --group-query-attention (dividing the heads)")
      ->check(CLI::Range(1, 1 << 12));
  g->add_option("--ffn-hidden-size", m.ffn_hidden_size,
                "MLP hidden width (default 4 x hidden, with --swiglu int(8 x hidden / 3 / 64) x 64, Megatron's)")
      ->check(CLI::Range(1, 1 << 20));
  g->add_option("--max-position-embeddings", m.max_position_embeddings,
                "positions of the model (default --seq-length)")
      ->check(CLI::Range(1, 1 << 20));
  g->add_option("--position-embedding-type", m.position_embedding_type, "learned_absolute or rope")
      ->capture_default_str()
      ->check(CLI::IsMember({"learned_absolute", "rope"}));
  g->add_option("--rotary-base", m.rotary_base, "rotary base theta")->capture_default_str();
  g->add_option("--normalization", m.normalization, "LayerNorm or RMSNorm")
      ->capture_default_str()
      ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}));
  g->add_option("--norm-epsilon", m.norm_epsilon, "the norms' epsilon (LayerNorm: 1e-5 only)")->capture_default_str();
  g->add_flag("--swiglu", m.swiglu, "SwiGLU MLP (gate and up, silu) instead of GELU");
  g->add_flag("--untie-embeddings-and-output-weights", m.untie, "an LM head of its own (untied from the embedding)");
  g->add_flag("--disable-bias-linear", m.disable_bias_linear, "no biases in the linear layers");
  g->add_option("--vocab-size", m.vocab_size,
                "vocabulary (default: the dataset's tokenizer, 256 for a text file's bytes)")
      ->check(CLI::Range(1, 1 << 24));
  g->add_option("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by,
                "embedding rows padded to a multiple of this x TP")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  g->add_option("--model-config", m.model_config,
                "a Hugging Face config.json (model_type gpt2, llama, mistral without a sliding window), or its directory");
}

/// Registers train_gpt's --compile-only (parsing writes m.compile_only).
inline void add_compile_only_flag(CLI::App& app, model_options& m) {
  app.add_flag("--compile-only", m.compile_only,
               "compile the instance the flags ask for into the cache ($LOOM_CACHE_DIR, ~/.cache/loom) and exit "
               "(fill the cache ahead of a job on nodes without a compiler)");
}

/// Whether any shape flag was given.
inline bool shape_from_flags(const CLI::App& app) {
  for (const char* f : shape_flags)
    if (app.count(f) > 0) return true;
  return false;
}

/// The vocabulary the data needs: --vocab-size, else the dataset's (PREFIX.json), else 256 for a
/// text file's bytes.
inline int data_vocab(const options& o, const model_options& m, bool dataset) {
  if (m.vocab_size > 0) return m.vocab_size;
  if (dataset)
    if (const auto p = loom::data::indexed_dataset_prefix(o.data))
      if (const auto d = loom::data::read_dataset_summary(*p); d && d->vocab_size > 0) return int(d->vocab_size);
  return 256;
}

/// The model of the run: from the shape flags (Megatron's defaults for those not given),
/// --model-config, --init-from-hf's config.json, or --model's preset (in that order; more than
/// one of the first three is refused). `tp` pads the vocabulary (Megatron's
/// --make-vocab-size-divisible-by x TP). Throws loom::input_error naming the flag at fault.
inline loom::models::model_spec resolve_model(const options& o, const model_options& m, const CLI::App& app,
                                              bool dataset, int tp) {
  using loom::input_error;
  const bool flags = shape_from_flags(app), config = !m.model_config.empty();
  const bool hf = !o.init_from_hf.empty() && !flags && !config && app.count("--model") == 0;
  if (flags && config)
    throw input_error("--model-config and the shape flags (" + std::string(shape_flags[0]) + ", ...) both give the "
                      "model; pass one of them");
  if ((flags || config) && app.count("--model") > 0)
    throw input_error("--model " + o.model + " is a preset; drop it, or drop " +
                      (config ? std::string("--model-config") : std::string("the shape flags")));
  const int pad = std::max(1, m.make_vocab_size_divisible_by) * tp;
  if (config || hf) {
    auto s = loom::io::read_hf_config(config ? std::filesystem::path(m.model_config) : std::filesystem::path(o.init_from_hf));
    if (app.count("--vocab-size") > 0 && m.vocab_size != s.vocab)
      throw input_error("--vocab-size " + std::to_string(m.vocab_size) + " differs from the config's vocab_size " +
                        std::to_string(s.vocab) + "; drop --vocab-size");
    s.vocab_padded = loom::models::round_up(s.vocab, app.count("--make-vocab-size-divisible-by") ? pad : tp);
    s.name = s.derived_name();
    return s;
  }
  if (!flags) {
    auto s = loom::models::preset_spec(o.model);
    if (!s) throw input_error("--model " + o.model + " is not a preset (" + loom::models::model_names() + ")");
    return *s;
  }
  std::string missing;
  int n_missing = 0;
  for (const char* f : {"--num-layers", "--hidden-size", "--num-attention-heads"})
    if (app.count(f) == 0) missing += (missing.empty() ? "" : " and ") + std::string(f), ++n_missing;
  if (n_missing > 0)
    throw input_error(missing + (n_missing > 1 ? " are" : " is") + " needed with the other shape flags (Megatron-LM's "
                      "--num-layers, --hidden-size and --num-attention-heads give a model)");
  if (app.count("--num-query-groups") > 0 && !m.group_query_attention)
    throw input_error("--num-query-groups " + std::to_string(m.num_query_groups) + " takes effect with "
                      "--group-query-attention (as in Megatron-LM); pass both");
  loom::models::model_spec s;
  s.n_layer = m.num_layers, s.d_model = m.hidden_size, s.n_head = m.num_attention_heads;
  s.n_kv_head = m.group_query_attention ? (m.num_query_groups > 0 ? m.num_query_groups : 1) : s.n_head;
  s.mlp = m.swiglu ? loom::models::mlp_kind::swiglu : loom::models::mlp_kind::gelu;
  s.d_ff = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : m.swiglu ? int(4.0 * m.hidden_size * 2 / 3 / 64) * 64 : 4 * m.hidden_size;
  if (s.d_ff < 1) s.d_ff = 64;  // Megatron's rule gives 0 below a width of 24
  const int seq = o.seq_len > 0 ? o.seq_len : 0;
  s.max_seq = m.max_position_embeddings > 0 ? m.max_position_embeddings : seq;
  if (s.max_seq < 1)
    throw input_error("--seq-length (or --max-position-embeddings) is needed with the shape flags: the model's "
                      "positions; pass e.g. --seq-length 1024");
  s.position = m.position_embedding_type == "rope" ? loom::models::position_kind::rotary : loom::models::position_kind::learned;
  s.norm = m.normalization == "RMSNorm" ? loom::models::norm_kind::rmsnorm : loom::models::norm_kind::layernorm;
  s.rope_theta = m.rotary_base, s.norm_eps = m.norm_epsilon;
  s.linear_bias = !m.disable_bias_linear, s.tied_head = !m.untie;
  s.vocab = data_vocab(o, m, dataset);
  s.vocab_padded = loom::models::round_up(s.vocab, pad);
  s.name_recipe();
  s.name = s.derived_name();
  if (app.count("--rotary-base") > 0 && s.position != loom::models::position_kind::rotary)
    throw input_error("--rotary-base is for --position-embedding-type rope; drop it or pass rope");
  return s;
}

}  // namespace train_gpt_cli
