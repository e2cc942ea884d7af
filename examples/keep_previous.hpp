#pragma once
// What an earlier run left at an output path is kept, never lost: train_gpt's weights file
// (train_gpt/weights_file.hpp) and prepare_data's dataset (PREFIX.bin, .idx, .model, .json)
// go through here. Not a library header: examples/ only.
//
// The file at `out` is kept as <stem>.previous-<k><extension> (out/quickstart.safetensors ->
// out/quickstart.previous-1.safetensors, out/shakespeare.bin -> out/shakespeare.previous-1.bin),
// k the first number >= 1 at which no name of the files written together is taken (one k for
// a dataset's four files), as a hard link: `out` stays in place until the new file replaces it
// atomically, so a reader always finds a complete file there. Where the file system has no
// hard links, the file is renamed instead. A kept name never replaces an existing file.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>

namespace loom_examples {

/// `out` with ".previous-<k>" before its extension, the name an earlier run's file is kept
/// under (weights, dataset files, metrics log): out/quickstart.safetensors, 1 ->
/// out/quickstart.previous-1.safetensors; out/logs/metrics.jsonl, 2 -> out/logs/metrics.previous-2.jsonl.
inline std::filesystem::path previous_run_name(const std::filesystem::path& out, int k) {
  return out.parent_path() / (out.stem().string() + ".previous-" + std::to_string(k) + out.extension().string());
}

/// The files kept from earlier runs for `out` that exist now (previous_run_name(out, k) for any
/// k >= 1), in increasing k (oldest first). Empty when there are none or the folder cannot be read.
inline std::vector<std::filesystem::path> previous_runs(const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  const std::string head = out.stem().string() + ".previous-", tail = out.extension().string();
  std::vector<std::pair<int, fs::path>> found;
  std::error_code ec;
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= head.size() + tail.size() || !name.starts_with(head) || !name.ends_with(tail)) continue;
    const std::string_view digits(name.data() + head.size(), name.size() - head.size() - tail.size());
    int k = 0;
    const auto [end_of_k, err] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (err != std::errc() || end_of_k != digits.data() + digits.size() || k < 1 || digits[0] == '0') continue;
    found.emplace_back(k, out.parent_path() / name);
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

/// Bounds what keep_previous and its like accumulate: of the earlier runs' copies `copies` (e.g.
/// previous_runs(out)), removes all but the `keep` last modified (0: keeps all). By age, not by
/// k: keep_previous takes the first free k, so after a removal the newest copy may have the
/// lowest k (a kept weights file is a hard link, whose time is its run's write; a kept folder's
/// is when the run's files were moved in). Returns one line per copy removed, naming it and
/// `flag`. A copy that cannot be removed is left, with a line saying so; nothing else is touched.
inline std::vector<std::string> drop_oldest(const std::vector<std::filesystem::path>& copies, int keep,
                                            std::string_view flag) {
  std::vector<std::string> lines;
  if (keep <= 0 || copies.size() <= std::size_t(keep)) return lines;
  std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> aged;
  for (const auto& c : copies) {
    std::error_code ec;
    const auto t = std::filesystem::last_write_time(c, ec);
    aged.emplace_back(ec ? std::filesystem::file_time_type::min() : t, c);
  }
  std::stable_sort(aged.begin(), aged.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::filesystem::path> kept;
  for (auto& a : aged) kept.push_back(std::move(a.second));
  for (std::size_t i = 0; i + std::size_t(keep) < kept.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove_all(kept[i], ec);
    lines.push_back(ec ? "cannot remove the older copy " + kept[i].string() + " (" + ec.message() + "); it is left"
                       : "removed the older copy " + kept[i].string() + " (" + std::string(flag) + " " +
                             std::to_string(keep) + " keeps the newest " + std::to_string(keep) + ")");
  }
  return lines;
}

/// Where keep_previous put the file it found at `out`: `kept` (empty when nothing was at
/// `out`), `linked` when it is a second name of the file still at `out` (a hard link), false
/// when the file was renamed away from `out`.
struct kept_file {
  std::filesystem::path out, kept;
  bool linked = false;
};

namespace detail {
/// Whether `p` names anything (a file, a folder, a dangling symbolic link).
inline bool taken(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(p, ec));
}
}  // namespace detail

/// Keeps the files of `outs` that exist under previous_run_name(out, k), one k for all of
/// them: the first k >= 1 at which none of the names (of every path in `outs`, present or not)
/// is taken. Hard links, so that every `out` stays in place until its new file replaces it;
/// renames where the file system has no hard links. Returns one entry per path of `outs`, in
/// order (`kept` empty for a path where nothing was). Never replaces an existing file. Throws
/// loom::error, with what was kept undone, when neither a link nor a rename works; `fix` ends
/// its message (e.g. "pass another --out").
inline std::vector<kept_file> keep_previous(std::span<const std::filesystem::path> outs, std::string_view fix) {
  namespace fs = std::filesystem;
  std::vector<kept_file> kept;
  bool any = false;
  for (const auto& out : outs) {
    kept.push_back({out, {}, false});
    any = any || detail::taken(out);
  }
  if (!any) return kept;
  auto unlink_made = [&] {
    for (auto& e : kept) {
      if (!e.kept.empty()) (void)::unlink(e.kept.c_str());
      e.kept.clear();
      e.linked = false;
    }
  };
  bool links = true;
  for (int k = 1; k < 1000000; ++k) {
    if (std::any_of(outs.begin(), outs.end(), [&](const fs::path& out) { return detail::taken(previous_run_name(out, k)); }))
      continue;
    bool retry = false;
    for (auto& e : kept) {
      if (!links || !detail::taken(e.out)) continue;
      const fs::path name = previous_run_name(e.out, k);
      if (::link(e.out.c_str(), name.c_str()) == 0) {
        e.kept = name;
        e.linked = true;
        continue;
      }
      const int err = errno;
      unlink_made();
      if (err == EEXIST) {  // taken since the check (another process): the next k
        retry = true;
        break;
      }
      links = false;  // EPERM, ENOTSUP, EMLINK...: no hard link here, rename instead
    }
    if (retry) continue;
    if (links) return kept;
    for (auto& e : kept) {
      if (!detail::taken(e.out)) continue;
      const fs::path name = previous_run_name(e.out, k);
      std::error_code ec;
      if (detail::taken(name))
        ec = std::make_error_code(std::errc::file_exists);
      else
        fs::rename(e.out, name, ec);
      if (!ec) {
        e.kept = name;
        continue;
      }
      std::error_code ignored;
      for (const auto& back : kept)  // undo the renames made so far
        if (!back.kept.empty()) fs::rename(back.kept, back.out, ignored);
      throw loom::error("cannot keep the previous '" + e.out.string() + "' as '" + name.string() + "': " + ec.message() +
                        "; move it away yourself, or " + std::string(fix));
    }
    return kept;
  }
  throw loom::error("cannot keep the previous '" + outs.front().string() + "': every name up to " +
                    previous_run_name(outs.front(), 999999).string() + " is taken; move some away, or " + std::string(fix));
}

/// After a failed write of `k.out` that keep_previous kept: `k.out` as it was before, where the
/// write did not replace it. The kept name is removed while `k.out` still holds the kept file;
/// the kept file goes back to `k.out` when nothing is there. A write that failed after its
/// rename leaves the new file and the kept one. Never throws.
inline void undo_keep(const kept_file& k) noexcept {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (k.kept.empty()) return;
  if (k.linked && fs::equivalent(k.out, k.kept, ec))
    fs::remove(k.kept, ec);
  else if (!detail::taken(k.out))
    fs::rename(k.kept, k.out, ec);
}

/// After a failed write of files written together (a dataset) that keep_previous kept: every
/// path as it was before keep_previous, new files or not. A kept file goes back to its path
/// (replacing a new file written there; a hard-linked one that was not replaced just loses its
/// kept name), and a new file at a path where nothing was is removed. Never throws.
inline void restore_previous(std::span<const kept_file> kept) noexcept {
  namespace fs = std::filesystem;
  for (const auto& k : kept) {
    std::error_code ec;
    if (k.kept.empty())
      fs::remove(k.out, ec);  // nothing was there: what is there now is the failed run's
    else if (k.linked && fs::equivalent(k.out, k.kept, ec))
      fs::remove(k.kept, ec);
    else
      fs::rename(k.kept, k.out, ec);  // atomic: the new file is replaced by the kept one
  }
}

}  // namespace loom_examples
