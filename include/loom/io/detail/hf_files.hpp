#pragma once
/// \file What the Hugging Face exporters and importers (io/hf_gpt2.hpp, io/hf_llama.hpp) share:
/// the export directory, the host copy of the parameters, writing model.safetensors with
/// config.json and its recorded checksum, reading and checking config.json, the finiteness check
/// of an imported tensor.
#include <algorithm>
#include <cstdint>
#include <vector>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <system_error>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/core/device.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>

namespace loom::io::detail {

/// Creates the export directory `dir`. Throws loom::input_error when it cannot.
inline void make_export_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw input_error("cannot create the export directory '" + dir.string() + "' (" + ec.message() +
                      "); check the path and its permissions");
}

/// The model's parameters readable on the host: `params` itself on a host-readable device, else a
/// copy in `staging` (synchronizes ctx). n values of the model's storage type.
template <class Device, class T>
const T* host_parameters(context<Device>& ctx, const T* params, std::size_t n, std::vector<T>& staging) {
  if constexpr (device::host_accessible_v<Device>) {
    return params;
  } else {
    staging.resize(n);
    Device::copy_to_host(staging.data(), params, n * sizeof(T), ctx.stream);
    ctx.synchronize();
    return staging.data();
  }
}

/// Writes a Hugging Face export into the existing directory `dir`: model.safetensors holds, in
/// order, tensor i named names[i] of shape shapes[i] in F32, its values written by
/// fill(i, float* dst) (dst holds that tensor's elements), with metadata {"format": "pt"} (as
/// transformers requires) and "loom_model"; config.json is `cfg` with the safetensors file's
/// XXH3-64 recorded as "loom"."model_safetensors_xxh3_64" (which the importers check). Each file
/// is written atomically. Errors: loom::error when a write fails.
template <class Fill>
void write_hf_export(const std::filesystem::path& dir, const std::vector<std::string>& names,
                     const std::vector<std::vector<std::int64_t>>& shapes, Fill&& fill, nlohmann::json cfg,
                     std::string_view model) {
  std::vector<std::size_t> first(names.size() + 1, 0);  // element offsets in `all`
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::size_t n = 1;
    for (auto d : shapes[i]) n *= std::size_t(d);
    first[i + 1] = first[i] + n;
  }
  std::vector<float> all(first.back());
  std::vector<tensor_ref> refs;
  for (std::size_t i = 0; i < names.size(); ++i) {
    fill(i, all.data() + first[i]);
    refs.push_back({names[i], "F32", shapes[i],
                    std::as_bytes(std::span<const float>(all.data() + first[i], first[i + 1] - first[i]))});
  }
  const std::string sum = write_safetensors(dir / "model.safetensors", refs, {{"format", "pt"}, {"loom_model", std::string(model)}});
  cfg["loom"]["model_safetensors_xxh3_64"] = sum;
  write_file_atomic(dir / "config.json", cfg.dump(2) + "\n");
}

/// `dir`/config.json as a JSON object. Throws loom::input_error when it is missing, too large,
/// not JSON or not an object; `arch` ("GPT-2", "Llama") names what the directory should hold.
inline nlohmann::json read_hf_config(const std::filesystem::path& dir, const std::string& arch) {
  const auto cpath = dir / "config.json";
  std::string text;
  try {
    text = read_small_file(cpath);
  } catch (const input_error& e) {
    throw input_error(std::string(e.what()) + "; pass a directory with a " + arch + " config.json and model.safetensors");
  }
  nlohmann::json cfg;
  try {
    cfg = parse_json(text, "'" + cpath.string() + "'", "export the model again");
  } catch (const nlohmann::json::exception& e) {
    throw input_error("'" + cpath.string() + "' is not valid JSON (" + e.what() + "); export the model again");
  }
  if (!cfg.is_object()) throw input_error("'" + cpath.string() + "' is not a JSON object; export the model again");
  return cfg;
}

/// When config.json (`cfg`, of `dir`) records the XXH3-64 of model.safetensors (loom's exports
/// do: "loom"."model_safetensors_xxh3_64"), checks the file against it. Throws loom::input_error
/// when they differ. A missing file is left to the reader's own error.
inline void check_hf_weights_checksum(const std::filesystem::path& dir, const nlohmann::json& cfg) {
  const auto lm = cfg.find("loom");
  if (lm == cfg.end() || !lm->is_object() || !lm->contains("model_safetensors_xxh3_64")) return;
  const auto wpath = dir / "model.safetensors";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(wpath, ec)) return;
  const std::string stored = string_or(*lm, "model_safetensors_xxh3_64", "(not a string)");
  const std::string computed = xxh3_file(wpath).first;
  if (stored != computed)
    throw input_error("'" + wpath.string() + "' fails its checksum ('config.json' records XXH3-64 " + stored +
                      ", the file has " + computed + "): it changed after the export; export the model again");
}

/// Checks each (key, ours) of `dims` against config.json `cfg` of `dir`: the key must hold an
/// integer equal to ours (model `model`'s size). Throws loom::input_error naming the key and both
/// values; `arch` ("GPT-2", "Llama") names what the file should be.
inline void check_hf_sizes(const nlohmann::json& cfg, const std::filesystem::path& dir,
                           std::initializer_list<std::pair<const char*, long>> dims, std::string_view model,
                           const std::string& arch) {
  const std::string where = "'" + (dir / "config.json").string() + "'";
  for (const auto& [key, ours] : dims) {
    const auto f = cfg.find(key);
    if (f == cfg.end() || !f->is_number_integer())
      throw input_error(where + " has no integer \"" + key + "\"; it is not a complete " + arch + " config.json");
    if (json_integer<long>(*f) != ours)  // range-checked: nullopt (out of range) never equals
      throw input_error(where + " has " + key + " = " + f->dump() + " but model " + std::string(model) + " has " +
                        std::to_string(ours) + "; choose the matching --model");
  }
}

/// Throws loom::input_error naming tensor `name` of `file` and the first NaN or infinite value.
inline void check_finite_tensor(std::span<const float> values, const std::string& name, const std::filesystem::path& file) {
  if (const auto bad = std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
      bad != values.end())
    throw input_error("tensor '" + name + "' in '" + file.string() + "' holds " + std::to_string(*bad) + " at element " +
                      std::to_string(bad - values.begin()) + "; the file is corrupt or the model diverged: use other weights");
}

}  // namespace loom::io::detail
