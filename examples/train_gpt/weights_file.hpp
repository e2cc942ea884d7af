#pragma once
// train_gpt's weights file (--out, default out/<model>.safetensors), used by the run loop
// (train_gpt/run.cpp): a run never loses the weights an earlier run left at --out. Not a
// library header: examples/ only.
//
// The first write of a run keeps the file already at --out as <stem>.previous-<k><extension>
// (out/quickstart.safetensors -> out/quickstart.previous-1.safetensors, the first k >= 1 not
// taken: the scheme of the metrics log's metrics.previous-<k>.jsonl; examples/keep_previous.hpp),
// then writes the new weights atomically over --out. Later writes of the same run replace only
// that run's own file.
// A --resume'd run keeps the file too: it is the interrupted part's weights (e.g. at
// --stop-at-step), which its checkpoints may since have pruned.
#include <filesystem>
#include <span>
#include <utility>

#include "../keep_previous.hpp"  // previous_run_name, keep_previous, undo_keep

namespace train_gpt_cli {

using loom_examples::previous_run_name;

/// A run's weights file: write() writes it, and the first write keeps the file an earlier run
/// left there (loom_examples::keep_previous); later writes of the same run replace the run's own file.
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
    const loom_examples::kept_file kept =
        written_ ? loom_examples::kept_file{out_, {}, false}
                 : loom_examples::keep_previous(std::span(&out_, 1), "pass another --out").front();
    try {
      std::forward<Write>(write)();
    } catch (...) {
      loom_examples::undo_keep(kept);
      throw;
    }
    written_ = true;
    return kept.kept;
  }

 private:
  std::filesystem::path out_;
  bool written_ = false;  ///< a write succeeded: the file at out_ is this run's
};

}  // namespace train_gpt_cli
