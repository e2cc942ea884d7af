#pragma once
/// \file io::read_hf_config — a Hugging Face config.json as a models::model_spec.
///
/// model_type gpt2 (GPT2LMHeadModel: n_layer, n_head, n_embd, n_positions, vocab_size, n_inner)
/// and the Llama-shaped families whose every field the recipe expresses: llama
/// (LlamaForCausalLM), and mistral without a sliding window (MistralForCausalLM). Field names
/// and defaults are transformers' configuration classes (GPT2Config, LlamaConfig,
/// MistralConfig). Every field is either read, checked against the one value loom implements,
/// or known to be metadata (token ids, dtype, versions, dropout rates that train_gpt's
/// --dropout sets); any other field is refused by name, never ignored.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/models/spec.hpp>

namespace loom::io {

namespace detail {

/// Fields of every config.json that describe no part of the network: ids, dtypes, versions,
/// generation and task settings.
inline const std::set<std::string>& hf_metadata_fields() {
  static const std::set<std::string> f = {
      "_name_or_path", "architectures", "model_type", "torch_dtype", "transformers_version", "use_cache",
      "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "task_specific_params", "tokenizer_class",
      "return_dict", "output_hidden_states", "output_attentions", "torchscript", "id2label", "label2id",
      "problem_type", "prefix", "max_length", "do_sample", "temperature", "top_p", "top_k", "num_beams",
      "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
      "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx", "head_dim", "pretraining_tp",
      "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "activation_function",
      "hidden_act", "layer_norm_epsilon", "attention_bias", "mlp_bias", "rope_scaling", "sliding_window",
      "max_window_layers", "use_sliding_window", "tie_word_embeddings", "n_inner"};
  return f;
}

}  // namespace detail

/// The model_spec of Hugging Face config `j` (read from `where`, for messages). The vocabulary
/// is vocab_size, padded to `vocab_padded` when that is larger (0: unpadded). Throws
/// loom::input_error for an unsupported model_type, a missing field, or a field whose value
/// the recipe cannot express (naming the field and the value loom supports).
inline models::model_spec spec_from_hf_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw input_error(where + ": not a JSON object; pass a Hugging Face config.json");
  const std::string type = j.value("model_type", "");
  auto refuse = [&](const std::string& field, const std::string& why) -> void {
    throw input_error(where + ": field \"" + field + "\" " + why);
  };
  auto get_int = [&](const char* k) {
    if (!j.contains(k) || !j.at(k).is_number_integer()) refuse(k, "is missing or not an integer");
    return j.at(k).get<int>();
  };
  auto has_value = [&](const char* k) { return j.contains(k) && !j.at(k).is_null(); };
  models::model_spec s;
  if (type == "gpt2") {
    s.n_layer = get_int("n_layer"), s.n_head = get_int("n_head"), s.d_model = get_int("n_embd");
    s.max_seq = get_int("n_positions"), s.vocab = get_int("vocab_size");
    s.n_kv_head = s.n_head;
    s.d_ff = has_value("n_inner") ? get_int("n_inner") : 4 * s.d_model;
    const std::string act = j.value("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      refuse("activation_function", "is \"" + act + "\"; loom's GPT-2 MLP is GELU's tanh form (gelu_new)");
    if (j.contains("layer_norm_epsilon") && j.at("layer_norm_epsilon").get<double>() != 1e-5)
      refuse("layer_norm_epsilon", "is not 1e-5, the LayerNorm epsilon loom implements");
    if (!j.value("tie_word_embeddings", true)) refuse("tie_word_embeddings", "is false; GPT-2's head is tied");
    if (!j.value("scale_attn_weights", true)) refuse("scale_attn_weights", "is false; loom scales by 1/sqrt(head size)");
    for (const char* k : {"reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx"})
      if (j.value(k, false)) refuse(k, "is true; loom implements GPT-2's attention without it");
  } else if (type == "llama" || type == "mistral") {
    s.norm = models::norm_kind::rmsnorm, s.position = models::position_kind::rotary, s.mlp = models::mlp_kind::swiglu;
    s.linear_bias = false;
    s.n_layer = get_int("num_hidden_layers"), s.n_head = get_int("num_attention_heads"), s.d_model = get_int("hidden_size");
    s.n_kv_head = has_value("num_key_value_heads") ? get_int("num_key_value_heads") : s.n_head;
    s.d_ff = get_int("intermediate_size"), s.max_seq = get_int("max_position_embeddings"), s.vocab = get_int("vocab_size");
    s.rope_theta = j.value("rope_theta", 10000.0);
    s.norm_eps = j.value("rms_norm_eps", 1e-6);
    s.tied_head = j.value("tie_word_embeddings", false);
    const std::string act = j.value("hidden_act", "silu");
    if (act != "silu") refuse("hidden_act", "is \"" + act + "\"; loom's SwiGLU gates with silu");
    if (j.value("attention_bias", false)) refuse("attention_bias", "is true; loom's Llama recipe has no q/k/v/o biases");
    if (j.value("mlp_bias", false)) refuse("mlp_bias", "is true; loom's Llama recipe has no MLP biases");
    if (has_value("rope_scaling"))
      refuse("rope_scaling", "is set; loom implements plain rotary positions (rope_scaling null)");
    if (has_value("head_dim") && get_int("head_dim") * s.n_head != s.d_model)
      refuse("head_dim", "is not hidden_size / num_attention_heads; loom derives the head size from them");
    if (has_value("pretraining_tp") && get_int("pretraining_tp") != 1)
      refuse("pretraining_tp", "is not 1; it only changes how PyTorch slices the matmuls: set it to 1");
    if (type == "mistral" && has_value("sliding_window") && get_int("sliding_window") < s.max_seq)
      refuse("sliding_window", "is " + std::to_string(get_int("sliding_window")) +
                                   "; loom's attention is full causal (a window >= max_position_embeddings or null)");
  } else {
    throw input_error(where + ": model_type \"" + type + "\" is not one loom builds; it reads gpt2, llama and mistral "
                      "(without a sliding window)" + (type == "qwen2" ? " (qwen2 has q/k/v biases, which the recipe lacks)" : ""));
  }
  for (const auto& [k, v] : j.items()) {
    static const std::set<std::string> read = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size",
                                               "num_hidden_layers", "num_attention_heads", "hidden_size",
                                               "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                                               "rope_theta", "rms_norm_eps"};
    if (!read.count(k) && !detail::hf_metadata_fields().count(k))
      refuse(k, "is not a field loom knows for model_type " + type + "; it would be ignored, so the model would "
                "differ: remove it from the file if it does not change the model, else loom cannot train this model");
  }
  s.vocab_padded = s.vocab;
  s.name_recipe();
  s.name = s.derived_name();
  return s;
}

/// spec_from_hf_config of the file at `path` (a config.json, or a directory holding one).
/// Throws loom::input_error for a missing or unparsable file.
inline models::model_spec read_hf_config(std::filesystem::path path) {
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream in(path);
  if (!in) throw input_error("'" + path.string() + "' cannot be read; pass a Hugging Face config.json (or its directory)");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw input_error("'" + path.string() + "' is not valid JSON (" + e.what() + ")");
  }
  return spec_from_hf_config(j, path.string());
}

}  // namespace loom::io
