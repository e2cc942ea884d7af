#pragma once
/// \file An architecture as data: the recipe a decoder-only Transformer is built from.
///
/// A recipe names the block's parts (norm, position encoding, MLP, biases, tied head);
/// the sizes, including key/value heads and the MLP width, are the model config's
/// (models/configs.hpp). models::param_table generates the parameter table of (model, recipe, layout)
/// from it at compile time, and everything outside nn/ and models/ iterates that table. A model
/// config chooses its recipe with a member `static constexpr models::recipe arch = ...;`; a config
/// without one is GPT-2 (models::gpt2). A new architecture is a recipe value plus the kernels of any
/// new part.
///
/// It lives in models/, in namespace models, beside the configs that name it (models sits below
/// nn in the layers).
#include <string_view>

namespace loom::models {

/// The normalisation before attention, before the MLP and at the end of the stack.
enum class norm_kind : unsigned char {
  layernorm,  ///< LayerNorm with gain and bias (Ba et al. 2016; GPT-2)
  rmsnorm,    ///< RMSNorm with gain only (Zhang & Sennrich 2019; Llama)
};

/// How positions enter the model.
enum class position_kind : unsigned char {
  learned,  ///< a learned (max_seq, C) table added to the token embedding (GPT-2)
  rotary,   ///< rotary embeddings applied to q and k (Su et al. 2021; Llama)
};

/// The feed-forward block.
enum class mlp_kind : unsigned char {
  gelu,    ///< fc (C -> H), GELU(tanh), proj (H -> C) (GPT-2)
  swiglu,  ///< fc (C -> 2H: gate and up), silu(gate) * up, proj (H -> C) (Shazeer 2020; Llama)
};

/// A decoder-only Transformer architecture. Pre-norm blocks (norm -> attention -> residual,
/// norm -> MLP -> residual), a final norm and an LM head are common to every recipe.
struct recipe {
  std::string_view name;              ///< recorded in checkpoints and weight files
  norm_kind norm = norm_kind::layernorm;
  position_kind position = position_kind::learned;
  mlp_kind mlp = mlp_kind::gelu;
  bool linear_bias = true;            ///< the four linear layers of a block carry biases
  bool tied_head = true;              ///< the LM head is the token embedding (Press & Wolf 2017)
  /// Hugging Face architecture whose state dict the table's tensors map onto ("gpt2": row by
  /// row, through the table's hf_name; "llama": io/hf_llama.hpp splits the fused q/k/v and
  /// gate/up rows), or empty when no Hugging Face model has this recipe's tensors (export and
  /// import then refuse).
  std::string_view hf_model_type = {};
};

/// GPT-2 (Radford et al. 2019): LayerNorm, learned positions, GELU MLP, biases, tied head.
inline constexpr recipe gpt2{.name = "gpt2", .hf_model_type = "gpt2"};

/// GPT-2 without biases in its linear layers and with an LM head of its own (untied): the
/// second recipe, which proves that the table, not hand-written tensor lists, drives the
/// trainer, data parallelism, checkpoints and resharding.
inline constexpr recipe gpt2_untied_nobias{.name = "gpt2_untied_nobias", .linear_bias = false, .tied_head = false};

/// Llama (Touvron et al. 2023, "LLaMA", §2.2; Hugging Face's LlamaForCausalLM): RMSNorm,
/// rotary positions, a SwiGLU MLP, no biases, an LM head of its own. Grouped-query attention
/// (Ainslie et al. 2023) when the config's n_kv_head < n_head. Exports to and imports from
/// Hugging Face's LlamaForCausalLM (io/hf_llama.hpp).
inline constexpr recipe llama{.name = "llama",
                              .norm = norm_kind::rmsnorm,
                              .position = position_kind::rotary,
                              .mlp = mlp_kind::swiglu,
                              .linear_bias = false,
                              .tied_head = false,
                              .hf_model_type = "llama"};

/// The recipe of model config M: M::arch when M declares one, else models::gpt2.
template <class M>
consteval recipe arch_of() {
  if constexpr (requires { M::arch; }) return M::arch;
  else return gpt2;
}

}  // namespace loom::models
