#pragma once
/// \file Compile-time GPT model configurations.
///
/// A model is a type with static constexpr members (llm.c's GPT2Config lifted into types):
///   n_layer, n_head, d_model  transformer depth, heads, width (d_model % n_head == 0)
///   max_seq                   learned position embeddings, the longest usable sequence
///   vocab                     real vocabulary size (token ids in [0, vocab))
///   vocab_padded              embedding rows; >= vocab, padded for alignment/TP; padded rows
///                             are never predicted (softmax runs over [0, vocab) only)
///   arch (optional)           the architecture recipe (models/recipe.hpp); models::gpt2 when absent
///   n_kv_head (optional)      key/value heads, dividing n_head (grouped-query attention);
///                             n_head when absent
///   d_ff (optional)           the MLP's hidden width (SwiGLU: of each of gate and up);
///                             4 * d_model when absent
///   rope_theta (optional)     rotary base (recipes with rotary positions); 10000 when absent
///   norm_eps (optional)       RMSNorm's epsilon; 1e-5 when absent (LayerNorm always uses 1e-5)
/// max_seq also bounds rotary models: their cos/sin table holds max_seq positions.
#include <concepts>
#include <string_view>

#include <loom/models/recipe.hpp>

namespace loom::models {

/// Key/value heads of config M: M::n_kv_head, or n_head (multi-head attention).
template <class M>
consteval int kv_heads_of() {
  if constexpr (requires { M::n_kv_head; }) return M::n_kv_head;
  else return M::n_head;
}
/// The MLP's hidden width of config M: M::d_ff, or 4 * d_model (GPT-2).
template <class M>
consteval int mlp_hidden_of() {
  if constexpr (requires { M::d_ff; }) return M::d_ff;
  else return 4 * M::d_model;
}
/// The rotary base theta of config M: M::rope_theta, or 10000 (Su et al. 2021; Llama 1 and 2).
template <class M>
consteval double rope_theta_of() {
  if constexpr (requires { M::rope_theta; }) return M::rope_theta;
  else return 10000.0;
}
/// RMSNorm's epsilon of config M: M::norm_eps, or 1e-5.
template <class M>
consteval double norm_eps_of() {
  if constexpr (requires { M::norm_eps; }) return M::norm_eps;
  else return 1e-5;
}

template <class M>
concept model_config = requires {
  { M::n_layer } -> std::convertible_to<int>;
  { M::n_head } -> std::convertible_to<int>;
  { M::d_model } -> std::convertible_to<int>;
  { M::max_seq } -> std::convertible_to<int>;
  { M::vocab } -> std::convertible_to<int>;
  { M::vocab_padded } -> std::convertible_to<int>;
} && (M::vocab_padded >= M::vocab) && (M::d_model % M::n_head == 0) && (kv_heads_of<M>() >= 1) &&
                       (M::n_head % kv_heads_of<M>() == 0) && (mlp_hidden_of<M>() >= 1);

/// A tiny model for unit tests: odd sizes on purpose (no dimension is a multiple of a tile).
struct tiny {
  static constexpr std::string_view name = "tiny";
  static constexpr int n_layer = 2, n_head = 3, d_model = 24, max_seq = 16;
  static constexpr int vocab = 61, vocab_padded = 64;
};

/// A tiny model for the tensor- and pipeline-parallel tests: 4 heads and 4 layers, so TP and PP
/// in {1, 2, 4} divide it; per-rank widths stay odd-sized (head 5, C/TP 10 or 5, Vp/TP 32 or 16).
struct tiny_parallel {
  static constexpr std::string_view name = "tiny_parallel";
  static constexpr int n_layer = 4, n_head = 4, d_model = 20, max_seq = 16;
  static constexpr int vocab = 61, vocab_padded = 64;
};

/// tiny_parallel's sizes with the second recipe, GPT-2 without linear biases and with an untied
/// LM head (models::gpt2_untied_nobias): the test that the parameter table, not code naming GPT-2's
/// tensors, drives the trainers, data parallelism, checkpoints and resharding.
struct tiny_untied {
  static constexpr std::string_view name = "tiny_untied";
  static constexpr models::recipe arch = models::gpt2_untied_nobias;
  static constexpr int n_layer = 4, n_head = 4, d_model = 20, max_seq = 16;
  static constexpr int vocab = 61, vocab_padded = 64;
};

/// A tiny byte-level model (vocabulary 256) for smoke tests of the examples: seconds per run.
struct char_tiny {
  static constexpr std::string_view name = "char_tiny";
  static constexpr int n_layer = 2, n_head = 2, d_model = 32, max_seq = 32;
  static constexpr int vocab = 256, vocab_padded = 256;
};

/// The quickstart: a byte-level character model that learns tinyshakespeare on two CPU cores
/// in minutes (about 2.7M parameters).
struct quickstart {
  static constexpr std::string_view name = "quickstart";
  static constexpr int n_layer = 4, n_head = 6, d_model = 192, max_seq = 128;
  static constexpr int vocab = 256, vocab_padded = 256;
};

/// The quickstart's shape with a SentencePiece vocabulary: for data prepared by prepare_data
/// with --vocab-size <= 8192 (the default 8000 fits). Same transformer as quickstart (4
/// layers, 6 heads, width 192, 128 positions); the 8192-row embedding, tied with the output
/// layer, brings it to about 3.4M parameters.
struct quickstart_bpe {
  static constexpr std::string_view name = "quickstart_bpe";
  static constexpr int n_layer = 4, n_head = 6, d_model = 192, max_seq = 128;
  static constexpr int vocab = 8192, vocab_padded = 8192;
};

/// The benchmark config (bench_step, bench_matmul): vocab 8192, seq 256, width 384, 6 layers, 6 heads.
struct bench_small {
  static constexpr std::string_view name = "bench_small";
  static constexpr int n_layer = 6, n_head = 6, d_model = 384, max_seq = 256;
  static constexpr int vocab = 8192, vocab_padded = 8192;
};

/// GPT-2 small (124M), Radford et al. 2019: vocab 50257 padded to 50304 (a multiple of 128).
struct gpt2_small {
  static constexpr std::string_view name = "gpt2_small";
  static constexpr int n_layer = 12, n_head = 12, d_model = 768, max_seq = 1024;
  static constexpr int vocab = 50257, vocab_padded = 50304;
};

/// A tiny Llama for unit tests (models::llama): odd sizes, grouped-query attention (6 query heads
/// sharing 2 key/value heads, head size 4), SwiGLU hidden 14, so TP 2 splits heads, key/value
/// heads and the MLP and PP 2 splits the layers.
struct llama_tiny {
  static constexpr std::string_view name = "llama_tiny";
  static constexpr models::recipe arch = models::llama;
  static constexpr int n_layer = 2, n_head = 6, n_kv_head = 2, d_model = 24, d_ff = 14, max_seq = 16;
  static constexpr int vocab = 61, vocab_padded = 64;
  static constexpr double rope_theta = 10000.0, norm_eps = 1e-5;
};

/// The quickstart's Llama: quickstart_bpe's sizes (4 layers, width 192, 6 query heads, 128
/// positions, the 8192-token SentencePiece vocabulary of prepare_data --vocab-size <= 8192) with
/// 2 key/value heads and a SwiGLU MLP of hidden width 512 (about the GELU MLP's parameters);
/// its untied LM head brings it to about 4.7M parameters (quickstart_bpe: 3.4M).
struct llama_quickstart {
  static constexpr std::string_view name = "llama_quickstart";
  static constexpr models::recipe arch = models::llama;
  static constexpr int n_layer = 4, n_head = 6, n_kv_head = 2, d_model = 192, d_ff = 512, max_seq = 128;
  static constexpr int vocab = 8192, vocab_padded = 8192;
  static constexpr double rope_theta = 10000.0, norm_eps = 1e-5;
};

/// An odd Llama for the test that a shape compiled on first use (train/instance_cache.hpp) trains
/// bitwise as the same shape compiled into the build: 3 layers, 5 query heads of 16 sharing one
/// key/value head (GQA 5:1), SwiGLU hidden 144, a 1999-token vocabulary padded to 2048 (Megatron's
/// --make-vocab-size-divisible-by 128), 24 positions. train_gpt's flags for it: --num-layers 3
/// --hidden-size 80 --num-attention-heads 5 --group-query-attention --num-query-groups 1
/// --ffn-hidden-size 144 --swiglu --normalization RMSNorm --position-embedding-type rope
/// --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 1999 --seq-length 24.
struct odd_gqa {
  static constexpr std::string_view name = "odd_gqa";
  static constexpr models::recipe arch = models::llama;
  static constexpr int n_layer = 3, n_head = 5, n_kv_head = 1, d_model = 80, d_ff = 144, max_seq = 24;
  static constexpr int vocab = 1999, vocab_padded = 2048;
  static constexpr double rope_theta = 10000.0, norm_eps = 1e-5;
};

/// A ~100M-parameter Llama: 12 layers, width 768, 12 query heads sharing 4 key/value heads,
/// SwiGLU hidden 2048, a 32000-token vocabulary (Llama 2's size), 1024 positions.
struct llama_100m {
  static constexpr std::string_view name = "llama_100m";
  static constexpr models::recipe arch = models::llama;
  static constexpr int n_layer = 12, n_head = 12, n_kv_head = 4, d_model = 768, d_ff = 2048, max_seq = 1024;
  static constexpr int vocab = 32000, vocab_padded = 32000;
  static constexpr double rope_theta = 10000.0, norm_eps = 1e-5;
};

/// Llama 2 7B (Touvron et al. 2023, "Llama 2", Table 1 / Hugging Face meta-llama/Llama-2-7b-hf
/// config.json): 32 layers, width 4096, 32 heads (no grouped-query attention), SwiGLU hidden
/// 11008, a 32000-token vocabulary, 4096 positions, untied LM head: 6.74B parameters. Planned
/// (examples/plan), not trained, by this build: its instances are plan-only (LOOM_PLAN_SESSIONS).
struct llama2_7b {
  static constexpr std::string_view name = "llama2_7b";
  static constexpr models::recipe arch = models::llama;
  static constexpr int n_layer = 32, n_head = 32, n_kv_head = 32, d_model = 4096, d_ff = 11008, max_seq = 4096;
  static constexpr int vocab = 32000, vocab_padded = 32000;
  static constexpr double rope_theta = 10000.0, norm_eps = 1e-5;
};

static_assert(model_config<tiny> && model_config<char_tiny> && model_config<quickstart> && model_config<bench_small> &&
              model_config<gpt2_small>);
static_assert(model_config<quickstart_bpe> && model_config<tiny_parallel> && model_config<tiny_untied>);
static_assert(model_config<odd_gqa> && model_config<llama_tiny> && model_config<llama_quickstart> && model_config<llama_100m> &&
              model_config<llama2_7b>);

}  // namespace loom::models
