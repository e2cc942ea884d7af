#pragma once
/// \file Saving and loading a loom::nn::transformer's parameters as a safetensors file.
///
/// One tensor per row of the parameter table, under the table's name ("wte", "qkv_w", ...)
/// with its shape, in storage precision (F32 for fp32, BF16 / F16 for 16-bit storage; a 16-bit
/// model loads any float dtype, rounding); "__metadata__" records the model
/// config (name, n_layer, n_head, d_model, max_seq, vocab, vocab_padded, the recipe's name as
/// "arch", and the whole models::model_spec as JSON, "model_spec", from which a program that
/// has no compiled instance of the shape compiles one) and the format version, so a file cannot be loaded into a model of another shape or
/// architecture (files without "arch" are GPT-2's), and "xxh3_64", the checksum of everything
/// else in the file (weights_checksum), so a flipped bit in a weight or in the metadata is an
/// error when the file is loaded, not a different model (files without it load unchecked).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/core/error.hpp>
#include <loom/core/checksum.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/models/spec.hpp>
#include <loom/models/params.hpp>

namespace loom::io {

/// Metadata describing model config M (all values as decimal strings).
template <class M>
std::map<std::string, std::string> model_metadata() {
  return {{"format", "loom.weights.v1"},        {"model", std::string(M::name)},
          {"n_layer", std::to_string(M::n_layer)}, {"n_head", std::to_string(M::n_head)},
          {"d_model", std::to_string(M::d_model)}, {"max_seq", std::to_string(M::max_seq)},
          {"vocab", std::to_string(M::vocab)},     {"vocab_padded", std::to_string(M::vocab_padded)},
          {"arch", std::string(models::arch_of<M>().name)}, {"model_spec", models::spec_of<M>().to_json().dump()}};
}

namespace detail {
/// One tensor as weights_checksum sees it.
struct checksummed_tensor {
  std::string_view name, dtype;
  const std::vector<std::int64_t>* shape;
  std::span<const std::byte> bytes;
};

/// weights_checksum of `meta` and `tensors` (any order; sorted here by name).
inline std::string weights_checksum(const std::map<std::string, std::string>& meta,
                                    std::vector<checksummed_tensor> tensors) {
  xxh3_stream sum;
  auto put = [&](const void* p, std::size_t n) { sum.update(p, n); };
  auto put_string = [&](std::string_view v) {  // with a NUL after it: the fields stay unambiguous
    put(v.data(), v.size());
    put("", 1);
  };
  for (const auto& [k, v] : meta) {
    if (k == "xxh3_64") continue;
    put_string(k);
    put_string(v);
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& t : tensors) {
    put_string(t.name);
    put_string(t.dtype);
    const std::int64_t rank = std::int64_t(t.shape->size());
    put(&rank, sizeof rank);
    put(t.shape->data(), t.shape->size() * sizeof(std::int64_t));
    put(t.bytes.data(), t.bytes.size());
  }
  return sum.hex();
}
}  // namespace detail

/// The checksum a weights file records under "__metadata__"."xxh3_64": XXH3-64 over the
/// metadata entries other than "xxh3_64" (key, value; in key order), then every tensor in name
/// order (name, dtype, rank, dimensions as int64, data bytes). It covers the file's content, not
/// its layout: the header's whitespace and the data order do not change it. Cost: one pass over
/// the data (XXH3, several GB/s).
inline std::string weights_checksum(const safetensors_reader& r) {
  std::vector<detail::checksummed_tensor> ts;
  for (const auto& t : r.tensors()) ts.push_back({t.name, t.dtype, &t.shape, r.bytes(t.name)});
  return detail::weights_checksum(r.metadata(), std::move(ts));
}

/// Checks the "xxh3_64" a weights file records (weights_checksum); returns false when it
/// records none (a file from before it was recorded, or from another writer). Throws
/// loom::input_error naming the file when the content does not match.
inline bool verify_weights_checksum(const safetensors_reader& r) {
  const auto it = r.metadata().find("xxh3_64");
  if (it == r.metadata().end()) return false;
  const std::string computed = weights_checksum(r);
  if (computed != it->second)
    throw input_error("weights file '" + r.path().string() + "' fails its checksum (recorded XXH3-64 " + it->second +
                      ", content " + computed + "): it changed after it was saved; save it again, or export it from a "
                      "checkpoint");
  return true;
}

/// Writes every parameter of `model` (a loom::nn::transformer on a host-accessible device) to `path`
/// atomically (temporary file, fsync, rename: an existing file is replaced only by a complete
/// one), with the model config and "xxh3_64" (weights_checksum) in its metadata. `extra` adds
/// metadata entries. Throws what safetensors_writer::write throws.
template <class G>
void save_weights(const G& model, const std::filesystem::path& path,
                  const std::map<std::string, std::string>& extra = {}) {
  using T = typename G::storage_t;
  constexpr std::string_view dtype =
      std::is_floating_point_v<T> ? detail::dtype_of<T>() : std::is_same_v<T, Eigen::bfloat16> ? "BF16" : "F16";
  std::vector<std::vector<std::int64_t>> shapes(G::num_tensors);
  std::vector<detail::checksummed_tensor> sums;
  safetensors_writer w;
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& spec = G::table[k];
    shapes[k].assign(spec.shape.begin(), spec.shape.begin() + spec.ndim);
    const auto bytes = std::as_bytes(model.parameter(k).span());  // 16-bit storage: the raw BF16 / F16 values
    w.add_bytes(std::string(spec.name), std::string(dtype), shapes[k], bytes);
    sums.push_back({spec.name, dtype, &shapes[k], bytes});
  }
  std::map<std::string, std::string> meta = model_metadata<typename G::model>();
  for (const auto& [k, v] : extra) meta.insert_or_assign(k, v);
  meta["xxh3_64"] = detail::weights_checksum(meta, std::move(sums));
  for (const auto& [k, v] : meta) w.set_metadata(k, v);
  w.write(path);
}

/// Loads parameters saved by save_weights into `model`. Throws loom::input_error when the
/// file is missing or corrupt (it fails its recorded checksum, verify_weights_checksum, or
/// holds a NaN or infinite weight), was saved for a different model config (naming both), or a
/// tensor is missing or has another shape. On an error `model` may be partly overwritten.
template <class G>
void load_weights(G& model, const std::filesystem::path& path) {
  safetensors_reader r(path);
  (void)verify_weights_checksum(r);
  using M = typename G::model;
  const auto& meta = r.metadata();
  for (const auto& [k, v] : model_metadata<M>()) {
    if (k == "model" || k == "format" || k == "model_spec") continue;  // the name, and the sizes' JSON, may differ
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
    const auto p = model.parameter(k).span();
    for (std::size_t i = 0; i < p.size(); ++i)
      if (!std::isfinite(static_cast<float>(p[i])))
        throw input_error("weights file '" + path.string() + "': tensor '" + name + "' holds " +
                          std::to_string(static_cast<float>(p[i])) + " at element " + std::to_string(i) +
                          "; the file is corrupt or was saved from a diverged run: use another file");
  }
}

}  // namespace loom::io
