#pragma once
// train_gpt's weights file (--out, default out/<model>.safetensors), used by the run loop
// (train_gpt/run.cpp): a run never loses the weights an earlier run left at --out. Not a
// library header: examples/ only.
//
// The first write of a run keeps the file already at --out as <stem>.previous-<k><extension>
// (out/quickstart.safetensors -> out/quickstart.previous-1.safetensors, the first k >= 1 not
// taken: the scheme of the metrics log's metrics.previous-<k>.jsonl), then writes the new
// weights atomically over --out. Later writes of the same run replace only that run's own file.
// A --resume'd run keeps the file too: it is the interrupted part's weights (e.g. at
// --stop-at-step), which its checkpoints may since have pruned.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include <loom/core/error.hpp>

namespace train_gpt_cli {

/// `out` with ".previous-<k>" before its extension, the name an earlier run's file is kept
/// under (weights and metrics log): out/quickstart.safetensors, 1 ->
/// out/quickstart.previous-1.safetensors; out/logs/metrics.jsonl, 2 -> out/logs/metrics.previous-2.jsonl.
inline std::filesystem::path previous_run_name(const std::filesystem::path& out, int k) {
  return out.parent_path() / (out.stem().string() + ".previous-" + std::to_string(k) + out.extension().string());
}

/// Where keep_previous_weights put the file it found: `path` (empty when there was none),
/// `linked` when it is a second name of the file still at `out` (a hard link), false when the
/// file was renamed away from `out`.
struct kept_weights {
  std::filesystem::path path;
  bool linked = false;
};

/// Keeps the file at `out` (if any) under the first free previous_run_name(out, k), k >= 1:
/// as a hard link, so that `out` stays in place until an atomic write replaces it (a reader
/// always finds a complete file there); where the file system has no hard links, by a rename.
/// Never replaces an existing file. Throws loom::error when neither the link nor the rename works.
inline kept_weights keep_previous_weights(const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return {};
  bool links = true;
  for (int k = 1; k < 1000000; ++k) {
    const fs::path kept = previous_run_name(out, k);
    if (links) {
      if (::link(out.c_str(), kept.c_str()) == 0) return {kept, true};
      if (errno == EEXIST) continue;
      links = false;  // EPERM, ENOTSUP, EMLINK...: no hard link here, rename instead
    }
    if (fs::exists(fs::symlink_status(kept, ec))) continue;
    fs::rename(out, kept, ec);
    if (!ec) return {kept, false};
    throw loom::error("cannot keep the previous weights '" + out.string() + "' as '" + kept.string() + "': " +
                      ec.message() + "; move it away yourself, or pass another --out");
  }
  throw loom::error("cannot keep the previous weights '" + out.string() + "': every name up to " +
                    previous_run_name(out, 999999).string() + " is taken; move some away, or pass another --out");
}

/// A run's weights file: write() writes it, and the first write keeps the file an earlier run
/// left there (keep_previous_weights); later writes of the same run replace the run's own file.
class weights_file {
 public:
  explicit weights_file(std::filesystem::path out) : out_(std::move(out)) {}

  /// The weights path (--out).
  const std::filesystem::path& path() const noexcept { return out_; }

  /// Calls `write()`, which must write path() atomically (temporary file, fsync, rename, such
  /// as io::save_weights), keeping an earlier run's file first on this object's first write.
  /// Returns where that file was kept, or an empty path (nothing was there, or not the first
  /// write). When `write` throws, the kept name is undone (the link removed, or the file
  /// renamed back, while `out` still holds the old file or nothing) and the exception goes on.
  template <class Write>
  std::filesystem::path write(Write&& write) {
    const kept_weights kept = written_ ? kept_weights{} : keep_previous_weights(out_);
    try {
      std::forward<Write>(write)();
    } catch (...) {
      undo(kept);
      throw;
    }
    written_ = true;
    return kept.path;
  }

 private:
  /// After a failed write: `out_` as it was before keep_previous_weights, where the write did
  /// not replace it (a write that failed after its rename leaves the new file and the kept one).
  void undo(const kept_weights& kept) const noexcept {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (kept.path.empty()) return;
    if (kept.linked && fs::equivalent(out_, kept.path, ec))
      fs::remove(kept.path, ec);
    else if (!kept.linked && !fs::exists(fs::symlink_status(out_, ec)))
      fs::rename(kept.path, out_, ec);
  }

  std::filesystem::path out_;
  bool written_ = false;  ///< a write succeeded: the file at out_ is this run's
};

}  // namespace train_gpt_cli
