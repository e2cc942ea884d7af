#pragma once
/// \file The checkpoint's names and manifest: what a checkpoint directory holds and how it is
/// verified and found (docs/checkpoint.md "On disk"). No template but the typed field reader;
/// no trainer, no device.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/models/params.hpp>
#include <loom/precision/loss_scaler.hpp>

namespace loom::io {

/// The library version recorded in every manifest (the CMake project version).
inline constexpr std::string_view library_version = "0.1.0";
/// Manifest format written by this header; readers accept versions <= this one.
inline constexpr int checkpoint_format_version = 1;

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
  std::optional<precision::loss_scaler_state> loss_scaler;  ///< restored loss scaler state, when both sides have one
  run_state state;                    ///< as given to save_checkpoint
  nlohmann::json manifest;            ///< the whole manifest
  std::vector<std::string> warnings;  ///< settings of the running trainer that differ from the checkpoint's
};

/// A complete-looking checkpoint directory found under a root (not yet verified).
struct checkpoint_entry {
  long step = 0;
  std::filesystem::path dir;
};

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

namespace detail {

inline constexpr std::string_view manifest_name = "manifest.json";
inline constexpr std::string_view latest_name = "latest";

inline std::string_view shard_name(models::shard s) {
  switch (s) {
    case models::shard::replicated: return "replicated";
    case models::shard::column: return "column";
    case models::shard::row: return "row";
    case models::shard::vocab: return "vocab";
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
inline std::string manifest_checksum(nlohmann::json j) { return json_xxh3(std::move(j)); }

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

/// j[key] as T; throws bad_checkpoint when it is missing, of another type, or (integers) not
/// representable as T: a manifest is outside data, and a 64-digit "format_version" must be an
/// error, not a float-to-int conversion.
template <class T>
T field(const nlohmann::json& j, std::string_view key, const std::filesystem::path& dir) {
  if (!j.is_object()) throw bad_checkpoint(dir, "manifest.json has a section that is not an object");
  const auto it = j.find(key);
  if (it == j.end()) throw bad_checkpoint(dir, "manifest.json has no \"" + std::string(key) + "\"");
  auto wrong = [&](const std::string& what) {
    return bad_checkpoint(dir, "manifest.json field \"" + std::string(key) + "\" " + what);
  };
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (it->is_number_unsigned()) {
      const auto v = it->template get<std::uint64_t>();
      if (v > std::uint64_t(std::numeric_limits<T>::max()))
        throw wrong("is " + std::to_string(v) + ", outside the range of its type");
      return T(v);
    }
    if (it->is_number_integer()) {
      const auto v = it->template get<std::int64_t>();
      if (std::is_unsigned_v<T> ? v < 0 : (v < std::int64_t(std::numeric_limits<T>::min()) ||
                                           v > std::int64_t(std::numeric_limits<T>::max())))
        throw wrong("is " + std::to_string(v) + ", outside the range of its type");
      return T(v);
    }
    throw wrong("is " + std::string(it->type_name()) + " " + it->dump().substr(0, 40) + ", not an integer");
  } else {
    try {
      return it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      throw wrong("has the wrong type (" + std::string(it->type_name()) + ")");
    }
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
    j = parse_json(text, "checkpoint '" + dir.string() + "': manifest.json",
                   "resume from an earlier checkpoint (pass its directory to --resume) or start a new run");
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

}  // namespace loom::io
