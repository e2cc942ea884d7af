#pragma once
/// \file Export and import of Hugging Face GPT-2 weights (model.safetensors + config.json, as
/// transformers' GPT2LMHeadModel.save_pretrained writes them), from the parameter table's
/// Hugging Face names and orientations.
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

/// One tensor of a Hugging Face GPT-2 checkpoint (GPT2Model state dict, as in the hub's
/// model.safetensors: no "transformer." prefix).
struct gpt2_tensor {
  std::string name;                 ///< e.g. "h.3.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  ///< GPT-2's shape (Conv1D weights are (in, out))
  int param = 0;                    ///< loom table row
  int layer = -1;                   ///< layer index for per-layer tensors, else -1
  bool transposed = false;          ///< GPT-2 stores the transpose of loom's (out, in) weight
};

/// The tensors of a GPT-2 checkpoint for model M, in GPT-2's order (the table's forward order,
/// models::for_each_tensor): wte, wpe, h.{i}.(ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
/// mlp.c_proj).(weight, bias), ln_f; names and orientation from the table rows (hf_name,
/// hf_transposed). Vocabulary-sharded rows have M::vocab rows (loom's padding rows are not
/// exported). Source: transformers modeling_gpt2.py (GPT2Model, GPT2Attention, GPT2MLP, Conv1D).
/// Refused at compile time for a recipe without a GPT-2 equivalent (models::recipe::hf_model_type).
template <models::model_config M>
std::vector<gpt2_tensor> gpt2_tensors() {
  static_assert(models::arch_of<M>().hf_model_type == "gpt2",
                "Hugging Face GPT-2 export/import: this model's recipe has tensors GPT-2 does not (or lacks some "
                "of its tensors); export it with io::save_weights instead");
  constexpr auto t = models::param_table<M, parallel::layout<1, 1>>();
  std::vector<gpt2_tensor> out;
  models::for_each_tensor(t, M::n_layer, [&](std::size_t k, int layer) {
    const auto& s = t[k];
    const std::size_t first = s.per_layer ? 1 : 0;
    std::vector<std::int64_t> shape(s.global.begin() + first, s.global.begin() + s.ndim);
    if (s.rule == models::shard::vocab) shape[0] = M::vocab;
    if (s.hf_transposed) std::swap(shape[0], shape[1]);
    out.push_back({models::hf_name(s, layer), std::move(shape), int(k), layer, s.hf_transposed});
  });
  return out;
}

/// The config.json of a GPT-2 export of model M (transformers GPT2Config keys).
template <models::model_config M>
nlohmann::json gpt2_config() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", M::vocab},
          {"n_positions", M::max_seq},
          {"n_ctx", M::max_seq},
          {"n_embd", M::d_model},
          {"n_layer", M::n_layer},
          {"n_head", M::n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},  // tanh approximation, as loom's kernels
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", true},
          {"bos_token_id", M::vocab - 1},
          {"eos_token_id", M::vocab - 1},
          {"torch_dtype", "float32"},
          {"loom", {{"model", std::string(M::name)}, {"vocab_padded", M::vocab_padded}, {"version", std::string(library_version)}}}};
}

namespace detail {
/// Element (row, col) of a GPT-2 tensor t from loom's tensor data `src` of table row t.param
/// (layer slice already applied), both row-major.
template <class M, class T>
void gpt2_from_loom(const gpt2_tensor& t, const T* src, float* dst) {
  if (!t.transposed) {
    std::size_t n = 1;
    for (auto d : t.shape) n *= std::size_t(d);
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
    return;
  }
  const std::size_t in = std::size_t(t.shape[0]), outd = std::size_t(t.shape[1]);  // loom: (out, in)
  for (std::size_t o = 0; o < outd; ++o)
    for (std::size_t i = 0; i < in; ++i) dst[i * outd + o] = static_cast<float>(src[o * in + i]);
}
template <class G>
std::size_t loom_offset(const gpt2_tensor& t) {
  const auto& s = G::table[std::size_t(t.param)];
  return G::offsets[std::size_t(t.param)] + std::size_t(t.layer >= 0 ? t.layer : 0) * s.layer_size();
}
}  // namespace detail

/// Exports the parameters of `model` (a loom::nn::transformer on layout<1,1>) as a Hugging Face GPT-2
/// checkpoint: `<dir>/model.safetensors` (F32, GPT-2 names and Conv1D orientation, metadata
/// {"format": "pt"} as transformers requires) and `<dir>/config.json` (recording the XXH3-64 of
/// model.safetensors as "loom"."model_safetensors_xxh3_64", which import_gpt2 checks). Loads with
/// transformers.GPT2LMHeadModel.from_pretrained(dir). Each file is written atomically.
/// Errors: loom::input_error when `dir` cannot be created; loom::error when a write fails.
template <class G>
void export_gpt2(context<typename G::device>& ctx, const G& model, const std::filesystem::path& dir) {
  using M = typename G::model;
  using T = typename G::storage_t;
  static_assert(G::layout::tp == 1 && G::layout::pp == 1,
                "export_gpt2: export from one rank holding the whole model (gather the shards first)");
  detail::make_export_dir(dir);
  std::vector<T> staging;
  const T* host = detail::host_parameters(ctx, model.parameters().data(), G::num_parameters, staging);
  const auto tensors = gpt2_tensors<M>();
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& t : tensors) names.push_back(t.name), shapes.push_back(t.shape);
  detail::write_hf_export(
      dir, names, shapes,
      [&](std::size_t i, float* dst) { detail::gpt2_from_loom<M>(tensors[i], host + detail::loom_offset<G>(tensors[i]), dst); },
      gpt2_config<M>(), M::name);
}

/// Loads Hugging Face GPT-2 weights from `dir` (config.json and model.safetensors, as written
/// by export_gpt2 or transformers' save_pretrained; names may carry a "transformer." prefix;
/// F32, F16 or BF16) into `model`. loom's padding rows of wte (vocab..vocab_padded) are set to 0.
/// Extra tensors (attn.bias masks, a tied lm_head.weight) are ignored.
/// All-or-nothing: every check runs before `model` is written.
/// Errors (loom::input_error): a file is missing or corrupt (model.safetensors fails the
/// checksum config.json records, when it records one, or holds a NaN or infinite weight);
/// config.json describes another
/// shape (naming the key and both values), another activation or LayerNorm epsilon; a tensor is
/// missing or has the wrong shape; lm_head.weight differs from wte.weight (an untied head,
/// which loom's GPT does not have).
template <class G>
void import_gpt2(context<typename G::device>& ctx, G& model, const std::filesystem::path& dir) {
  using M = typename G::model;
  using T = typename G::storage_t;
  static_assert(G::layout::tp == 1 && G::layout::pp == 1, "import_gpt2: import into one rank holding the whole model");
  const auto cpath = dir / "config.json";
  const nlohmann::json cfg = detail::read_hf_config(dir, "GPT-2");
  if (cfg.contains("model_type") && cfg["model_type"] != "gpt2")
    throw input_error("'" + cpath.string() + "' describes a " + cfg["model_type"].dump() + " model, not gpt2; "
                      "choose a --model of that architecture (loom imports GPT-2 and Llama checkpoints)");
  detail::check_hf_sizes(cfg, dir,
                         {{"n_layer", M::n_layer}, {"n_head", M::n_head}, {"n_embd", M::d_model},
                          {"n_positions", M::max_seq}, {"vocab_size", M::vocab}},
                         M::name, "GPT-2");
  const std::string act = detail::string_or(cfg, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw input_error("'" + cpath.string() + "' uses activation " + act + "; loom's GPT uses the tanh GELU (gelu_new)");
  const auto eps_it = cfg.find("layer_norm_epsilon");
  if (const double e = eps_it != cfg.end() && eps_it->is_number() ? eps_it->get<double>() : 1e-5; std::abs(e - 1e-5) > 1e-12)
    throw input_error("'" + cpath.string() + "' has layer_norm_epsilon " + std::to_string(e) + "; loom's LayerNorm uses 1e-5");
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null() && cfg["n_inner"] != 4 * M::d_model)
    throw input_error("'" + cpath.string() + "' has n_inner " + cfg["n_inner"].dump() + "; loom's MLP is 4*n_embd wide");

  detail::check_hf_weights_checksum(dir, cfg);
  const safetensors_reader r(dir / "model.safetensors");
  auto key_of = [&](const std::string& name) -> std::string {
    if (r.has(name)) return name;
    if (r.has("transformer." + name)) return "transformer." + name;
    throw input_error("'" + r.path().string() + "' has no tensor '" + name + "'; it is not a complete GPT-2 checkpoint");
  };
  const auto tensors = gpt2_tensors<M>();
  for (const auto& t : tensors) {
    const auto& info = r.info(key_of(t.name));
    if (info.shape != t.shape)
      throw input_error("tensor '" + info.name + "' in '" + r.path().string() + "' has shape " +
                        detail::shape_string(info.shape) + ", GPT-2 " + std::string(M::name) + " needs " +
                        detail::shape_string(t.shape) + "; choose the matching --model");
    if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
      throw input_error("tensor '" + info.name + "' has dtype " + info.dtype + "; GPT-2 weights are F32, F16 or BF16");
  }
  if (r.has("lm_head.weight") && r.info("lm_head.weight").shape == std::vector<std::int64_t>{M::vocab, M::d_model}) {
    const auto head = r.read<float>("lm_head.weight"), wte = r.read<float>(key_of("wte.weight"));
    if (head != wte)
      throw input_error("'" + r.path().string() + "' has an lm_head.weight different from wte.weight (an untied LM "
                        "head); loom's GPT ties the head to the token embedding");
  }
  std::vector<T> host(G::num_parameters, T(0));
  std::vector<float> buf;
  for (const auto& t : tensors) {
    buf.resize(r.info(key_of(t.name)).numel());
    r.read_into(key_of(t.name), std::span<float>(buf));
    detail::check_finite_tensor(buf, key_of(t.name), r.path());
    T* dst = host.data() + detail::loom_offset<G>(t);
    if (!t.transposed) {
      for (std::size_t i = 0; i < buf.size(); ++i) dst[i] = static_cast<T>(buf[i]);
    } else {
      const std::size_t in = std::size_t(t.shape[0]), outd = std::size_t(t.shape[1]);
      for (std::size_t o = 0; o < outd; ++o)
        for (std::size_t i = 0; i < in; ++i) dst[o * in + i] = static_cast<T>(buf[i * outd + o]);
    }
  }
  G::device::copy_to_device(model.parameters().data(), host.data(), model.parameters().bytes(), ctx.stream);
  ctx.synchronize();
}

}  // namespace loom::io
