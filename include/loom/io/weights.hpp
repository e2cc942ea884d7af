#pragma once
/// \file Saving and loading a loom::gpt's parameters as a safetensors file.
///
/// One tensor per row of the parameter table, under the table's name ("wte", "qkv_w", ...)
/// with its shape, in storage precision (F32 for fp32, BF16 / F16 for 16-bit storage; a 16-bit
/// model loads any float dtype, rounding); "__metadata__" records the model
/// config (name, n_layer, n_head, d_model, max_seq, vocab, vocab_padded, the recipe's name as
/// "arch") and the format version, so a file cannot be loaded into a model of another shape or
/// architecture (files without "arch" are GPT-2's).
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/core/error.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/nn/params.hpp>

namespace loom::io {

/// Metadata describing model config M (all values as decimal strings).
template <class M>
std::map<std::string, std::string> model_metadata() {
  return {{"format", "loom.weights.v1"},        {"model", std::string(M::name)},
          {"n_layer", std::to_string(M::n_layer)}, {"n_head", std::to_string(M::n_head)},
          {"d_model", std::to_string(M::d_model)}, {"max_seq", std::to_string(M::max_seq)},
          {"vocab", std::to_string(M::vocab)},     {"vocab_padded", std::to_string(M::vocab_padded)},
          {"arch", std::string(nn::arch_of<M>().name)}};
}

/// Writes every parameter of `model` (a loom::gpt on a host-accessible device) to `path`
/// atomically (temporary file, fsync, rename: an existing file is replaced only by a complete
/// one). `extra` adds metadata entries. Throws what safetensors_writer::write throws.
template <class G>
void save_weights(const G& model, const std::filesystem::path& path,
                  const std::map<std::string, std::string>& extra = {}) {
  safetensors_writer w;
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& spec = G::table[k];
    std::vector<std::int64_t> shape(spec.shape.begin(), spec.shape.begin() + spec.ndim);
    using T = typename G::storage_t;
    if constexpr (std::is_floating_point_v<T>)
      w.add(std::string(spec.name), shape, model.parameter(k).span());
    else  // bfloat16 / half storage: the raw 16-bit values, dtype BF16 / F16
      w.add_bytes(std::string(spec.name), std::is_same_v<T, Eigen::bfloat16> ? "BF16" : "F16", shape,
                  std::as_bytes(model.parameter(k).span()));
  }
  for (const auto& [k, v] : model_metadata<typename G::model>()) w.set_metadata(k, v);
  for (const auto& [k, v] : extra) w.set_metadata(k, v);
  w.write(path);
}

/// Loads parameters saved by save_weights into `model`. Throws loom::input_error when the
/// file is missing or corrupt, was saved for a different model config (naming both), or a
/// tensor is missing or has another shape.
template <class G>
void load_weights(G& model, const std::filesystem::path& path) {
  safetensors_reader r(path);
  using M = typename G::model;
  const auto& meta = r.metadata();
  for (const auto& [k, v] : model_metadata<M>()) {
    if (k == "model" || k == "format") continue;
    const auto it = meta.find(k);
    const std::string saved = it != meta.end() ? it->second : k == "arch" ? std::string("gpt2") : v;
    if (saved != v)
      throw input_error("weights file '" + path.string() + "' was saved for a model with " + k + " = " + saved +
                        ", but this model (" + std::string(M::name) + ") has " + k + " = " + v +
                        "; load it with the matching --model");
  }
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& spec = G::table[k];
    const std::string name(spec.name);
    if (!r.has(name))
      throw input_error("weights file '" + path.string() + "' has no tensor '" + name +
                        "'; it was not written by loom's save_weights or is truncated");
    const auto& info = r.info(name);
    const std::vector<std::int64_t> shape(spec.shape.begin(), spec.shape.begin() + spec.ndim);
    if (info.shape != shape)
      throw input_error("weights file '" + path.string() + "': tensor '" + name + "' has the wrong shape for model " +
                        std::string(M::name) + "; load it with the matching --model");
    using T = typename G::storage_t;
    if constexpr (std::is_floating_point_v<T>) {
      r.read_into(name, model.parameter(k).span());
    } else {  // 16-bit storage: read as float (from any float dtype), round to T
      const auto v = r.read<float>(name);
      auto dst = model.parameter(k);
      for (std::size_t i = 0; i < v.size(); ++i) dst[i] = T(v[i]);
    }
  }
}

}  // namespace loom::io
