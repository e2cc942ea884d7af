#pragma once
/// \file Export and import of Hugging Face Llama weights (model.safetensors + config.json, as
/// transformers' LlamaForCausalLM.save_pretrained writes them) for models of the models::llama recipe.
/// Source: transformers modeling_llama.py (LlamaForCausalLM, LlamaAttention, LlamaMLP) and
/// configuration_llama.py (LlamaConfig). Hugging Face's q_proj/k_proj already use the
/// rotate-half RoPE convention loom computes, so no weight is permuted.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/core/device.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>
#include <loom/io/detail/hf_files.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/models/configs.hpp>
#include <loom/models/params.hpp>
#include <loom/core/layout.hpp>

namespace loom::io {

/// One tensor of a Hugging Face Llama checkpoint: rows [row0, row0 + shape[0]) of loom table row
/// `param` (layer `layer`'s slice for per-layer rows), all columns. loom fuses q/k/v into qkv_w
/// and gate/up into fc_w; Hugging Face keeps them apart.
struct llama_tensor {
  std::string name;                 ///< e.g. "model.layers.3.self_attn.k_proj.weight"
  std::vector<std::int64_t> shape;  ///< (rows, cols) or (cols) for norm gains
  int param = 0;                    ///< loom table row
  int layer = -1;                   ///< layer index for per-layer tensors, else -1
  std::size_t row0 = 0;             ///< first row inside loom's tensor (layer slice)
};

/// The tensors of a Llama checkpoint for model M (LlamaForCausalLM state dict), in Hugging Face's
/// order: model.embed_tokens, per layer input_layernorm, self_attn.(q,k,v,o)_proj,
/// post_attention_layernorm, mlp.(gate,up,down)_proj, then model.norm and lm_head. The embedding
/// and the head have M::vocab rows (loom's padding rows are not exported).
template <models::model_config M>
std::vector<llama_tensor> llama_tensors() {
  static_assert(models::arch_of<M>().hf_model_type == "llama",
                "Hugging Face Llama export/import: this model's recipe is not models::llama; export it with "
                "io::save_weights instead");
  constexpr long C = M::d_model, NH = M::n_head, KV = models::kv_heads_of<M>(), HD = C / NH, H = models::mlp_hidden_of<M>();
  auto row = [](models::role r) { return models::rows_by_role<M>[std::size_t(r)]; };
  std::vector<llama_tensor> out;
  out.push_back({"model.embed_tokens.weight", {M::vocab, C}, row(models::role::wte), -1, 0});
  for (int l = 0; l < M::n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {C}, row(models::role::ln1_w), l, 0});
    out.push_back({p + "self_attn.q_proj.weight", {NH * HD, C}, row(models::role::qkv_w), l, 0});
    out.push_back({p + "self_attn.k_proj.weight", {KV * HD, C}, row(models::role::qkv_w), l, std::size_t(NH * HD)});
    out.push_back({p + "self_attn.v_proj.weight", {KV * HD, C}, row(models::role::qkv_w), l, std::size_t((NH + KV) * HD)});
    out.push_back({p + "self_attn.o_proj.weight", {C, C}, row(models::role::attproj_w), l, 0});
    out.push_back({p + "post_attention_layernorm.weight", {C}, row(models::role::ln2_w), l, 0});
    out.push_back({p + "mlp.gate_proj.weight", {H, C}, row(models::role::fc_w), l, 0});
    out.push_back({p + "mlp.up_proj.weight", {H, C}, row(models::role::fc_w), l, std::size_t(H)});
    out.push_back({p + "mlp.down_proj.weight", {C, H}, row(models::role::fcproj_w), l, 0});
  }
  out.push_back({"model.norm.weight", {C}, row(models::role::lnf_w), -1, 0});
  out.push_back({"lm_head.weight", {M::vocab, C}, row(models::role::lm_head), -1, 0});
  return out;
}

/// The config.json of a Llama export of model M (transformers LlamaConfig keys).
template <models::model_config M>
nlohmann::json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", M::vocab},
          {"hidden_size", M::d_model},
          {"intermediate_size", models::mlp_hidden_of<M>()},
          {"num_hidden_layers", M::n_layer},
          {"num_attention_heads", M::n_head},
          {"num_key_value_heads", models::kv_heads_of<M>()},
          {"head_dim", M::d_model / M::n_head},
          {"max_position_embeddings", M::max_seq},
          {"hidden_act", "silu"},
          {"rms_norm_eps", models::norm_eps_of<M>()},
          {"rope_theta", models::rope_theta_of<M>()},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"},
          {"loom", {{"model", std::string(M::name)}, {"vocab_padded", M::vocab_padded}, {"version", std::string(library_version)}}}};
}

namespace detail {
template <class G>
std::size_t llama_offset(const llama_tensor& t) {
  const auto& s = G::table[std::size_t(t.param)];
  const std::size_t cols = s.ndim == 1 || (s.per_layer && s.ndim == 2) ? 1 : std::size_t(s.global[s.ndim - 1]);
  return G::offsets[std::size_t(t.param)] + std::size_t(t.layer >= 0 ? t.layer : 0) * s.layer_size() + t.row0 * cols;
}
inline std::size_t numel(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}
}  // namespace detail

/// Exports the parameters of `model` (an nn::transformer of the models::llama recipe on layout<1,1>)
/// as a Hugging Face Llama checkpoint: `<dir>/model.safetensors` (F32, LlamaForCausalLM names,
/// metadata {"format": "pt"}) and `<dir>/config.json` (LlamaConfig, recording the XXH3-64 of
/// model.safetensors as "loom"."model_safetensors_xxh3_64", which import_llama checks). Loads with
/// transformers.LlamaForCausalLM.from_pretrained(dir). Each file is written atomically.
/// Errors: loom::input_error when `dir` cannot be created; loom::error when a write fails.
template <class G>
void export_llama(context<typename G::device>& ctx, const G& model, const std::filesystem::path& dir) {
  using M = typename G::model;
  using T = typename G::storage_t;
  static_assert(G::layout::tp == 1 && G::layout::pp == 1,
                "export_llama: export from one rank holding the whole model (gather the shards first)");
  detail::make_export_dir(dir);
  std::vector<T> staging;
  const T* host = detail::host_parameters(ctx, model.parameters().data(), G::num_parameters, staging);
  const auto tensors = llama_tensors<M>();
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& t : tensors) names.push_back(t.name), shapes.push_back(t.shape);
  detail::write_hf_export(
      dir, names, shapes,
      [&](std::size_t i, float* dst) {
        const T* src = host + detail::llama_offset<G>(tensors[i]);
        for (std::size_t j = 0, n = detail::numel(tensors[i].shape); j < n; ++j) dst[j] = static_cast<float>(src[j]);
      },
      llama_config<M>(), M::name);
}

/// Loads Hugging Face Llama weights from `dir` (config.json and model.safetensors, as written by
/// export_llama or transformers' save_pretrained; F32, F16 or BF16) into `model`. loom's padding
/// rows (vocab..vocab_padded) of the embedding and the head are set to 0. Extra tensors
/// (rotary_emb.inv_freq of older exports) are ignored. All-or-nothing: every check runs before
/// `model` is written.
/// Errors (loom::input_error): a file is missing or corrupt (fails the checksum config.json
/// records, holds a NaN or infinite weight); config.json is not a Llama config or describes
/// another shape (naming the key and both values), another activation, RMSNorm epsilon, rotary
/// base or rotary scaling, biases or a tied head; a tensor is missing or has the wrong shape.
template <class G>
void import_llama(context<typename G::device>& ctx, G& model, const std::filesystem::path& dir) {
  using M = typename G::model;
  using T = typename G::storage_t;
  static_assert(G::layout::tp == 1 && G::layout::pp == 1, "import_llama: import into one rank holding the whole model");
  const auto cpath = dir / "config.json";
  const nlohmann::json cfg = detail::read_hf_config(dir, "Llama");
  const std::string where = "'" + cpath.string() + "'";
  if (cfg.value("model_type", std::string()) != "llama")
    throw input_error(where + " describes a " + (cfg.contains("model_type") ? cfg["model_type"].dump() : "model without model_type") +
                      ", not llama; choose a --model of that architecture");
  detail::check_hf_sizes(cfg, dir,
                         {{"num_hidden_layers", M::n_layer},
                          {"num_attention_heads", M::n_head},
                          {"hidden_size", M::d_model},
                          {"intermediate_size", models::mlp_hidden_of<M>()},
                          {"vocab_size", M::vocab},
                          {"num_key_value_heads", models::kv_heads_of<M>()}},
                         M::name, "Llama");
  if (const auto f = cfg.find("max_position_embeddings"); f != cfg.end() && f->is_number_integer() &&
                                                          json_integer<long>(*f) < long(M::max_seq))
    throw input_error(where + " has max_position_embeddings " + f->dump() + ", fewer than model " + std::string(M::name) +
                      "'s " + std::to_string(M::max_seq) + " positions");
  auto number = [&](const char* key, double dflt) {
    const auto f = cfg.find(key);
    return f != cfg.end() && f->is_number() ? f->get<double>() : dflt;
  };
  const double eps = number("rms_norm_eps", 1e-6), theta = number("rope_theta", 10000.0);
  if (std::abs(eps - models::norm_eps_of<M>()) > 1e-12 * models::norm_eps_of<M>())
    throw input_error(where + " has rms_norm_eps " + std::to_string(eps) + " but model " + std::string(M::name) + " uses " +
                      std::to_string(models::norm_eps_of<M>()) + "; choose a config with that epsilon");
  if (std::abs(theta - models::rope_theta_of<M>()) > 1e-9 * models::rope_theta_of<M>())
    throw input_error(where + " has rope_theta " + std::to_string(theta) + " but model " + std::string(M::name) + " uses " +
                      std::to_string(models::rope_theta_of<M>()) + "; choose a config with that rotary base");
  if (const auto f = cfg.find("rope_scaling"); f != cfg.end() && !f->is_null())
    throw input_error(where + " asks for rope_scaling " + f->dump() + "; loom computes plain RoPE only");
  if (detail::string_or(cfg, "hidden_act", "silu") != "silu")
    throw input_error(where + " uses activation " + detail::string_or(cfg, "hidden_act", "") + "; loom's Llama uses SwiGLU (silu)");
  for (const char* key : {"attention_bias", "mlp_bias", "tie_word_embeddings"})
    if (const auto f = cfg.find(key); f != cfg.end() && f->is_boolean() && f->get<bool>())
      throw input_error(where + " has " + key + " = true; loom's Llama has no biases and an untied LM head");

  detail::check_hf_weights_checksum(dir, cfg);
  const safetensors_reader r(dir / "model.safetensors");
  const auto tensors = llama_tensors<M>();
  for (const auto& t : tensors) {
    if (!r.has(t.name))
      throw input_error("'" + r.path().string() + "' has no tensor '" + t.name + "'; it is not a complete Llama checkpoint");
    const auto& info = r.info(t.name);
    if (info.shape != t.shape)
      throw input_error("tensor '" + t.name + "' in '" + r.path().string() + "' has shape " +
                        detail::shape_string(info.shape) + ", Llama " + std::string(M::name) + " needs " +
                        detail::shape_string(t.shape) + "; choose the matching --model");
    if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
      throw input_error("tensor '" + t.name + "' has dtype " + info.dtype + "; Llama weights are F32, F16 or BF16");
  }
  std::vector<T> host(G::num_parameters, T(0));
  std::vector<float> buf;
  for (const auto& t : tensors) {
    buf.resize(r.info(t.name).numel());
    r.read_into(t.name, std::span<float>(buf));
    detail::check_finite_tensor(buf, t.name, r.path());
    T* dst = host.data() + detail::llama_offset<G>(t);
    for (std::size_t i = 0; i < buf.size(); ++i) dst[i] = static_cast<T>(buf[i]);
  }
  G::device::copy_to_device(model.parameters().data(), host.data(), model.parameters().bytes(), ctx.stream);
  ctx.synchronize();
}

}  // namespace loom::io
