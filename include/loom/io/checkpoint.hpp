#pragma once
/// \file Training checkpoints (save, verify, resume), resharding of logical tensors, and
/// export/import of Hugging Face GPT-2 weights. The long-form description, with the on-disk
/// layout and the multi-rank protocol, is docs/checkpoint.md.
///
/// On disk (one root directory per run, `--checkpoint-dir`):
///   <root>/latest                          text: the directory name of the newest complete
///                                          checkpoint, e.g. "step_00000300\n"
///   <root>/step_00000300/manifest.json     JSON: step, tokens, model, layout, precision,
///                                          optimizer, lr schedule, loss scaler, RNG and data
///                                          state, library version, every tensor's logical
///                                          shape and shard rule, every file's size and
///                                          XXH3-64, and a checksum of the manifest itself
///   <root>/step_00000300/model-tp00-pp00.safetensors
///                                          one file per model-parallel rank (tp, pp), written
///                                          by data-parallel rank 0: "param.<name>" in storage
///                                          precision, "master.<name>" (fp32, only when the
///                                          storage is narrower), "adam_m.<name>",
///                                          "adam_v.<name>" (master precision; not with
///                                          ZeRO-1); local shapes
///   <root>/step_00000300/optim-tp00-pp00-dp01.safetensors
///                                          ZeRO-1 only: data-parallel rank 1's AdamW moment
///                                          shard of model-parallel rank (tp 0, pp 0) and the
///                                          ranges of that rank's parameter buffer it holds
///   <root>/.tmp-step_00000400-<pid>/       a save in progress (or one a crash interrupted:
///                                          never read, removed by the next save)
///
/// A save is atomic: everything is written into the temporary directory, each file is fsynced,
/// read back and hashed, the manifest is written and fsynced, the directory is fsynced and
/// renamed into place (RENAME_EXCHANGE when a directory of the same step exists, so the old one
/// stays whole until the new one is in place), the root is fsynced, and only then `latest` is
/// replaced (temporary file, fsync, rename, fsync). A crash at any point leaves the previous
/// checkpoint intact and `latest` naming it (or the new one, once it is complete).
///
/// Resuming on the same layout, precision and thread count reproduces the uninterrupted run
/// bit for bit: parameters, AdamW moments and step count, the trainer's step (which the
/// learning-rate schedule reads), and whatever the caller's run_state carries (data position,
/// RNG state, tokens consumed) come back exactly.
///
/// Multi-rank runs (data parallel with or without ZeRO-1, train::parallel_trainer's
/// layout<TP,PP>) save collectively: save_checkpoint(ctx, root, tr, state, world) on every
/// rank; the save is complete only when every rank wrote and verified its files, otherwise no
/// rank moves `latest` and every rank throws naming the failed ranks. The manifest records the
/// layout (tp, pp, dp, zero) and every tensor's logical (global) shape and shard rule, so
/// load_checkpoint reshards a checkpoint onto any other layout of the same model with the pure
/// functions shard_tensor(gather_tensor(...)) below.
#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/view.hpp>
#include <loom/device/policy.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/models/configs.hpp>
#include <loom/nn/params.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/precision/policy.hpp>
#include <loom/precision/loss_scaler.hpp>

namespace loom::io {

/// The library version recorded in every manifest (the CMake project version).
inline constexpr std::string_view library_version = "0.1.0";
/// Manifest format written by this header; readers accept versions <= this one.
inline constexpr int checkpoint_format_version = 1;

// ============================================================================================
// Run state, options, results
// ============================================================================================

/// What a checkpoint carries besides the trainer: the caller's loop state, returned unchanged
/// by load_checkpoint. The JSON values are free-form objects the caller defines.
struct run_state {
  std::uint64_t tokens = 0;                           ///< target tokens consumed so far
  nlohmann::json data = nlohmann::json::object();     ///< data position, e.g. {"kind": "window_sampler", "position": 96}
  nlohmann::json rng = nlohmann::json::object();      ///< RNG states beyond the data order (dropout streams, ...)
  nlohmann::json extra = nlohmann::json::object();    ///< anything else (flags, run name)
};

/// Settings of save_checkpoint.
struct checkpoint_options {
  /// Keep the newest `keep` complete checkpoints of steps <= the saved one; older ones are
  /// removed after a successful save. 0 keeps all. Checkpoints of later steps (left by a run
  /// that was resumed from an earlier point) are never removed.
  int keep = 5;
  /// Refuse (loom::numeric_error, nothing written) when a parameter or optimizer value is NaN
  /// or infinite, so a diverged run never overwrites good checkpoints.
  bool check_finite = true;
  /// Test hook, called after each durable step of a save with its name: "prepared" (the
  /// empty temporary directory exists; in a collective save on rank 0 only), "file_written"
  /// (a rank file is written, fsynced and verified), "manifest_written", "committed" (the
  /// step directory is in place), "latest_updated". Throwing from it simulates a failure at
  /// that point; save_checkpoint then cleans up as it would after a real failure. In a
  /// collective save each rank has its own options, so a test can fail one rank only.
  std::function<void(std::string_view stage)> on_stage;
};

/// One file of a checkpoint, as the manifest lists it.
struct checkpoint_file {
  std::string path;        ///< relative to the checkpoint directory, no '/'
  int tp = 0, pp = 0, dp = 0;
  std::uint64_t bytes = 0;
  std::string xxh3_64;     ///< 16 lower-case hex digits
};

/// What load_checkpoint restored, and what the caller restores itself.
struct checkpoint_info {
  std::filesystem::path dir;          ///< the step directory that was loaded
  long step = 0;                      ///< completed optimizer steps (trainer::step_count)
  long optimizer_step = 0;            ///< AdamW updates applied (skipped steps excluded)
  run_state state;                    ///< as given to save_checkpoint
  nlohmann::json manifest;            ///< the whole manifest
  std::vector<std::string> warnings;  ///< settings of the running trainer that differ from the checkpoint's
};

/// A complete-looking checkpoint directory found under a root (not yet verified).
struct checkpoint_entry {
  long step = 0;
  std::filesystem::path dir;
};

// ============================================================================================
// Names
// ============================================================================================

/// "step_00000300": the directory name of the checkpoint after `step` completed steps.
inline std::string checkpoint_dir_name(long step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08ld", step);
  return buf;
}

/// "model-tp00-pp00.safetensors": the file of model-parallel rank (tp, pp).
inline std::string checkpoint_file_name(int tp_rank, int pp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-tp%02d-pp%02d.safetensors", tp_rank, pp_rank);
  return buf;
}

/// The step encoded in a directory name "step_<digits>", or nullopt.
inline std::optional<long> parse_checkpoint_dir_name(std::string_view name) {
  if (name.size() < 6 || name.substr(0, 5) != "step_") return std::nullopt;
  long v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9' || v > (1L << 50)) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

/// Every "step_*" directory under `root`, by ascending step. Empty when root does not exist.
/// Does not look inside them (see verify_checkpoint).
inline std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& root) {
  std::vector<checkpoint_entry> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const auto step = parse_checkpoint_dir_name(e.path().filename().string());
    std::error_code ec2;
    if (step && e.is_directory(ec2)) out.push_back({*step, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

// ============================================================================================
// Logical tensors and resharding (pure functions; see docs/checkpoint.md "Resharding")
// ============================================================================================

/// How one parameter tensor maps onto ranks. A tensor is viewed as (layers, rows, cols):
/// per-layer tensors have layers = n_layer (split across pipeline stages), the others
/// layers = 1 (held whole by every stage). Tensor parallelism splits rows (shard::vocab and
/// shard::column; a column tensor with `sections` = 3, qkv, splits each of its q, k, v
/// sections so a rank owns whole heads of all three) or cols (shard::row), or replicates.
struct shard_geometry {
  nn::shard rule = nn::shard::replicated;
  bool per_layer = false;
  long layers = 1, rows = 1, cols = 1;
  int sections = 1;
  std::size_t logical_elems() const noexcept { return std::size_t(layers) * rows * cols; }
};

/// The geometry of table row k for model M (logical shapes from the unsplit table).
template <models::model_config M>
constexpr shard_geometry geometry_of(std::size_t k) {
  constexpr auto t = nn::param_table<M, parallel::layout<1, 1>>();
  const auto& s = t[k];
  shard_geometry g;
  g.rule = s.rule;
  g.per_layer = s.per_layer;
  if (g.per_layer) {
    g.layers = s.global[0];
    g.rows = s.global[1];
    g.cols = s.ndim == 3 ? s.global[2] : 1;
  } else {
    g.rows = s.global[0];
    g.cols = s.ndim == 2 ? s.global[1] : 1;
  }
  g.sections = s.sections;
  return g;
}

/// The logical (whole-model) shape of table row k for model M, as recorded in manifests.
template <models::model_config M>
std::vector<std::int64_t> logical_shape(std::size_t k) {
  constexpr auto t = nn::param_table<M, parallel::layout<1, 1>>();
  const auto& s = t[k];
  return std::vector<std::int64_t>(s.global.begin(), s.global.begin() + s.ndim);
}

namespace detail {
inline void check_split(const shard_geometry& g, int tp, int pp) {
  const bool ok = tp >= 1 && pp >= 1 && (!g.per_layer || g.layers % pp == 0) &&
                  (g.rule == nn::shard::replicated || g.rule == nn::shard::row
                       ? g.cols % tp == 0 || g.rule == nn::shard::replicated
                       : (g.rows / g.sections) % tp == 0);
  if (!ok)
    throw input_error("cannot split a (" + std::to_string(g.layers) + ", " + std::to_string(g.rows) + ", " +
                      std::to_string(g.cols) + ") tensor over tp = " + std::to_string(tp) + ", pp = " +
                      std::to_string(pp) + "; choose degrees that divide the model (see parallel::fits)");
}
// Calls f(logical_offset, local_offset, count) for every contiguous run of rank (r, s)'s shard.
template <class F>
void for_each_run(const shard_geometry& g, int tp, int pp, int r, int s, F&& f) {
  check_split(g, tp, pp);
  const long layers = g.per_layer ? g.layers / pp : g.layers;
  const long first_layer = g.per_layer ? s * layers : 0;
  std::size_t local = 0;
  for (long l = 0; l < layers; ++l) {
    const std::size_t base = std::size_t(first_layer + l) * g.rows * g.cols;
    switch (g.rule) {
      case nn::shard::replicated:
        f(base, local, std::size_t(g.rows) * g.cols);
        local += std::size_t(g.rows) * g.cols;
        break;
      case nn::shard::vocab:
      case nn::shard::column: {
        const long sec = g.rows / g.sections, part = sec / tp;
        for (int q = 0; q < g.sections; ++q) {
          const std::size_t row0 = std::size_t(q) * sec + std::size_t(r) * part;
          f(base + row0 * g.cols, local, std::size_t(part) * g.cols);
          local += std::size_t(part) * g.cols;
        }
        break;
      }
      case nn::shard::row: {
        const long part = g.cols / tp;
        for (long i = 0; i < g.rows; ++i) {
          f(base + std::size_t(i) * g.cols + std::size_t(r) * part, local, std::size_t(part));
          local += std::size_t(part);
        }
        break;
      }
    }
  }
}
}  // namespace detail

/// Elements of rank (tp_rank, pp_rank)'s shard of a tensor of geometry g under degrees (tp, pp).
inline std::size_t shard_elems(const shard_geometry& g, int tp, int pp) {
  std::size_t n = 0;
  detail::for_each_run(g, tp, pp, 0, 0, [&](std::size_t, std::size_t, std::size_t c) { n += c; });
  return n;
}

/// The shard of tensor `logical` (row-major, g.logical_elems() elements of elem_size bytes)
/// held by tensor-parallel rank tp_rank of pipeline stage pp_rank under degrees (tp, pp).
/// Pure function. Throws loom::input_error when the sizes or degrees do not fit.
inline std::vector<std::byte> shard_tensor(const shard_geometry& g, std::size_t elem_size,
                                           std::span<const std::byte> logical, int tp, int pp, int tp_rank,
                                           int pp_rank) {
  if (logical.size() != g.logical_elems() * elem_size)
    throw input_error("shard_tensor: the logical tensor has " + std::to_string(logical.size()) + " bytes, not " +
                      std::to_string(g.logical_elems() * elem_size) + "; pass the whole tensor");
  std::vector<std::byte> out(shard_elems(g, tp, pp) * elem_size);
  detail::for_each_run(g, tp, pp, tp_rank, pp_rank, [&](std::size_t from, std::size_t to, std::size_t n) {
    std::memcpy(out.data() + to * elem_size, logical.data() + from * elem_size, n * elem_size);
  });
  return out;
}

/// The logical tensor assembled from the shards of all ranks under degrees (tp, pp):
/// shard(tp_rank, pp_rank) returns that rank's bytes. Replicated pieces are taken from tensor
/// rank 0 (and, for tensors every stage holds whole, from stage 0). Inverse of shard_tensor.
template <class ShardFn>
std::vector<std::byte> gather_tensor(const shard_geometry& g, std::size_t elem_size, ShardFn&& shard, int tp,
                                     int pp) {
  std::vector<std::byte> out(g.logical_elems() * elem_size);
  const int stages = g.per_layer ? pp : 1;
  const int tps = g.rule == nn::shard::replicated ? 1 : tp;
  for (int s = 0; s < stages; ++s)
    for (int r = 0; r < tps; ++r) {
      const std::span<const std::byte> src = shard(r, s);
      if (src.size() != shard_elems(g, tp, pp) * elem_size)
        throw input_error("gather_tensor: the shard of tp rank " + std::to_string(r) + ", stage " + std::to_string(s) +
                          " has " + std::to_string(src.size()) + " bytes, not " +
                          std::to_string(shard_elems(g, tp, pp) * elem_size) + "; the checkpoint does not match the layout");
      detail::for_each_run(g, tp, pp, r, s, [&](std::size_t to, std::size_t from, std::size_t n) {
        std::memcpy(out.data() + to * elem_size, src.data() + from * elem_size, n * elem_size);
      });
    }
  return out;
}

/// Reshards one tensor from degrees (tp_a, pp_a) to (tp_b, pp_b): out[pp][tp] = the shard of
/// rank (tp, pp) under the new degrees. Pure function: shard_tensor(gather_tensor(...)).
template <class ShardFn>
std::vector<std::vector<std::vector<std::byte>>> reshard_tensor(const shard_geometry& g, std::size_t elem_size,
                                                                  ShardFn&& shard, int tp_a, int pp_a, int tp_b,
                                                                  int pp_b) {
  const auto logical = gather_tensor(g, elem_size, shard, tp_a, pp_a);
  std::vector<std::vector<std::vector<std::byte>>> out;
  out.resize(std::size_t(pp_b));
  for (int s = 0; s < pp_b; ++s)
    for (int r = 0; r < tp_b; ++r) out[std::size_t(s)].push_back(shard_tensor(g, elem_size, logical, tp_b, pp_b, r, s));
  return out;
}

// ============================================================================================
// Manifest: verify, read
// ============================================================================================

namespace detail {

inline constexpr std::string_view manifest_name = "manifest.json";
inline constexpr std::string_view latest_name = "latest";

inline std::string_view shard_name(nn::shard s) {
  switch (s) {
    case nn::shard::replicated: return "replicated";
    case nn::shard::column: return "column";
    case nn::shard::row: return "row";
    case nn::shard::vocab: return "vocab";
  }
  return "?";
}

/// The safetensors dtype of a storage/master element type.
template <class T>
constexpr std::string_view tensor_dtype() {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "BF16";
  else if constexpr (std::is_same_v<T, Eigen::half>) return "F16";
  else return dtype_of<T>();
}

/// The manifest's own checksum: XXH3-64 of its compact dump without the "checksum" key.
inline std::string manifest_checksum(nlohmann::json j) {
  j.erase("checksum");
  const std::string text = j.dump();
  return xxh3_hex(text.data(), text.size());
}

inline input_error bad_checkpoint(const std::filesystem::path& dir, const std::string& problem) {
  return input_error("checkpoint '" + dir.string() + "' is unusable: " + problem +
                     "; resume from an earlier checkpoint (pass its directory to --resume) or start a new run");
}

/// j[key] when j is an object holding a string there, else `otherwise` (never throws).
inline std::string string_or(const nlohmann::json& j, std::string_view key, std::string otherwise) {
  if (!j.is_object()) return otherwise;
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

/// j[key] as T; throws bad_checkpoint when it is missing or of another type.
template <class T>
T field(const nlohmann::json& j, std::string_view key, const std::filesystem::path& dir) {
  if (!j.is_object()) throw bad_checkpoint(dir, "manifest.json has a section that is not an object");
  const auto it = j.find(key);
  if (it == j.end()) throw bad_checkpoint(dir, "manifest.json has no \"" + std::string(key) + "\"");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw bad_checkpoint(dir, "manifest.json field \"" + std::string(key) + "\" has the wrong type (" +
                                  std::string(it->type_name()) + ")");
  }
}

inline std::vector<checkpoint_file> manifest_files(const nlohmann::json& j, const std::filesystem::path& dir) {
  const auto files = field<nlohmann::json>(j, "files", dir);
  if (!files.is_array() || files.empty()) throw bad_checkpoint(dir, "manifest.json lists no files");
  std::vector<checkpoint_file> out;
  for (const auto& f : files) {
    if (!f.is_object()) throw bad_checkpoint(dir, "manifest.json has a file entry that is not an object");
    checkpoint_file c;
    c.path = field<std::string>(f, "path", dir);
    c.tp = field<int>(f, "tp", dir);
    c.pp = field<int>(f, "pp", dir);
    c.dp = field<int>(f, "dp", dir);
    c.bytes = field<std::uint64_t>(f, "bytes", dir);
    c.xxh3_64 = field<std::string>(f, "xxh3_64", dir);
    if (c.path.empty() || c.path.find('/') != std::string::npos || c.path == "." || c.path == "..")
      throw bad_checkpoint(dir, "manifest.json names the file '" + c.path + "', which is not a plain file name");
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace detail

/// Checks the integrity of checkpoint directory `dir` and returns its manifest: manifest.json
/// exists, is JSON of this format (version <= checkpoint_format_version), matches its own
/// checksum, and every file it lists exists with the recorded size and XXH3-64 (each file is
/// read once). Does not check that the checkpoint fits a model (load_checkpoint does).
/// Throws loom::input_error naming the checkpoint, the problem and the fix.
inline nlohmann::json verify_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw input_error("checkpoint directory '" + dir.string() + "' does not exist; pass the directory of a checkpoint "
                      "(step_NNNNNNNN) or of a run's --checkpoint-dir");
  const auto mpath = dir / detail::manifest_name;
  if (!std::filesystem::exists(mpath, ec))
    throw detail::bad_checkpoint(dir, "it has no manifest.json (the save did not finish, or the file was deleted)");
  const std::string text = detail::read_small_file(mpath);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw detail::bad_checkpoint(dir, std::string("manifest.json is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || detail::string_or(j, "format", "") != "loom.checkpoint")
    throw detail::bad_checkpoint(dir, "manifest.json is not a loom checkpoint manifest (no \"format\": \"loom.checkpoint\")");
  const int version = detail::field<int>(j, "format_version", dir);
  if (version < 1 || version > checkpoint_format_version)
    throw detail::bad_checkpoint(dir, "manifest format version " + std::to_string(version) + " is not supported by loom " +
                                          std::string(library_version) + " (it reads versions 1.." +
                                          std::to_string(checkpoint_format_version) + ")");
  const auto sum = detail::field<nlohmann::json>(j, "checksum", dir);
  const std::string stored = detail::string_or(sum, "xxh3_64", "");
  const std::string computed = detail::manifest_checksum(j);
  if (stored != computed)
    throw detail::bad_checkpoint(dir, "manifest.json fails its checksum (stored " + stored + ", computed " + computed +
                                          "): it was edited or corrupted");
  (void)detail::field<long>(j, "step", dir);
  for (const auto& f : detail::manifest_files(j, dir)) {
    const auto p = dir / f.path;
    if (!std::filesystem::is_regular_file(p, ec)) throw detail::bad_checkpoint(dir, "its file '" + f.path + "' is missing");
    const auto size = std::filesystem::file_size(p, ec);
    if (ec || size != f.bytes)
      throw detail::bad_checkpoint(dir, "file '" + f.path + "' is " + std::to_string(size) + " bytes but the manifest says " +
                                            std::to_string(f.bytes) + " (truncated or replaced)");
    const auto [hash, bytes] = detail::xxh3_file(p);
    if (hash != f.xxh3_64)
      throw detail::bad_checkpoint(dir, "file '" + f.path + "' fails its checksum (manifest XXH3-64 " + f.xxh3_64 +
                                            ", file " + hash + "): its bytes changed after the save");
  }
  return j;
}

/// The checkpoint to resume from, given `dir`:
///   * a checkpoint directory (it holds manifest.json): that one, verified; no fallback.
///   * a run's root (--checkpoint-dir): the one `latest` names if it verifies; otherwise, with
///     a warning through `warn` for each unusable one, the newest older checkpoint that
///     verifies. Without a readable `latest`, the newest checkpoint that verifies.
/// Throws loom::input_error when `dir` does not exist, holds no checkpoint, or none verifies
/// (the message lists each one's problem).
inline std::filesystem::path find_checkpoint(const std::filesystem::path& dir,
                                             const std::function<void(const std::string&)>& warn = {}) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw input_error("--resume: '" + dir.string() + "' does not exist or is not a directory; pass the "
                      "--checkpoint-dir of an earlier run, or one of its step_NNNNNNNN directories");
  if (std::filesystem::exists(dir / detail::manifest_name, ec)) {
    (void)verify_checkpoint(dir);
    return dir;
  }
  auto all = list_checkpoints(dir);
  if (all.empty())
    throw input_error("--resume: '" + dir.string() + "' holds no checkpoint (no step_NNNNNNNN directory); pass the "
                      "--checkpoint-dir of an earlier run, or start without --resume");
  auto say = [&](const std::string& s) {
    if (warn) warn(s);
  };
  long latest = -1;  // the step `latest` names, -1 when there is no usable pointer
  const auto lpath = dir / detail::latest_name;
  if (std::filesystem::exists(lpath, ec)) {
    std::string name;
    try {
      name = detail::read_small_file(lpath, 4096);
    } catch (const input_error&) {
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    const auto named = parse_checkpoint_dir_name(name);
    if (named && std::filesystem::is_directory(dir / name, ec))
      latest = *named;
    else
      say("checkpoint pointer '" + lpath.string() + "' names '" + name +
          "', which is not a checkpoint here; using the newest checkpoint that verifies");
  }
  std::string problems;
  bool first = true;
  // candidates not yet tried: a later, abandoned branch of the run (step > latest) is skipped
  auto left = std::count_if(all.begin(), all.end(), [&](const auto& c) { return latest < 0 || c.step <= latest; });
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (latest >= 0 && it->step > latest) continue;
    --left;
    try {
      (void)verify_checkpoint(it->dir);
      return it->dir;
    } catch (const input_error& e) {
      const std::string what = e.what();
      const std::string problem = what.substr(0, what.find("; resume from"));
      say(problem + (left == 0 ? "; no earlier checkpoint is left to fall back to"
                     : first    ? "; falling back to the previous checkpoint"
                                : "; trying an earlier one"));
      problems += " [" + problem + "]";
      first = false;
    }
  }
  throw input_error("--resume: no usable checkpoint in '" + dir.string() + "':" + problems +
                    "; start a new run without --resume, or restore the files from a backup");
}

// ============================================================================================
// Save
// ============================================================================================

namespace detail {

template <class T>
bool all_finite(std::span<const std::byte> bytes) {
  const std::size_t n = bytes.size() / sizeof(T);
  for (std::size_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, bytes.data() + i * sizeof(T), sizeof(T));
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(x)) return false;
    } else {
      if (!std::isfinite(static_cast<float>(x))) return false;
    }
  }
  return true;
}

/// Writes `text` as the "latest" pointer of `root`.
inline void write_latest(const std::filesystem::path& root, const std::string& name) {
  write_file_atomic(root / latest_name, name + "\n");
}

/// Moves `tmp` to `final` atomically. When `final` exists, RENAME_EXCHANGE swaps them (the old
/// one stays whole until the new one is in place) and the old one is removed afterwards.
inline void move_into_place(const std::filesystem::path& tmp, const std::filesystem::path& final) {
  std::error_code ec;
  if (std::filesystem::exists(final, ec)) {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_dir(final.parent_path(), "after replacing " + final.filename().string());
      remove_quietly(tmp);  // now holds the old checkpoint
      return;
    }
#endif
    // No RENAME_EXCHANGE on this file system: move the old one aside first.
    const auto aside = final.parent_path() / (".old-" + final.filename().string() + "-" + std::to_string(::getpid()));
    remove_quietly(aside);
    if (::rename(final.c_str(), aside.c_str()) != 0)
      throw error("cannot move the old '" + final.string() + "' aside: " + std::strerror(errno) +
                  "; check the permissions of the checkpoint directory");
    if (::rename(tmp.c_str(), final.c_str()) != 0) {
      const int e = errno;
      (void)::rename(aside.c_str(), final.c_str());
      throw error("cannot rename '" + tmp.string() + "' to '" + final.string() + "': " + std::strerror(e) +
                  "; check the permissions of the checkpoint directory");
    }
    fsync_dir(final.parent_path(), "after replacing " + final.filename().string());
    remove_quietly(aside);
    return;
  }
  if (::rename(tmp.c_str(), final.c_str()) != 0)
    throw error("cannot rename '" + tmp.string() + "' to '" + final.string() + "': " + std::strerror(errno) +
                "; check the permissions of the checkpoint directory");
  fsync_dir(final.parent_path(), "after adding " + final.filename().string());
}

/// Removes all but the newest `keep` checkpoints of steps <= `step` (never `step` itself).
inline void prune(const std::filesystem::path& root, long step, int keep) {
  if (keep <= 0) return;
  auto all = list_checkpoints(root);
  std::vector<checkpoint_entry> older;
  for (const auto& e : all)
    if (e.step <= step) older.push_back(e);
  if (older.size() <= std::size_t(keep)) return;
  for (std::size_t i = 0; i + std::size_t(keep) < older.size(); ++i)
    if (older[i].step != step) remove_quietly(older[i].dir);
}

/// A rank file to write: its name, rank coordinates, its tensors (bytes held elsewhere: by
/// the trainer for a synchronous save, by a staging buffer for an asynchronous one) and
/// safetensors metadata.
struct rank_file {
  std::string name;
  int tp = 0, pp = 0, dp = 0;
  std::vector<tensor_ref> tensors;
  std::map<std::string, std::string> metadata;
  std::vector<std::byte> owned;  ///< bytes some tensors point into (moves keep them in place)
};

/// Step 2 of a save: creates `root`, removes leftovers of interrupted saves (".tmp-*",
/// ".old-*"; one writer per root) and creates the empty temporary directory `tmp`.
/// Throws loom::input_error when either cannot be created.
inline void prepare_save(const std::filesystem::path& root, const std::filesystem::path& tmp) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec || !std::filesystem::is_directory(root))
    throw input_error("cannot create the checkpoint directory '" + root.string() + "' (" + ec.message() +
                      "); check the path and its permissions");
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(".tmp-", 0) == 0 || f.rfind(".old-", 0) == 0) remove_quietly(e.path());
  }
  remove_quietly(tmp);
  if (!std::filesystem::create_directory(tmp, ec) || ec)
    throw input_error("cannot create '" + tmp.string() + "' (" + ec.message() +
                      "); check that the checkpoint directory is writable");
}

/// Step 3 of a save: writes each of `files` into `tmp` (temporary name, fsync, rename, fsync
/// of `tmp`), reads it back (the safetensors header parses, the XXH3-64 of the file equals
/// the hash of what was written) and returns the manifest's "files" entries. Calls
/// stage("file_written") after each file. Throws loom::error / input_error on any failure.
inline nlohmann::json write_rank_files(const std::filesystem::path& tmp, const std::vector<rank_file>& files,
                                       const std::function<void(std::string_view)>& stage) {
  nlohmann::json listed = nlohmann::json::array();
  for (const auto& f : files) {
    const auto path = tmp / f.name;
    const std::string written = write_safetensors(path, f.tensors, f.metadata);  // tmp file, fsync, rename
    (void)safetensors_reader(path);                                             // the header reads back
    const auto [hash, bytes] = xxh3_file(path);                                 // and so do the bytes
    if (hash != written)
      throw error("'" + path.string() + "' reads back with XXH3-64 " + hash + " but " + written +
                  " was written: the storage corrupted it; check the disk");
    listed.push_back({{"path", f.name}, {"tp", f.tp}, {"pp", f.pp}, {"dp", f.dp}, {"bytes", bytes}, {"xxh3_64", hash}});
    if (stage) stage("file_written");
  }
  return listed;
}

/// Steps 4-5 of a save: adds `files` and the checksum to `manifest`, writes manifest.json
/// into `tmp` (temporary file, fsync, rename), fsyncs `tmp` and moves it to `final`.
inline void write_manifest_and_commit(const std::filesystem::path& tmp, const std::filesystem::path& final,
                                      nlohmann::json manifest, nlohmann::json files,
                                      const std::function<void(std::string_view)>& stage) {
  manifest["files"] = std::move(files);
  manifest["checksum"] = {{"algorithm", "xxh3_64 of the compact JSON dump of this object without \"checksum\""},
                          {"xxh3_64", manifest_checksum(manifest)}};
  write_file_atomic(tmp / manifest_name, manifest.dump(2) + "\n");
  if (stage) stage("manifest_written");
  fsync_dir(tmp, "the new checkpoint");
  move_into_place(tmp, final);
}

/// "checkpoint save of step N to 'root' failed: <what>; the previous checkpoint and latest are unchanged".
inline std::string save_failed(const std::filesystem::path& root, long step, const std::string& what) {
  return "checkpoint save of step " + std::to_string(step) + " to '" + root.string() + "' failed: " + what +
         "; the previous checkpoint and '" + (root / latest_name).string() + "' are unchanged";
}

/// Steps 6-7 of a save: points `latest` at `final`, prunes to opt.keep. Throws loom::error
/// when `latest` cannot be replaced (the new checkpoint is in place, `latest` names the old).
inline void publish_latest(const std::filesystem::path& root, long step, const std::filesystem::path& final,
                           const checkpoint_options& opt) {
  try {
    write_latest(root, checkpoint_dir_name(step));
    if (opt.on_stage) opt.on_stage("latest_updated");
  } catch (const std::exception& e) {
    throw error("checkpoint " + final.string() + " was written, but updating '" + (root / latest_name).string() +
                "' failed: " + e.what() + "; it still names the previous checkpoint, which --resume will use");
  }
  prune(root, step, opt.keep);
}

/// Steps 2-7 of a save (docs/checkpoint.md "Save protocol"), for files already snapshotted.
inline std::filesystem::path commit_checkpoint(const std::filesystem::path& root, long step,
                                               const std::vector<rank_file>& files, nlohmann::json manifest,
                                               const checkpoint_options& opt) {
  const std::filesystem::path final = root / checkpoint_dir_name(step);
  const std::filesystem::path tmp = root / (".tmp-" + checkpoint_dir_name(step) + "-" + std::to_string(::getpid()));
  bool created = false, committed = false;
  try {
    prepare_save(root, tmp);
    created = true;
    if (opt.on_stage) opt.on_stage("prepared");
    auto listed = write_rank_files(tmp, files, opt.on_stage);
    write_manifest_and_commit(tmp, final, std::move(manifest), std::move(listed), opt.on_stage);
    committed = true;
    if (opt.on_stage) opt.on_stage("committed");
  } catch (const input_error& e) {
    if (created && !committed) remove_quietly(tmp);
    throw input_error(save_failed(root, step, e.what()));
  } catch (const std::exception& e) {
    if (created && !committed) remove_quietly(tmp);
    throw error(save_failed(root, step, e.what()));
  }
  publish_latest(root, step, final, opt);
  return final;
}

/// The outcome of one rank in a collective save: ok, or the reason it failed. Fixed size, so
/// that it travels through any communicator's all_gather as bytes.
struct rank_outcome {
  std::int32_t ok = 1;
  char reason[500] = {};
  void fail(std::string_view why) noexcept {
    ok = 0;
    const std::size_t n = std::min(why.size(), sizeof reason - 1);
    std::memcpy(reason, why.data(), n);
    reason[n] = '\0';
  }
};
static_assert(std::is_trivially_copyable_v<rank_outcome>);

/// Every rank's outcome (collective over `world`: one all_gather of fixed-size records).
/// Empty string when every rank succeeded, else "rank 1: <reason>; rank 3: <reason>".
template <class Comm>
std::string agree(Comm& world, const rank_outcome& mine) {
  std::vector<rank_outcome> all(std::size_t(world.size()));
  world.all_gather(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&mine), sizeof mine),
                   std::span<std::byte>(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof mine));
  std::string failed;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].ok) {
      all[r].reason[sizeof all[r].reason - 1] = '\0';
      failed += (failed.empty() ? "rank " : "; rank ") + std::to_string(r) + ": " + all[r].reason;
    }
  return failed;
}

/// One manifest "files" entry as a fixed-size record (for the all_gather to rank 0).
struct file_record {
  char path[96] = {};
  char xxh3_64[24] = {};
  std::int32_t tp = 0, pp = 0, dp = 0, used = 0;
  std::uint64_t bytes = 0;
};
static_assert(std::is_trivially_copyable_v<file_record>);

/// The collective save of the files of every rank of `world` (docs/checkpoint.md "Multi-rank
/// save"): rank 0 prepares the temporary directory (its name, with rank 0's pid, is
/// broadcast); every rank writes and verifies its own `files` (possibly none) there; the
/// ranks agree (all_gather of an ok flag and a reason: an all-reduce(min) of the flag that
/// also carries the reasons); if any failed, rank 0 removes the temporary directory and
/// every rank throws loom::error naming each failing rank and its reason, with `latest`
/// unmoved. Otherwise rank 0 gathers the file entries, writes `manifest` (only rank 0's is
/// used), renames the directory into place, moves `latest` and prunes; its outcome is
/// agreed again, so that every rank returns the checkpoint directory or throws the same
/// error. Every rank must call it with the same root and step. Collective: 5 collectives
/// of a few KB each.
template <class Comm>
std::filesystem::path commit_checkpoint_collective(Comm& world, const std::filesystem::path& root, long step,
                                                   const std::vector<rank_file>& files, nlohmann::json manifest,
                                                   const checkpoint_options& opt) {
  const int me = world.rank();
  const std::filesystem::path final = root / checkpoint_dir_name(step);
  std::int64_t pid = me == 0 ? std::int64_t(::getpid()) : 0;
  world.broadcast(std::span<std::int64_t>(&pid, 1), 0);
  const std::filesystem::path tmp = root / (".tmp-" + checkpoint_dir_name(step) + "-" + std::to_string(pid));
  auto fail_all = [&](const std::string& failed) -> error {
    if (me == 0) remove_quietly(tmp);
    return error(save_failed(root, step, failed));
  };
  rank_outcome out;
  if (me == 0) try {
      prepare_save(root, tmp);
      if (opt.on_stage) opt.on_stage("prepared");
    } catch (const std::exception& e) {
      out.fail(e.what());
    }
  if (auto failed = agree(world, out); !failed.empty()) throw fail_all(failed);

  nlohmann::json listed;
  try {
    listed = write_rank_files(tmp, files, opt.on_stage);
  } catch (const std::exception& e) {
    out.fail(e.what());
  }
  if (auto failed = agree(world, out); !failed.empty()) throw fail_all(failed);

  // Every rank's file entries to rank 0 (fixed-size records, padded to the largest count).
  std::int64_t count = std::int64_t(listed.size());
  world.all_reduce(std::span<std::int64_t>(&count, 1), parallel::reduce_op::max);
  std::vector<file_record> mine(static_cast<std::size_t>(count));
  std::vector<file_record> all(static_cast<std::size_t>(count) * static_cast<std::size_t>(world.size()));
  for (std::size_t i = 0; i < listed.size(); ++i) {
    const auto& f = listed[i];
    std::snprintf(mine[i].path, sizeof mine[i].path, "%s", f["path"].get<std::string>().c_str());
    std::snprintf(mine[i].xxh3_64, sizeof mine[i].xxh3_64, "%s", f["xxh3_64"].get<std::string>().c_str());
    mine[i].tp = f["tp"].get<int>();
    mine[i].pp = f["pp"].get<int>();
    mine[i].dp = f["dp"].get<int>();
    mine[i].bytes = f["bytes"].get<std::uint64_t>();
    mine[i].used = 1;
  }
  world.all_gather(std::span<const std::byte>(reinterpret_cast<const std::byte*>(mine.data()), mine.size() * sizeof(file_record)),
                   std::span<std::byte>(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(file_record)));
  if (me == 0) {
    bool committed = false;
    try {
      nlohmann::json every = nlohmann::json::array();
      for (const auto& f : all)
        if (f.used)
          every.push_back({{"path", std::string(f.path)}, {"tp", f.tp}, {"pp", f.pp}, {"dp", f.dp},
                           {"bytes", f.bytes}, {"xxh3_64", std::string(f.xxh3_64)}});
      write_manifest_and_commit(tmp, final, std::move(manifest), std::move(every), opt.on_stage);
      committed = true;
      if (opt.on_stage) opt.on_stage("committed");
      publish_latest(root, step, final, opt);
    } catch (const std::exception& e) {
      if (!committed) remove_quietly(tmp);
      out.fail(committed ? std::string(e.what()) : save_failed(root, step, e.what()));
    }
  }
  if (auto failed = agree(world, out); !failed.empty()) throw error(failed);
  return final;
}

/// ZeRO-1 load, gather half: fills the whole first and second moments `m`, `v` (the
/// parameter buffer of model-parallel rank (tp, pp), m.size() elements) from that rank's
/// optim-tp..-pp..-dp..safetensors shard files listed in `files`. Checks each file's dtype,
/// shapes and ranges (in bounds of the buffer and of the shard) and that the shards cover the
/// buffer exactly once. Throws bad_checkpoint (loom::input_error) otherwise. Pure I/O on the
/// host; the caller re-splits (by its own moment_ranges) or copies the whole.
template <class T>
void gather_zero1_moments(const std::filesystem::path& dir, const std::vector<checkpoint_file>& files, int tp, int pp,
                          std::span<T> m, std::span<T> v) {
  std::vector<std::uint8_t> seen(m.size(), 0);
  std::size_t covered = 0, shards = 0;
  for (const auto& f : files) {
    if (f.tp != tp || f.pp != pp || f.path.rfind("optim-", 0) != 0) continue;
    ++shards;
    const safetensors_reader r(dir / f.path);
    for (const char* t : {"adam_m", "adam_v", "ranges"})
      if (!r.has(t)) throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' has no tensor '" + t + "'");
    const auto& mi = r.info("adam_m");
    if (mi.dtype != tensor_dtype<T>() || mi.shape.size() != 1 || r.info("adam_v").shape != mi.shape ||
        r.info("adam_v").dtype != mi.dtype)
      throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' holds adam_m/adam_v of dtype " + mi.dtype + " " +
                                    shape_string(mi.shape) + ", not two 1-D " + std::string(tensor_dtype<T>()) + " arrays");
    const auto& ri = r.info("ranges");
    if (ri.dtype != "I64" || ri.shape.size() != 2 || ri.shape[1] != 3)
      throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' has ranges " + ri.dtype + " " + shape_string(ri.shape) +
                                    ", not I64 (pieces, 3)");
    const auto ranges = r.read<std::int64_t>("ranges");
    const std::size_t n = std::size_t(mi.shape[0]);
    const auto sm = r.read<T>("adam_m"), sv = r.read<T>("adam_v");
    for (std::size_t i = 0; i + 2 < ranges.size(); i += 3) {
      const std::int64_t po = ranges[i], len = ranges[i + 1], so = ranges[i + 2];
      // no po + len: the values come from the file and may be anything (the fuzzer found the overflow)
      if (po < 0 || len < 0 || so < 0 || std::uint64_t(len) > m.size() || std::uint64_t(po) > m.size() - std::size_t(len) ||
          std::uint64_t(len) > n || std::uint64_t(so) > n - std::size_t(len))
        throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' has a range (" + std::to_string(po) + ", " +
                                      std::to_string(len) + ", " + std::to_string(so) + ") outside the model's " +
                                      std::to_string(m.size()) + " parameters or its " + std::to_string(n) + " moments");
      for (std::int64_t j = 0; j < len; ++j) {
        if (seen[std::size_t(po + j)]++)
          throw bad_checkpoint(dir, "its ZeRO-1 shards cover parameter element " + std::to_string(po + j) + " twice");
        m[std::size_t(po + j)] = sm[std::size_t(so + j)];
        v[std::size_t(po + j)] = sv[std::size_t(so + j)];
      }
      covered += std::size_t(len);
    }
  }
  if (covered != m.size())
    throw bad_checkpoint(dir, "its " + std::to_string(shards) + " ZeRO-1 shard file(s) of rank tp=" + std::to_string(tp) +
                                  " pp=" + std::to_string(pp) + " cover " + std::to_string(covered) + " of " +
                                  std::to_string(m.size()) + " moment elements (a shard file is missing from the manifest)");
}

}  // namespace detail

/// Requirements on what save_checkpoint / load_checkpoint accept (loom::train::trainer).
template <class T>
concept checkpointable_trainer = requires(T& t, const T& ct, long s) {
  typename T::model_t;
  typename T::device;
  { ct.model() };
  { t.model() };
  { ct.optimizer() };
  { t.optimizer() };
  { ct.step_count() } -> std::convertible_to<long>;
  { t.set_step_count(s) };
  { ct.config() };
};

namespace detail {

/// The manifest's "loss_scaler" section: enabled, scale and the good-step counter (PyTorch's
/// growth tracker) of a trainer with a dynamic loss scaler; {enabled: false, scale: 1, ...}
/// otherwise.
template <class Trainer>
nlohmann::json loss_scaler_json(const Trainer& tr) {
  if constexpr (requires { tr.loss_scaler().state(); Trainer::scaler_t::enabled; }) {
    const auto st = tr.loss_scaler().state();
    return {{"enabled", bool(Trainer::scaler_t::enabled)}, {"scale", st.scale}, {"growth_tracker", st.good_steps}};
  } else {
    return {{"enabled", false}, {"scale", 1.0}, {"growth_tracker", 0}};
  }
}

/// The pipeline stages that use table row s (nn::stage_uses), as the manifest records it: "all"
/// (per-layer tensors, each stage its own layers), "first and last" (a tied embedding: token
/// embedding and LM head), "first" (embeddings), "last" (final norm, an untied LM head). Every
/// stage's file holds every row of its table; the copies on stages that do not use a tensor are
/// never read when resharding (nn::owner_stage).
inline std::string used_on_stages(const nn::param_spec& s) {
  if (s.per_layer) return "all";
  switch (s.used) {
    case nn::stages::first: return "first";
    case nn::stages::last: return "last";
    case nn::stages::first_and_last: return "first and last";
    case nn::stages::all: break;
  }
  return "all";
}

/// The data-parallel engine of a trainer (train::trainer::data_parallel()), or null.
template <class Trainer>
auto data_parallel_of(const Trainer& tr) {
  if constexpr (requires { tr.data_parallel(); }) return tr.data_parallel();
  else return static_cast<const void*>(nullptr);
}

/// Step 1 of a save: the files this rank writes and the manifest (without "files" and
/// "checksum", which the commit adds). Data-parallel rank 0 writes the model file
/// (param.*, master.*, and adam_m.* / adam_v.* unless ZeRO-1 shards them); with ZeRO-1 every
/// data-parallel rank also writes its moment shard, optim-tpTT-ppPP-dpDD.safetensors (TT, PP: its
/// model-parallel cell, 00 on layout<1,1>):
/// "adam_m", "adam_v" (master precision, 1-D, the rank's shard as it holds it) and "ranges"
/// (I64, (pieces, 3): parameter-buffer offset, length, shard offset of each contiguous piece,
/// parallel::moment_range). With copy = false the tensors point into the trainer's memory
/// (host-accessible devices only), which must not change until the files are written; with
/// copy = true every tensor is first copied into `staging` (grown to the total and reused
/// across calls). Throws loom::numeric_error when opt.check_finite finds a NaN or an infinity.
template <class Trainer>
std::pair<std::vector<rank_file>, nlohmann::json> snapshot(context<typename Trainer::device>& ctx, const Trainer& tr,
                                                           const run_state& state, const checkpoint_options& opt,
                                                           const std::filesystem::path& root, bool copy,
                                                           std::vector<std::byte>& staging) {
  using G = typename Trainer::model_t;
  using M = typename G::model;
  using P = typename G::precision;
  using L = typename G::layout;
  using D = typename Trainer::device;
  using storage_t = typename P::storage;
  using opt_t = std::remove_cvref_t<decltype(tr.optimizer())>;
  using master_t = typename opt_t::master_t;
  constexpr bool has_master = precision::has_master_copy_v<P>;
  static_assert(!has_master || requires(const opt_t& o) { o.master_weights(); },
                "save_checkpoint: this precision keeps fp32 master weights, but the optimizer has no "
                "master_weights() view to save them from; add it to optim::adamw");
  if constexpr (!device::host_accessible_v<D>) copy = true;
  const long step = tr.step_count();
  const auto& model = tr.model();
  const auto& optim = tr.optimizer();
  const auto* sync = data_parallel_of(tr);
  int dp = 1, dp_rank = 0;
  bool zero = false;
  if constexpr (!std::is_same_v<decltype(sync), const void*>) {
    if (sync) {
      dp = sync->size();
      dp_rank = sync->rank();
      zero = sync->options().zero1;
    }
  }
  // tensor/pipeline-parallel trainers (train::parallel_trainer): this rank's cell and replica
  int tp_rank = 0, pp_rank = 0;
  if constexpr (requires { model.tp_rank(); model.stage(); }) {
    tp_rank = model.tp_rank();
    pp_rank = model.stage();
  }
  if constexpr (requires { tr.dp_rank(); tr.dp_size(); }) {
    dp_rank = tr.dp_rank();
    dp = tr.dp_size();
  }
  const bool writes_model = dp_rank == 0;  // replicas of a (tp, pp) cell hold the same values
  std::size_t shard = 0;  // ZeRO-1 moment shard elements
  if constexpr (!std::is_same_v<decltype(sync), const void*>)
    if (zero) shard = sync->first_moment_shard().size();
  if (copy) {
    const std::size_t total =
        (writes_model ? G::num_parameters * (sizeof(storage_t) + (has_master ? 1 : 0) * sizeof(master_t) +
                                             (zero ? 0 : 2) * sizeof(master_t))
                      : 0) +
        2 * shard * sizeof(master_t);
    if (staging.size() < total) staging.resize(total);
  }

  std::vector<rank_file> files;
  files.reserve(2);
  rank_file file{checkpoint_file_name(tp_rank, pp_rank), tp_rank, pp_rank, 0, {}, {}, {}};
  std::size_t used = 0;
  auto bytes_of = [&](auto v, auto tag, const std::string& name) {
    using T = decltype(tag);
    std::span<const std::byte> bytes;
    if (copy) {
      D::copy_to_host(staging.data() + used, v.data(), v.bytes(), ctx.stream);
      bytes = {staging.data() + used, v.bytes()};
      used += v.bytes();
    } else if constexpr (device::host_accessible_v<D>) {
      bytes = std::as_bytes(v.span());
    }
    if (opt.check_finite) {
      if (copy) ctx.synchronize();
      if (!all_finite<T>(bytes))
        throw numeric_error("checkpoint of step " + std::to_string(step) + " not saved: tensor '" + name +
                            "' holds NaN or infinite values; the checkpoints in '" + root.string() +
                            "' are unchanged: resume from the last one with a lower learning rate");
    }
    return bytes;
  };
  nlohmann::json tensors = nlohmann::json::array();
  auto add = [&](const std::string& prefix, std::size_t k, auto v, auto tag) {
    using T = decltype(tag);
    const auto& s = G::table[k];
    const std::string name = prefix + "." + std::string(s.name);
    file.tensors.push_back({name, std::string(tensor_dtype<T>()),
                            std::vector<std::int64_t>(s.shape.begin(), s.shape.begin() + s.ndim), bytes_of(v, tag, name)});
  };
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& s = G::table[k];
    if (writes_model) {
      add("param", k, model.parameter(k), storage_t{});
      if constexpr (has_master) add("master", k, optim.master_weights().subview(G::offsets[k], s.size()), master_t{});
      if (!zero) {
        add("adam_m", k, optim.first_moment().subview(G::offsets[k], s.size()), master_t{});
        add("adam_v", k, optim.second_moment().subview(G::offsets[k], s.size()), master_t{});
      }
    }
    const auto g = geometry_of<M>(k);
    tensors.push_back({{"name", std::string(s.name)},
                       {"shard", std::string(shard_name(s.rule))},
                       {"per_layer", g.per_layer},
                       {"sections", g.sections},
                       {"logical_shape", logical_shape<M>(k)},
                       {"local_shape", std::vector<long>(s.shape.begin(), s.shape.begin() + s.ndim)},
                       {"used_on_stages", used_on_stages(s)},
                       {"decay", s.decay}});
  }
  file.metadata = {{"format", "loom.checkpoint.rank"},
                   {"step", std::to_string(step)},
                   {"tp_rank", std::to_string(tp_rank)},
                   {"pp_rank", std::to_string(pp_rank)}};
  if (writes_model) files.push_back(std::move(file));
  if constexpr (!std::is_same_v<decltype(sync), const void*>) {
    if (zero) {
      char name[64];
      std::snprintf(name, sizeof name, "optim-tp%02d-pp%02d-dp%02d.safetensors", tp_rank, pp_rank, dp_rank);
      rank_file o{name, tp_rank, pp_rank, dp_rank, {}, {}, {}};
      const auto ranges = sync->moment_ranges();
      o.owned.resize(ranges.size() * 3 * sizeof(std::int64_t));
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        const std::int64_t row[3] = {std::int64_t(ranges[i].param_offset), std::int64_t(ranges[i].length),
                                     std::int64_t(ranges[i].shard_offset)};
        std::memcpy(o.owned.data() + i * sizeof row, row, sizeof row);
      }
      o.tensors.push_back({"adam_m", std::string(tensor_dtype<master_t>()), {std::int64_t(shard)},
                           bytes_of(sync->first_moment_shard(), master_t{}, "adam_m (ZeRO-1 shard)")});
      o.tensors.push_back({"adam_v", std::string(tensor_dtype<master_t>()), {std::int64_t(shard)},
                           bytes_of(sync->second_moment_shard(), master_t{}, "adam_v (ZeRO-1 shard)")});
      o.tensors.push_back({"ranges", "I64", {std::int64_t(ranges.size()), 3}, std::span<const std::byte>(o.owned)});
      o.metadata = {{"format", "loom.checkpoint.zero1"}, {"step", std::to_string(step)},
                    {"ranges", "rows (param_offset, length, shard_offset) in elements of the parameter buffer"}};
      files.push_back(std::move(o));
    }
  }
  if (copy) ctx.synchronize();

  const auto& cfg = tr.config();
  const auto now = std::time(nullptr);
  char when[32] = "";
  std::tm tm{};
  if (gmtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  nlohmann::json m = {
      {"format", "loom.checkpoint"},
      {"format_version", checkpoint_format_version},
      {"library", {{"name", "loom"}, {"version", std::string(library_version)}}},
      {"created_utc", when},
      {"step", step},
      {"optimizer_step", optim.step()},
      {"tokens", state.tokens},
      {"model",
       {{"name", std::string(M::name)},
        {"arch", std::string(nn::arch_of<M>().name)},
        {"n_layer", M::n_layer},
        {"n_head", M::n_head},
        {"d_model", M::d_model},
        {"max_seq", M::max_seq},
        {"vocab", M::vocab},
        {"vocab_padded", M::vocab_padded}}},
      {"layout",
       {{"tp", L::tp},
        {"pp", L::pp},
        {"dp", dp},
        {"zero", zero ? 1 : 0},
        {"rank_order", "tp fastest, then dp, then pp (Megatron-LM)"}}},
      {"precision",
       {{"name", std::string(P::name)},
        {"storage", std::string(tensor_dtype<storage_t>())},
        {"master", std::string(tensor_dtype<master_t>())},
        {"master_copy", has_master}}},
      {"trainer",
       {{"micro_batch", cfg.micro_batch},
        {"seq_len", cfg.seq_len},
        {"grad_accum", cfg.grad_accum},
        {"seed", cfg.seed},
        {"capacity_micro_batch", Trainer::micro_batch},
        {"capacity_seq_len", Trainer::seq_len}}},
      {"optimizer",
       {{"kind", "adamw"},
        {"beta1", cfg.adamw.beta1},
        {"beta2", cfg.adamw.beta2},
        {"eps", cfg.adamw.eps},
        {"weight_decay", cfg.adamw.weight_decay},
        {"max_grad_norm", cfg.adamw.max_grad_norm},
        {"step", optim.step()}}},
      {"lr_schedule",
       {{"kind", "cosine"},
        {"max_lr", cfg.schedule.max_lr},
        {"min_lr", cfg.schedule.min_lr},
        {"warmup", cfg.schedule.warmup},
        {"decay_steps", cfg.schedule.decay_steps},
        {"step", step},
        {"next_lr", cfg.schedule(step)}}},
      {"loss_scaler", loss_scaler_json(tr)},
      {"rng", state.rng},
      {"data", state.data},
      {"extra", state.extra},
      {"tensors", tensors},
  };
  m["rng"]["init_seed"] = cfg.seed;
  return {std::move(files), std::move(m)};
}

}  // namespace detail

namespace detail {
/// A single-rank save of a ZeRO-1 trainer would miss the other ranks' moment shards.
template <class Trainer>
void require_unsharded(const Trainer& tr, std::string_view api) {
  using L = typename Trainer::model_t::layout;
  if constexpr (L::tp * L::pp > 1)
    throw input_error(std::string(api) + ": this trainer is split over tp = " + std::to_string(L::tp) + ", pp = " +
                      std::to_string(L::pp) + " ranks, so one rank cannot save the model alone; call "
                      "io::save_checkpoint(ctx, root, tr, state, world) on every rank of the world");
  const auto* sync = data_parallel_of(tr);
  if constexpr (!std::is_same_v<decltype(sync), const void*>)
    if (sync && sync->options().zero1)
      throw input_error(std::string(api) + ": this trainer shards its AdamW moments (ZeRO-1), so one rank cannot "
                        "save them alone; call io::save_checkpoint(ctx, root, tr, state, dp_group) on every rank");
}
}  // namespace detail

/// Saves the state of trainer `tr` and the caller's `state` as checkpoint
/// `<root>/step_<tr.step_count()>` (see the file comment for the layout and the protocol),
/// points `<root>/latest` at it, then keeps the newest opt.keep checkpoints. Returns the
/// checkpoint's directory. Blocks until everything is on disk; async_checkpointer is the
/// variant that writes in the background.
///
/// Writes: the rank file and manifest.json; replaces `latest`; removes pruned checkpoints and
/// leftovers of interrupted saves (".tmp-*", ".old-*"). One writer per root at a time.
/// Memory: none extra on host-accessible devices (the file is written straight from the
/// trainer's buffers); a host copy of parameters and moments otherwise.
/// Cost: the bytes (12 per parameter in fp32) written and fsynced once, then read back once to
/// verify their XXH3-64.
/// Errors: loom::numeric_error when a value is not finite (opt.check_finite; nothing is
/// written); loom::input_error when the root cannot be created; loom::error when a write,
/// fsync or rename fails. In every failure before the new directory is in place, nothing
/// changed on disk except the removed temporary directory; the message says so.
template <checkpointable_trainer Trainer>
std::filesystem::path save_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& root,
                                      const Trainer& tr, const run_state& state, const checkpoint_options& opt = {}) {
  detail::require_unsharded(tr, "save_checkpoint");
  std::vector<std::byte> staging;
  auto [files, manifest] = detail::snapshot(ctx, tr, state, opt, root, false, staging);
  return detail::commit_checkpoint(root, tr.step_count(), files, std::move(manifest), opt);
}

/// The collective save of a data-parallel trainer (train::trainer built with a communicator),
/// called by every rank of `world` (its data-parallel group, passed explicitly) with the same
/// root. Rank 0 writes the model file; with ZeRO-1 every rank also writes its AdamW moment
/// shard (optim-tpTT-ppPP-dpDD.safetensors, with the ranges of its cell's parameter buffer it
/// covers: ZeRO, Rajbhandari et al., arXiv:1910.02054, stage 1). The save is complete only
/// when every rank has written and verified its files: the ranks agree before rank 0 renames
/// the directory into place and moves `latest` (detail::commit_checkpoint_collective); if any
/// rank failed, nobody moves `latest`, the temporary directory is removed, and every rank
/// throws loom::error naming each failing rank and its reason. Returns the checkpoint's
/// directory on every rank. Blocking (the communicator cannot serve a background thread while
/// training uses it). Writes straight from the trainer's buffers.
/// Errors: as save_checkpoint, on every rank: a NaN in any rank's state is agreed on first
/// (loom::numeric_error on every rank naming the rank and tensor, nothing written); an I/O
/// failure of any rank is loom::error on every rank naming the rank and its reason.
template <checkpointable_trainer Trainer, class Comm>
  requires parallel::communicator_for<Comm, std::int64_t>
std::filesystem::path save_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& root,
                                      const Trainer& tr, const run_state& state, Comm& world,
                                      const checkpoint_options& opt = {}) {
  std::vector<std::byte> staging;
  std::pair<std::vector<detail::rank_file>, nlohmann::json> snap;
  detail::rank_outcome out;
  try {
    snap = detail::snapshot(ctx, tr, state, opt, root, false, staging);
  } catch (const std::exception& e) {
    out.fail(e.what());
  }
  if (auto failed = detail::agree(world, out); !failed.empty()) throw numeric_error(failed);
  return detail::commit_checkpoint_collective(world, root, tr.step_count(), snap.first, std::move(snap.second), opt);
}

/// Checkpoints written in the background, so that saving holds the training loop only for a
/// copy in memory. save() waits for the previous save, copies parameters and optimizer state
/// into a staging buffer (allocated on the first save, reused after: 12 bytes per parameter in
/// fp32), and returns; a worker thread then writes, verifies and commits the checkpoint exactly
/// as save_checkpoint does (same files, same atomicity; opt.on_stage runs on that thread).
/// The trainer may keep training at once. Not copyable or movable; one saver per root.
///
///   io::async_checkpointer<decltype(tr)> saver;
///   saver.save(ctx, "out/ckpt", tr, state);   // ~ a memcpy of the state
///   ...                                       // training continues while it is written
///   saver.wait();                             // before exit: on disk, or its error rethrown
template <checkpointable_trainer Trainer>
class async_checkpointer {
 public:
  using device = typename Trainer::device;

  async_checkpointer() = default;
  async_checkpointer(const async_checkpointer&) = delete;
  async_checkpointer& operator=(const async_checkpointer&) = delete;
  /// Waits for a save in flight; its error, if any, is dropped: call wait() to see it.
  ~async_checkpointer() {
    if (worker_.joinable()) worker_.join();
  }

  /// Snapshots `tr` and `state` (checkpoint `<root>/step_<tr.step_count()>`) and starts
  /// writing it in the background. First waits for the previous save and rethrows its error
  /// (then nothing new was started: call save() again). Throws loom::numeric_error when a
  /// value is not finite (nothing is written).
  void save(context<device>& ctx, const std::filesystem::path& root, const Trainer& tr, const run_state& state,
            checkpoint_options opt = {}) {
    (void)wait();
    detail::require_unsharded(tr, "async_checkpointer::save");
    auto [files, manifest] = detail::snapshot(ctx, tr, state, opt, root, true, staging_);
    const long step = tr.step_count();
    worker_ = std::thread([this, root, step, opt = std::move(opt), files = std::move(files),
                           manifest = std::move(manifest)]() mutable {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        done_ = detail::commit_checkpoint(root, step, files, std::move(manifest), opt);
      } catch (...) {
        error_ = std::current_exception();
      }
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }

  /// Blocks until the save in flight is on disk and returns its directory (nullopt when no
  /// save was in flight). Rethrows the error the background save raised (once).
  std::optional<std::filesystem::path> wait() {
    if (!worker_.joinable()) return std::nullopt;
    worker_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return done_;
  }

  /// True while a save may still be running (until wait() is called).
  bool pending() const noexcept { return worker_.joinable(); }
  /// Seconds the last finished background save took (write, fsync, verify, commit).
  double last_write_seconds() const noexcept { return seconds_; }

 private:
  std::vector<std::byte> staging_;
  std::thread worker_;
  std::exception_ptr error_;
  std::filesystem::path done_;
  double seconds_ = 0;
};

// ============================================================================================
// Load
// ============================================================================================

/// Loads checkpoint directory `dir` (one step_NNNNNNNN; see find_checkpoint to pick one) into
/// `tr`: parameters, master weights, AdamW moments and step, the trainer's step count. Returns
/// the caller's run_state, the manifest, and warnings for settings of `tr` that differ from
/// the checkpoint's (schedule, optimizer, batch shape, seed), which break bitwise resumption
/// but not loading.
///
/// Any trainer (train::trainer with or without a data-parallel group and ZeRO-1,
/// train::parallel_trainer on any layout<TP,PP>), from a checkpoint of any layout of the same
/// model and storage precision: on the saved (tp, pp) a rank reads its own file (bitwise); on
/// another one it reads every model file, gathers each logical tensor and cuts its own shard
/// (gather_tensor, shard_tensor; non-per-layer tensors from the stage that uses them). ZeRO-1
/// moments (either side, any dp size) are gathered from the shards by their ranges and re-split
/// by this rank's parallel::moment_range list. A changed layout or dp size is a warning (not
/// bit for bit). Called on every rank; no communication.
///
/// All-or-nothing: every check runs before the first byte is copied into `tr`.
/// Memory: with the same layout and no ZeRO-1, none beyond the mapped file; otherwise this
/// rank's resharded state on the host, one logical tensor at a time, plus the whole moments
/// when ZeRO-1 is on either side.
/// Errors (loom::input_error): the checkpoint fails verify_checkpoint; it was saved for another
/// model config or storage precision (naming both); a file of the saved layout, a tensor or a
/// ZeRO-1 range is missing, or has another shape or dtype; the saved layout does not divide the
/// model.
template <checkpointable_trainer Trainer>
checkpoint_info load_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& dir, Trainer& tr) {
  using G = typename Trainer::model_t;
  using M = typename G::model;
  using P = typename G::precision;
  using L = typename G::layout;
  using storage_t = typename P::storage;
  using opt_t = std::remove_cvref_t<decltype(tr.optimizer())>;
  using master_t = typename opt_t::master_t;
  constexpr bool has_master = precision::has_master_copy_v<P>;
  using D = typename Trainer::device;

  nlohmann::json j = verify_checkpoint(dir);
  auto mismatch = [&](const std::string& theirs, const std::string& ours, const std::string& fix) {
    return input_error("checkpoint '" + dir.string() + "' was saved with " + theirs + ", but this run has " + ours +
                       "; " + fix);
  };
  const auto& model_j = detail::field<nlohmann::json>(j, "model", dir);
  const std::pair<const char*, long> dims[] = {{"n_layer", M::n_layer}, {"n_head", M::n_head},   {"d_model", M::d_model},
                                               {"max_seq", M::max_seq}, {"vocab", M::vocab},     {"vocab_padded", M::vocab_padded}};
  if (const std::string arch = detail::string_or(model_j, "arch", "gpt2"); arch != nn::arch_of<M>().name)
    throw mismatch("architecture '" + arch + "' (model " + detail::string_or(model_j, "name", "?") + ")",
                   "architecture '" + std::string(nn::arch_of<M>().name) + "' (model " + std::string(M::name) + ")",
                   "resume with the checkpoint's --model, or start a new run");
  for (const auto& [key, ours] : dims) {
    const long theirs = detail::field<long>(model_j, key, dir);
    if (theirs != ours)
      throw mismatch("model " + detail::string_or(model_j, "name", "?") + " (" + key + " = " + std::to_string(theirs) + ")",
                     "model " + std::string(M::name) + " (" + key + " = " + std::to_string(ours) + ")",
                     "resume with the checkpoint's --model, or start a new run");
  }
  const auto& layout_j = detail::field<nlohmann::json>(j, "layout", dir);
  const int tp = detail::field<int>(layout_j, "tp", dir), pp = detail::field<int>(layout_j, "pp", dir);
  const int zero = detail::field<int>(layout_j, "zero", dir);
  if (tp < 1 || pp < 1 || M::n_layer % pp != 0)
    throw detail::bad_checkpoint(dir, "its layout tp = " + std::to_string(tp) + ", pp = " + std::to_string(pp) +
                                          " cannot hold model " + std::string(M::name));
  const bool same_layout = tp == L::tp && pp == L::pp;  // else: reshard (gather_tensor, shard_tensor)
  int my_tp = 0, my_pp = 0;
  if constexpr (requires { tr.model().tp_rank(); tr.model().stage(); }) {
    my_tp = tr.model().tp_rank();
    my_pp = tr.model().stage();
  }
  if (zero != 0 && zero != 1)
    throw detail::bad_checkpoint(dir, "its layout has zero = " + std::to_string(zero) + " (loom writes 0 or 1)");
  // ZeRO-1 on either side: the moments are a flat array split by ranges, so any data-parallel
  // size and either setting loads (gather the saved shards, re-split by this rank's ranges).
  const auto* sync = detail::data_parallel_of(tr);
  bool dst_zero = false;
  struct piece {
    std::size_t param_offset, length, shard_offset;
  };
  std::vector<piece> my_ranges;  // this rank's parallel::moment_range list
  if constexpr (!std::is_same_v<decltype(sync), const void*>)
    if (sync && sync->options().zero1) {
      dst_zero = true;
      for (const auto& q : sync->moment_ranges()) my_ranges.push_back({q.param_offset, q.length, q.shard_offset});
    }
  const bool src_zero = zero == 1;
  std::vector<master_t> full_m, full_v;  // this rank's whole moments on the host, when it is ZeRO-1
  if (dst_zero) {
    full_m.assign(G::num_parameters, master_t(0));
    full_v.assign(G::num_parameters, master_t(0));
  }
  const auto& prec_j = detail::field<nlohmann::json>(j, "precision", dir);
  const auto storage = detail::field<std::string>(prec_j, "storage", dir);
  if (storage != detail::tensor_dtype<storage_t>())
    throw mismatch("storage precision " + storage,
                   "storage precision " + std::string(detail::tensor_dtype<storage_t>()) + " (" + std::string(P::name) + ")",
                   "resume with the checkpoint's precision");

  const auto files = detail::manifest_files(j, dir);
  // The model files this rank reads: its own (same layout), or every (tp, pp) one (resharding).
  std::map<std::pair<int, int>, std::unique_ptr<safetensors_reader>> readers;
  for (const auto& f : files)
    if (f.path.rfind("model-", 0) == 0 && (!same_layout || (f.tp == my_tp && f.pp == my_pp)))
      readers[{f.tp, f.pp}] = std::make_unique<safetensors_reader>(dir / f.path);
  for (int a = 0; a < (same_layout ? 1 : tp); ++a)
    for (int b = 0; b < (same_layout ? 1 : pp); ++b) {
      const int ta = same_layout ? my_tp : a, pb = same_layout ? my_pp : b;
      if (!readers.count({ta, pb}))
        throw detail::bad_checkpoint(dir, "its layout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                                              " needs a model file of rank tp=" + std::to_string(ta) + " pp=" +
                                              std::to_string(pb) + ", which manifest.json does not list");
    }
  std::deque<std::vector<std::byte>> owned;  // resharded tensors, until they are copied

  // ZeRO-1 checkpoint: the whole first and second moments of saved cell (tp r, stage st),
  // gathered from its optim-tpRR-ppSS-dp* shard files by their ranges (the cell's buffer in
  // param_table order: tensor k's shard_elems under the saved degrees), once per cell.
  std::map<std::pair<int, int>, std::pair<std::vector<master_t>, std::vector<master_t>>> zero1_cells;
  auto zero1_moment = [&](bool first, std::size_t k, int r, int st) -> std::span<const std::byte> {
    auto it = zero1_cells.find({r, st});
    if (it == zero1_cells.end()) {
      std::size_t n = 0;
      for (std::size_t j = 0; j < G::num_tensors; ++j) n += shard_elems(geometry_of<M>(j), tp, pp);
      std::vector<master_t> m(n, master_t(0)), v(n, master_t(0));
      detail::gather_zero1_moments(dir, files, r, st, std::span<master_t>(m), std::span<master_t>(v));
      it = zero1_cells.emplace(std::pair{r, st}, std::pair{std::move(m), std::move(v)}).first;
    }
    std::size_t off = 0;
    for (std::size_t j = 0; j < k; ++j) off += shard_elems(geometry_of<M>(j), tp, pp);
    const auto& whole = first ? it->second.first : it->second.second;
    return std::as_bytes(std::span<const master_t>(whole.data() + off, shard_elems(geometry_of<M>(k), tp, pp)));
  };

  // The bytes of this rank's local tensor "<prefix>.<name k>" of dtype `dtype`: a view of its
  // own file (same layout), or gathered from the saved layout's files and re-split for this
  // rank (io::gather_tensor, io::shard_tensor). Throws bad_checkpoint on a missing tensor or
  // another dtype or shape.
  auto source = [&](const std::string& prefix, std::size_t k, std::string_view dtype) -> std::span<const std::byte> {
    const auto& s = G::table[k];
    const std::string name = prefix + "." + std::string(s.name);
    auto check = [&](const safetensors_reader& r, const std::vector<std::int64_t>* shape) {
      if (!r.has(name)) throw detail::bad_checkpoint(dir, "its file '" + r.path().filename().string() + "' has no tensor '" + name + "'");
      const auto& info = r.info(name);
      if (info.dtype != dtype || (shape && info.shape != *shape))
        throw detail::bad_checkpoint(dir, "tensor '" + name + "' is " + info.dtype + " " + detail::shape_string(info.shape) +
                                              ", this model needs " + std::string(dtype) +
                                              (shape ? " " + detail::shape_string(*shape) : std::string()));
      return r.bytes(name);
    };
    // ZeRO-1 moments come from the optim-* shard files of the saved cell, not its model file
    const bool sharded = src_zero && (prefix == "adam_m" || prefix == "adam_v");
    auto cell = [&](int r, int st, const std::vector<std::int64_t>* shape) {
      return sharded ? zero1_moment(prefix == "adam_m", k, r, st) : check(*readers.at({r, st}), shape);
    };
    if (same_layout) {
      const std::vector<std::int64_t> shape(s.shape.begin(), s.shape.begin() + s.ndim);
      return cell(my_tp, my_pp, &shape);
    }
    const auto g = geometry_of<M>(k);
    const std::size_t elem = detail::dtype_size(std::string(dtype));
    const auto logical = gather_tensor(g, elem, [&](int r, int st) {
      return cell(r, g.per_layer ? st : nn::owner_stage(G::table[k], pp), nullptr);
    }, tp, pp);
    owned.push_back(shard_tensor(g, elem, logical, L::tp, L::pp, my_tp, my_pp));
    return owned.back();
  };

  // Check every tensor before touching the trainer.
  struct copy_job {
    std::span<const std::byte> src;
    std::byte* dst;
    bool host = false;  ///< dst is host memory (full_m / full_v), not the trainer's
  };
  std::vector<copy_job> jobs;
  auto plan = [&](const std::string& prefix, std::size_t k, std::byte* dst, bool host, std::string_view dtype) {
    const auto src = source(prefix, k, dtype);
    const std::size_t want = G::table[k].size() * detail::dtype_size(std::string(dtype));
    if (src.size() != want)
      throw detail::bad_checkpoint(dir, "tensor '" + prefix + "." + std::string(G::table[k].name) + "' has " +
                                            std::to_string(src.size()) + " bytes for this rank, not " + std::to_string(want));
    jobs.push_back({src, dst, host});
  };
  auto dev = [](auto v) { return reinterpret_cast<std::byte*>(v.data()); };
  auto& model = tr.model();
  auto& optim = tr.optimizer();
  const std::string_view mdtype = detail::tensor_dtype<master_t>();
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& s = G::table[k];
    plan("param", k, dev(model.parameter(k)), false, detail::tensor_dtype<storage_t>());
    if constexpr (has_master) plan("master", k, dev(optim.master_weights().subview(G::offsets[k], s.size())), false, mdtype);
    // moments: from the model file or, for a ZeRO-1 checkpoint, its shards (source: zero1_moment);
    // into the optimizer, or with ZeRO-1 here into the whole host moments, split by ranges below
    if (dst_zero) {
      plan("adam_m", k, reinterpret_cast<std::byte*>(full_m.data() + G::offsets[k]), true, mdtype);
      plan("adam_v", k, reinterpret_cast<std::byte*>(full_v.data() + G::offsets[k]), true, mdtype);
    } else {
      plan("adam_m", k, dev(optim.first_moment().subview(G::offsets[k], s.size())), false, mdtype);
      plan("adam_v", k, dev(optim.second_moment().subview(G::offsets[k], s.size())), false, mdtype);
    }
  }

  checkpoint_info out;
  out.dir = dir;
  out.step = detail::field<long>(j, "step", dir);
  out.optimizer_step = detail::field<long>(j, "optimizer_step", dir);
  out.state.tokens = detail::field<std::uint64_t>(j, "tokens", dir);
  out.state.data = j.value("data", nlohmann::json::object());
  out.state.rng = j.value("rng", nlohmann::json::object());
  out.state.extra = j.value("extra", nlohmann::json::object());
  if (out.step < 0 || out.optimizer_step < 0 || out.optimizer_step > out.step)
    throw detail::bad_checkpoint(dir, "its step counts (step " + std::to_string(out.step) + ", optimizer step " +
                                          std::to_string(out.optimizer_step) + ") are inconsistent");

  // Differences that break bitwise resumption, reported, not fatal.
  const auto& cfg = tr.config();
  auto differs = [&](const nlohmann::json& section, const char* key, const auto& ours) {
    using V = std::remove_cvref_t<decltype(ours)>;
    const auto f = section.find(key);
    if (f == section.end()) return;
    V theirs{};
    try {
      theirs = f->template get<V>();
    } catch (const nlohmann::json::exception&) {
      return;
    }
    if (theirs != ours)
      out.warnings.push_back(std::string(key) + " is " + nlohmann::json(ours).dump() + " now but " + f->dump() +
                             " in the checkpoint: the run continues, but not bit for bit as the original would have");
  };
  const auto sched = j.value("lr_schedule", nlohmann::json::object());
  differs(sched, "max_lr", cfg.schedule.max_lr);
  differs(sched, "min_lr", cfg.schedule.min_lr);
  differs(sched, "warmup", cfg.schedule.warmup);
  differs(sched, "decay_steps", cfg.schedule.decay_steps);
  const auto opt_j = j.value("optimizer", nlohmann::json::object());
  differs(opt_j, "beta1", cfg.adamw.beta1);
  differs(opt_j, "beta2", cfg.adamw.beta2);
  differs(opt_j, "eps", cfg.adamw.eps);
  differs(opt_j, "weight_decay", cfg.adamw.weight_decay);
  differs(opt_j, "max_grad_norm", cfg.adamw.max_grad_norm);
  const auto tr_j = j.value("trainer", nlohmann::json::object());
  differs(tr_j, "micro_batch", cfg.micro_batch);
  differs(tr_j, "seq_len", cfg.seq_len);
  differs(tr_j, "grad_accum", cfg.grad_accum);
  int dp_now = 1;
  if constexpr (!std::is_same_v<decltype(sync), const void*>)
    if (sync) dp_now = sync->size();
  if constexpr (requires { tr.dp_size(); }) dp_now = tr.dp_size();
  if (!same_layout)
    out.warnings.push_back("the checkpoint was saved on tp = " + std::to_string(tp) + ", pp = " + std::to_string(pp) +
                           " and is resharded onto tp = " + std::to_string(L::tp) + ", pp = " + std::to_string(L::pp) +
                           ": the run continues within fp32 tolerance, not bit for bit (another summation order)");
  if (const int dp_then = layout_j.value("dp", 1); dp_then != dp_now)
    out.warnings.push_back("the data-parallel size is " + std::to_string(dp_now) + " now but " + std::to_string(dp_then) +
                           " in the checkpoint (optimizer state resharded): the run continues, but not bit for bit as "
                           "the original would have (another global batch or summation order)");

  // the loss scaler's state (scale, good steps), when both the checkpoint and this trainer have one
  std::optional<precision::loss_scaler_state> scaler_state;
  if constexpr (requires { tr.loss_scaler().set_state(precision::loss_scaler_state{}); Trainer::scaler_t::enabled; }) {
    const auto ls = j.value("loss_scaler", nlohmann::json::object());
    if (Trainer::scaler_t::enabled && ls.value("enabled", false)) {
      try {
        scaler_state = precision::loss_scaler_state{ls.at("scale").get<double>(), ls.at("growth_tracker").get<long>()};
      } catch (const nlohmann::json::exception&) {
        throw detail::bad_checkpoint(dir, "its loss_scaler section has no numeric scale and growth_tracker");
      }
      if (!(scaler_state->scale > 0) || !std::isfinite(scaler_state->scale) || scaler_state->good_steps < 0)
        throw detail::bad_checkpoint(dir, "its loss scale " + std::to_string(scaler_state->scale) + " is not positive and finite");
    } else if (Trainer::scaler_t::enabled) {
      out.warnings.push_back("the checkpoint has no loss scaler state: the loss scale starts again at its initial value");
    }
  }

  for (const auto& job : jobs)
    if (job.host) std::memcpy(job.dst, job.src.data(), job.src.size());
    else D::copy_to_device(job.dst, job.src.data(), job.src.size(), ctx.stream);
  if (dst_zero) {
    if constexpr (!std::is_same_v<decltype(sync), const void*>) {
      const auto m = sync->first_moment_shard(), v = sync->second_moment_shard();
      for (const auto& q : my_ranges) {
        D::copy_to_device(m.data() + q.shard_offset, full_m.data() + q.param_offset, q.length * sizeof(master_t), ctx.stream);
        D::copy_to_device(v.data() + q.shard_offset, full_v.data() + q.param_offset, q.length * sizeof(master_t), ctx.stream);
      }
    }
  }
  ctx.synchronize();
  if constexpr (requires { tr.loss_scaler().set_state(precision::loss_scaler_state{}); })
    if (scaler_state) tr.loss_scaler().set_state(*scaler_state);
  tr.set_step_count(out.step);
  optim.set_step(out.optimizer_step);
  out.manifest = std::move(j);
  return out;
}

/// find_checkpoint(dir, warn) then load_checkpoint: what `train_gpt --resume DIR` does.
template <checkpointable_trainer Trainer>
checkpoint_info resume_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& dir, Trainer& tr,
                                  const std::function<void(const std::string&)>& warn = {}) {
  return load_checkpoint(ctx, find_checkpoint(dir, warn), tr);
}

// ============================================================================================
// Hugging Face GPT-2 export / import
// ============================================================================================

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
/// nn::for_each_tensor): wte, wpe, h.{i}.(ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
/// mlp.c_proj).(weight, bias), ln_f; names and orientation from the table rows (hf_name,
/// hf_transposed). Vocabulary-sharded rows have M::vocab rows (loom's padding rows are not
/// exported). Source: transformers modeling_gpt2.py (GPT2Model, GPT2Attention, GPT2MLP, Conv1D).
/// Refused at compile time for a recipe without a GPT-2 equivalent (nn::recipe::hf_model_type).
template <models::model_config M>
std::vector<gpt2_tensor> gpt2_tensors() {
  static_assert(nn::arch_of<M>().hf_model_type == "gpt2",
                "Hugging Face GPT-2 export/import: this model's recipe has tensors GPT-2 does not (or lacks some "
                "of its tensors); export it with io::save_weights instead");
  constexpr auto t = nn::param_table<M, parallel::layout<1, 1>>();
  std::vector<gpt2_tensor> out;
  nn::for_each_tensor(t, M::n_layer, [&](std::size_t k, int layer) {
    const auto& s = t[k];
    const std::size_t first = s.per_layer ? 1 : 0;
    std::vector<std::int64_t> shape(s.global.begin() + first, s.global.begin() + s.ndim);
    if (s.rule == nn::shard::vocab) shape[0] = M::vocab;
    if (s.hf_transposed) std::swap(shape[0], shape[1]);
    out.push_back({nn::hf_name(s, layer), std::move(shape), int(k), layer, s.hf_transposed});
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

/// Exports the parameters of `model` (a loom::gpt on layout<1,1>) as a Hugging Face GPT-2
/// checkpoint: `<dir>/model.safetensors` (F32, GPT-2 names and Conv1D orientation, metadata
/// {"format": "pt"} as transformers requires) and `<dir>/config.json`. Loads with
/// transformers.GPT2LMHeadModel.from_pretrained(dir). Each file is written atomically.
/// Errors: loom::input_error when `dir` cannot be created; loom::error when a write fails.
template <class G>
void export_gpt2(context<typename G::device>& ctx, const G& model, const std::filesystem::path& dir) {
  using M = typename G::model;
  using T = typename G::storage_t;
  static_assert(G::layout::tp == 1 && G::layout::pp == 1,
                "export_gpt2: export from one rank holding the whole model (gather the shards first)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw input_error("cannot create the export directory '" + dir.string() + "' (" + ec.message() +
                      "); check the path and its permissions");
  std::vector<T> staged;  // only for devices the host cannot read
  const T* host = model.parameters().data();
  if constexpr (!device::host_accessible_v<typename G::device>) {
    staged.resize(G::num_parameters);
    G::device::copy_to_host(staged.data(), model.parameters().data(), model.parameters().bytes(), ctx.stream);
    ctx.synchronize();
    host = staged.data();
  }
  const auto tensors = gpt2_tensors<M>();
  std::vector<std::size_t> first(tensors.size() + 1, 0);  // element offsets in `all`
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::size_t n = 1;
    for (auto d : tensors[i].shape) n *= std::size_t(d);
    first[i + 1] = first[i] + n;
  }
  std::vector<float> all(first.back());
  std::vector<detail::tensor_ref> refs;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::gpt2_from_loom<M>(tensors[i], host + detail::loom_offset<G>(tensors[i]), all.data() + first[i]);
    refs.push_back({tensors[i].name, "F32", tensors[i].shape,
                    std::as_bytes(std::span<const float>(all.data() + first[i], first[i + 1] - first[i]))});
  }
  (void)detail::write_safetensors(dir / "model.safetensors", refs, {{"format", "pt"}, {"loom_model", std::string(M::name)}});
  detail::write_file_atomic(dir / "config.json", gpt2_config<M>().dump(2) + "\n");
}

/// Loads Hugging Face GPT-2 weights from `dir` (config.json and model.safetensors, as written
/// by export_gpt2 or transformers' save_pretrained; names may carry a "transformer." prefix;
/// F32, F16 or BF16) into `model`. loom's padding rows of wte (vocab..vocab_padded) are set to 0.
/// Extra tensors (attn.bias masks, a tied lm_head.weight) are ignored.
/// All-or-nothing: every check runs before `model` is written.
/// Errors (loom::input_error): a file is missing or corrupt; config.json describes another
/// shape (naming the key and both values), another activation or LayerNorm epsilon; a tensor is
/// missing or has the wrong shape; lm_head.weight differs from wte.weight (an untied head,
/// which loom's GPT does not have).
template <class G>
void import_gpt2(context<typename G::device>& ctx, G& model, const std::filesystem::path& dir) {
  using M = typename G::model;
  using T = typename G::storage_t;
  static_assert(G::layout::tp == 1 && G::layout::pp == 1, "import_gpt2: import into one rank holding the whole model");
  const auto cpath = dir / "config.json";
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(detail::read_small_file(cpath));
  } catch (const nlohmann::json::exception& e) {
    throw input_error("'" + cpath.string() + "' is not valid JSON (" + e.what() + "); export the model again");
  } catch (const input_error& e) {
    throw input_error(std::string(e.what()) + "; pass a directory with a GPT-2 config.json and model.safetensors");
  }
  if (!cfg.is_object()) throw input_error("'" + cpath.string() + "' is not a JSON object; export the model again");
  if (cfg.contains("model_type") && cfg["model_type"] != "gpt2")
    throw input_error("'" + cpath.string() + "' describes a " + cfg["model_type"].dump() + " model, not gpt2; "
                      "loom imports GPT-2 checkpoints only");
  const std::pair<const char*, long> dims[] = {{"n_layer", M::n_layer}, {"n_head", M::n_head}, {"n_embd", M::d_model},
                                               {"n_positions", M::max_seq}, {"vocab_size", M::vocab}};
  for (const auto& [key, ours] : dims) {
    const auto f = cfg.find(key);
    if (f == cfg.end() || !f->is_number_integer())
      throw input_error("'" + cpath.string() + "' has no integer \"" + key + "\"; it is not a GPT-2 config.json");
    if (f->template get<long>() != ours)
      throw input_error("'" + cpath.string() + "' has " + key + " = " + f->dump() + " but model " + std::string(M::name) +
                        " has " + std::to_string(ours) + "; choose the matching --model");
  }
  const std::string act = detail::string_or(cfg, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw input_error("'" + cpath.string() + "' uses activation " + act + "; loom's GPT uses the tanh GELU (gelu_new)");
  const auto eps_it = cfg.find("layer_norm_epsilon");
  if (const double e = eps_it != cfg.end() && eps_it->is_number() ? eps_it->get<double>() : 1e-5; std::abs(e - 1e-5) > 1e-12)
    throw input_error("'" + cpath.string() + "' has layer_norm_epsilon " + std::to_string(e) + "; loom's LayerNorm uses 1e-5");
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null() && cfg["n_inner"] != 4 * M::d_model)
    throw input_error("'" + cpath.string() + "' has n_inner " + cfg["n_inner"].dump() + "; loom's MLP is 4*n_embd wide");

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
