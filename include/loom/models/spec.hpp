#pragma once
/// \file models::model_spec — a model's whole shape and recipe as run-time values.
///
/// A compile-time model config (models/configs.hpp) is a type; a model_spec is the same
/// information as data, so a shape can come from Megatron-LM's flags, a Hugging Face
/// config.json or a preset at run time. train/instance_source.hpp turns a spec back into a
/// config type inside a generated translation unit (to_cpp()), which train/instance_cache.hpp
/// compiles on first use. Everything that is arithmetic on a shape (facts(), the parameter
/// count, the layout's divisibility) needs no compilation.
///
///   auto s = models::spec_of<models::quickstart>();      // a preset
///   auto h = models::spec_from_hf_config(json, "config.json");  // or Hugging Face's file
///   if (auto why = s.problem(); !why.empty()) throw input_error(why);
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/models/registry.hpp>

namespace loom::models {

/// A decoder-only Transformer's shape and recipe (models::recipe's parts, models/recipe.hpp), as
/// values. Field meanings are models/configs.hpp's; `arch` is the recipe's name as recorded in
/// weights and checkpoints ("gpt2", "llama", "gpt2_untied_nobias", or a composed name for
/// another combination of parts), `hf_model_type` the Hugging Face architecture its tensors
/// map onto ("" when none).
struct model_spec {
  std::string name;
  std::string arch = "gpt2";
  models::norm_kind norm = models::norm_kind::layernorm;
  models::position_kind position = models::position_kind::learned;
  models::mlp_kind mlp = models::mlp_kind::gelu;
  bool linear_bias = true, tied_head = true;
  std::string hf_model_type = "gpt2";
  int n_layer = 0, n_head = 0, n_kv_head = 0, d_model = 0, d_ff = 0, max_seq = 0, vocab = 0, vocab_padded = 0;
  double rope_theta = 10000.0, norm_eps = 1e-5;

  /// The sizes as model_facts; its name and arch view this spec's strings (keep it alive).
  model_facts facts() const noexcept {
    return {name, n_layer, n_head, d_model, vocab, vocab_padded, max_seq, d_ff, n_kv_head, arch};
  }

  /// Parameters of the whole model (models::parameter_count's arithmetic: embeddings, blocks, final
  /// norm, an untied head), counting the padded vocabulary rows.
  std::int64_t parameter_count() const noexcept {
    const std::int64_t C = d_model, H = d_ff, V = vocab_padded, hs = C / (n_head ? n_head : 1);
    const std::int64_t kv = 2 * std::int64_t(n_kv_head) * hs;
    const bool bias = linear_bias, ln = norm == models::norm_kind::layernorm;
    const std::int64_t norm_p = ln ? 2 * C : C;
    const std::int64_t mlp_in = mlp == models::mlp_kind::swiglu ? 2 * H : H;
    std::int64_t block = 2 * norm_p + C * (C + kv) + C * C + C * mlp_in + H * C;
    if (bias) block += (C + kv) + C + mlp_in + C;
    std::int64_t n = V * C + n_layer * block + norm_p;
    if (position == models::position_kind::learned) n += std::int64_t(max_seq) * C;
    if (!tied_head) n += V * C;
    return n;
  }

  /// "" when the spec describes a model loom can build, else the first problem as a sentence
  /// naming the flag that fixes it (Megatron-LM's names).
  std::string problem() const {
    auto pos = [](const char* flag, int v) {
      return std::string(flag) + " " + std::to_string(v) + " must be >= 1";
    };
    if (n_layer < 1) return pos("--num-layers", n_layer);
    if (d_model < 1) return pos("--hidden-size", d_model);
    if (n_head < 1) return pos("--num-attention-heads", n_head);
    if (n_kv_head < 1) return pos("--num-query-groups", n_kv_head);
    if (d_ff < 1) return pos("--ffn-hidden-size", d_ff);
    if (max_seq < 1) return pos("--max-position-embeddings", max_seq);
    if (vocab < 1) return pos("--vocab-size", vocab);
    if (d_model % n_head)
      return "--hidden-size " + std::to_string(d_model) + " is not divisible by --num-attention-heads " +
             std::to_string(n_head) + "; choose a hidden size that is a multiple of the heads";
    if (n_head % n_kv_head)
      return "--num-attention-heads " + std::to_string(n_head) + " is not divisible by --num-query-groups " +
             std::to_string(n_kv_head) + "; choose query groups dividing the heads";
    if (position == models::position_kind::rotary && (d_model / n_head) % 2)
      return "rotary positions need an even head size, got --hidden-size " + std::to_string(d_model) + " / " +
             std::to_string(n_head) + " heads = " + std::to_string(d_model / n_head) + "; change either";
    if (vocab_padded < vocab)
      return "the padded vocabulary " + std::to_string(vocab_padded) + " is smaller than the vocabulary " +
             std::to_string(vocab);
    if (!(rope_theta > 0)) return "--rotary-base must be > 0";
    if (!(norm_eps > 0)) return "--norm-epsilon must be > 0";
    if (norm == models::norm_kind::layernorm && norm_eps != 1e-5)
      return "--norm-epsilon " + std::to_string(norm_eps) + " with LayerNorm: loom's LayerNorm uses 1e-5 (GPT-2's); "
             "pass --norm-epsilon 1e-5, or --normalization RMSNorm";
    return {};
  }

  /// The recipe's name for these parts: gpt2, gpt2_untied_nobias, llama when the parts are
  /// theirs, else the parts joined ("rmsnorm_rotary_gelu_bias_tied").
  std::string recipe_name() const {
    const bool ln = norm == models::norm_kind::layernorm, learned = position == models::position_kind::learned,
               gelu = mlp == models::mlp_kind::gelu;
    if (ln && learned && gelu && linear_bias && tied_head) return "gpt2";
    if (ln && learned && gelu && !linear_bias && !tied_head) return "gpt2_untied_nobias";
    if (!ln && !learned && !gelu && !linear_bias && !tied_head) return "llama";
    return std::string(ln ? "layernorm" : "rmsnorm") + (learned ? "_learned" : "_rotary") + (gelu ? "_gelu" : "_swiglu") +
           (linear_bias ? "_bias" : "_nobias") + (tied_head ? "_tied" : "_untied");
  }

  /// Sets arch and hf_model_type from the parts (recipe_name(); Hugging Face's gpt2 and llama
  /// have exactly the gpt2 and llama parts).
  void name_recipe() {
    arch = recipe_name();
    hf_model_type = arch == "gpt2" || arch == "llama" ? arch : "";
  }

  /// A readable name for a shape without one: "llama_L16_C2048_H16_KV4_F5632_V32000_S2048".
  std::string derived_name() const {
    std::string s = arch + "_L" + std::to_string(n_layer) + "_C" + std::to_string(d_model) + "_H" + std::to_string(n_head);
    if (n_kv_head != n_head) s += "_KV" + std::to_string(n_kv_head);
    return s + "_F" + std::to_string(d_ff) + "_V" + std::to_string(vocab) +
           (vocab_padded != vocab ? "p" + std::to_string(vocab_padded) : "") + "_S" + std::to_string(max_seq);
  }

  /// The spec as JSON (weights files record it as metadata "model_spec"; from_json reads it).
  nlohmann::json to_json() const {
    return {{"name", name},           {"arch", arch},
            {"norm", norm == models::norm_kind::layernorm ? "layernorm" : "rmsnorm"},
            {"position", position == models::position_kind::learned ? "learned" : "rotary"},
            {"mlp", mlp == models::mlp_kind::gelu ? "gelu" : "swiglu"},
            {"linear_bias", linear_bias}, {"tied_head", tied_head},  {"hf_model_type", hf_model_type},
            {"n_layer", n_layer},         {"n_head", n_head},        {"n_kv_head", n_kv_head},
            {"d_model", d_model},         {"d_ff", d_ff},            {"max_seq", max_seq},
            {"vocab", vocab},             {"vocab_padded", vocab_padded},
            {"rope_theta", rope_theta},   {"norm_eps", norm_eps}};
  }
  /// Reads to_json()'s form; throws loom::input_error naming a missing or malformed field.
  static model_spec from_json(const nlohmann::json& j, const std::string& where) {
    model_spec s;
    try {
      s.name = j.at("name").get<std::string>();
      s.arch = j.at("arch").get<std::string>();
      s.norm = j.at("norm").get<std::string>() == "rmsnorm" ? models::norm_kind::rmsnorm : models::norm_kind::layernorm;
      s.position = j.at("position").get<std::string>() == "rotary" ? models::position_kind::rotary : models::position_kind::learned;
      s.mlp = j.at("mlp").get<std::string>() == "swiglu" ? models::mlp_kind::swiglu : models::mlp_kind::gelu;
      s.linear_bias = j.at("linear_bias").get<bool>();
      s.tied_head = j.at("tied_head").get<bool>();
      s.hf_model_type = j.at("hf_model_type").get<std::string>();
      for (auto [k, p] : {std::pair{"n_layer", &s.n_layer}, {"n_head", &s.n_head}, {"n_kv_head", &s.n_kv_head},
                          {"d_model", &s.d_model}, {"d_ff", &s.d_ff}, {"max_seq", &s.max_seq}, {"vocab", &s.vocab},
                          {"vocab_padded", &s.vocab_padded}})
        *p = j.at(k).get<int>();
      s.rope_theta = j.at("rope_theta").get<double>();
      s.norm_eps = j.at("norm_eps").get<double>();
    } catch (const nlohmann::json::exception& e) {
      throw input_error(where + ": not a loom model spec (" + e.what() + ")");
    }
    return s;
  }

  /// A compile-time config type for this spec named `ident` (models/configs.hpp's form), as
  /// C++ source: "struct ident { static constexpr ... };". Exact: doubles in %a (hexadecimal).
  std::string to_cpp(std::string_view ident) const {
    auto hex = [](double v) {
      char b[64];
      std::snprintf(b, sizeof b, "%a", v);
      return std::string(b);
    };
    auto q = [](const std::string& s) {  // names are [A-Za-z0-9_.-]: see valid_name
      return "\"" + s + "\"";
    };
    const std::string n = "loom::models::";
    return "struct " + std::string(ident) + " {\n" +
           "  static constexpr std::string_view name = " + q(name) + ";\n" +
           "  static constexpr " + n + "recipe arch{.name = " + q(arch) +
           ", .norm = " + n + (norm == models::norm_kind::layernorm ? "norm_kind::layernorm" : "norm_kind::rmsnorm") +
           ", .position = " + n + (position == models::position_kind::learned ? "position_kind::learned" : "position_kind::rotary") +
           ", .mlp = " + n + (mlp == models::mlp_kind::gelu ? "mlp_kind::gelu" : "mlp_kind::swiglu") +
           ", .linear_bias = " + (linear_bias ? "true" : "false") + ", .tied_head = " + (tied_head ? "true" : "false") +
           ", .hf_model_type = " + q(hf_model_type) + "};\n" +
           "  static constexpr int n_layer = " + std::to_string(n_layer) + ", n_head = " + std::to_string(n_head) +
           ", n_kv_head = " + std::to_string(n_kv_head) + ", d_model = " + std::to_string(d_model) +
           ", d_ff = " + std::to_string(d_ff) + ", max_seq = " + std::to_string(max_seq) + ";\n" +
           "  static constexpr int vocab = " + std::to_string(vocab) + ", vocab_padded = " + std::to_string(vocab_padded) +
           ";\n" + "  static constexpr double rope_theta = " + hex(rope_theta) + ", norm_eps = " + hex(norm_eps) + ";\n};\n";
  }
};

/// Whether `s` is usable as a model name in files and generated code: 1-96 characters of
/// [A-Za-z0-9_.-].
inline bool valid_name(std::string_view s) noexcept {
  if (s.empty() || s.size() > 96) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
      return false;
  return true;
}

/// The spec of compile-time config M.
template <model_config M>
model_spec spec_of() {
  constexpr models::recipe r = models::arch_of<M>();
  model_spec s;
  s.name = std::string(M::name);
  s.arch = std::string(r.name);
  s.norm = r.norm, s.position = r.position, s.mlp = r.mlp, s.linear_bias = r.linear_bias, s.tied_head = r.tied_head;
  s.hf_model_type = std::string(r.hf_model_type);
  s.n_layer = M::n_layer, s.n_head = M::n_head, s.n_kv_head = kv_heads_of<M>(), s.d_model = M::d_model;
  s.d_ff = mlp_hidden_of<M>(), s.max_seq = M::max_seq, s.vocab = M::vocab, s.vocab_padded = M::vocab_padded;
  s.rope_theta = rope_theta_of<M>(), s.norm_eps = norm_eps_of<M>();
  return s;
}

/// The model configs a run can name with --model, smallest first: models::named_models, then
/// llama_100m (bench_step's), llama2_7b (planned) and odd_gqa (a test shape).
inline std::vector<model_spec> preset_specs() {
  return {spec_of<char_tiny>(),   spec_of<quickstart>(), spec_of<llama_quickstart>(), spec_of<quickstart_bpe>(),
          spec_of<bench_small>(), spec_of<gpt2_small>(), spec_of<llama_100m>(),       spec_of<llama2_7b>(),
          spec_of<odd_gqa>()};
}

/// The spec of the preset called `name` (preset_specs()), or nullopt.
inline std::optional<model_spec> preset_spec(std::string_view name) {
  for (auto& s : preset_specs())
    if (s.name == name) return s;
  return std::nullopt;
}

/// `n` rounded up to a multiple of `m` (m >= 1): Megatron-LM's vocabulary padding
/// (--make-vocab-size-divisible-by, times the tensor-parallel size).
constexpr int round_up(int n, int m) noexcept { return (n + m - 1) / m * m; }

}  // namespace loom::models
