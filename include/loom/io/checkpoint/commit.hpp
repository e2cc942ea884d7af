#pragma once
/// \file The checkpoint commit protocol (docs/checkpoint.md "Save protocol" and "Multi-rank
/// save"): write each rank's files into a temporary directory, verify them, agree across ranks,
/// write the manifest, rename into place, move `latest`, prune. Not a template: a multi-rank
/// save talks through io::collective, a type-erased all-gather any communicator provides.
#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/core/error.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>
#include <loom/io/safetensors.hpp>

namespace loom::io {

/// A communicator as the commit protocol needs it: this rank, the group size, and an
/// all-gather of equal-sized byte blocks (out[r * in.size() ...] = rank r's `in`). Built from
/// any loom communicator by collective_of; the protocol's few collectives (a few KB each)
/// all go through it.
struct collective {
  int rank = 0, size = 1;
  std::function<void(std::span<const std::byte> in, std::span<std::byte> out)> all_gather;
};

/// The collective view of communicator `c` (comm::threads, comm::mpi, comm::hccl's host
/// group, parallel::local_group). `c` must outlive the returned object.
template <class Comm>
collective collective_of(Comm& c) {
  return {c.rank(), c.size(), [&c](std::span<const std::byte> in, std::span<std::byte> out) { c.all_gather(in, out); }};
}

namespace detail {

/// True when every element of `bytes` (safetensors dtype F32, F64, BF16 or F16) is finite;
/// other dtypes (integers) are always finite.
inline bool all_finite(std::string_view dtype, std::span<const std::byte> bytes) {
  auto check = [&](auto tag) {
    using T = decltype(tag);
    const std::size_t n = bytes.size() / sizeof(T);
    for (std::size_t i = 0; i < n; ++i) {
      T x;
      std::memcpy(&x, bytes.data() + i * sizeof(T), sizeof(T));
      if (!std::isfinite(static_cast<double>(static_cast<float>(x)))) return false;
    }
    return true;
  };
  if (dtype == "F32") return check(float{});
  if (dtype == "F64") {
    const std::size_t n = bytes.size() / sizeof(double);
    for (std::size_t i = 0; i < n; ++i) {
      double x;
      std::memcpy(&x, bytes.data() + i * sizeof x, sizeof x);
      if (!std::isfinite(x)) return false;
    }
    return true;
  }
  if (dtype == "BF16") return check(Eigen::bfloat16{});
  if (dtype == "F16") return check(Eigen::half{});
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
/// ".old-*", and "latest.tmp.<pid>", which a process killed while replacing `latest` leaves;
/// one writer per root) and creates the empty temporary directory `tmp`.
/// Throws loom::input_error when either cannot be created.
inline void prepare_save(const std::filesystem::path& root, const std::filesystem::path& tmp) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec || !std::filesystem::is_directory(root))
    throw input_error("cannot create the checkpoint directory '" + root.string() + "' (" + ec.message() +
                      "); check the path and its permissions");
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(".tmp-", 0) == 0 || f.rfind(".old-", 0) == 0 || f.rfind(std::string(latest_name) + ".tmp.", 0) == 0)
      remove_quietly(e.path());
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
inline std::string agree(const collective& world, const rank_outcome& mine) {
  std::vector<rank_outcome> all(std::size_t(world.size));
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

/// Every rank's value of `mine` (one all_gather).
inline std::vector<std::int64_t> gather_value(const collective& world, std::int64_t mine) {
  std::vector<std::int64_t> all(std::size_t(world.size));
  world.all_gather(std::as_bytes(std::span<const std::int64_t>(&mine, 1)), std::as_writable_bytes(std::span(all)));
  return all;
}

/// One manifest "files" entry as a fixed-size record (for the all_gather to rank 0).
struct file_record {
  char path[96] = {};
  char xxh3_64[24] = {};
  std::int32_t tp = 0, pp = 0, dp = 0, used = 0;
  std::uint64_t bytes = 0;
};
static_assert(std::is_trivially_copyable_v<file_record>);

/// The first half of a collective save: rank 0 creates the temporary directory (its name,
/// with rank 0's pid, is shared) and the ranks agree. Returns the temporary directory on every
/// rank, or throws loom::error on every rank naming rank 0's problem. Collective.
inline std::filesystem::path collective_prepare(const collective& world, const std::filesystem::path& root, long step,
                                                const checkpoint_options& opt) {
  const auto pid = gather_value(world, world.rank == 0 ? std::int64_t(::getpid()) : 0)[0];
  const std::filesystem::path tmp = root / (".tmp-" + checkpoint_dir_name(step) + "-" + std::to_string(pid));
  rank_outcome out;
  if (world.rank == 0) try {
      prepare_save(root, tmp);
      if (opt.on_stage) opt.on_stage("prepared");
    } catch (const std::exception& e) {
      out.fail(e.what());
    }
  if (auto failed = agree(world, out); !failed.empty()) {
    if (world.rank == 0) remove_quietly(tmp);
    throw error(save_failed(root, step, failed));
  }
  return tmp;
}

/// The second half of a collective save, after every rank wrote its files into `tmp`
/// (write_rank_files; `written` is this rank's outcome and `listed` its "files" entries): the
/// ranks agree; if any failed, rank 0 removes `tmp` and every rank throws loom::error naming
/// each failing rank and its reason, with `latest` unmoved. Otherwise rank 0 gathers the file
/// entries, writes `manifest` (only rank 0's is used), renames the directory into place, moves
/// `latest` and prunes; its outcome is agreed again, so that every rank returns the checkpoint
/// directory or throws the same error. Collective: 4 all-gathers of a few KB.
inline std::filesystem::path collective_finish(const collective& world, const std::filesystem::path& root, long step,
                                               const std::filesystem::path& tmp, const rank_outcome& written,
                                               const nlohmann::json& listed, nlohmann::json manifest,
                                               const checkpoint_options& opt) {
  const int me = world.rank;
  const std::filesystem::path final = root / checkpoint_dir_name(step);
  if (auto failed = agree(world, written); !failed.empty()) {
    if (me == 0) remove_quietly(tmp);
    throw error(save_failed(root, step, failed));
  }
  // Every rank's file entries to rank 0 (fixed-size records, padded to the largest count).
  const auto counts = gather_value(world, std::int64_t(listed.size()));
  const std::size_t count = std::size_t(*std::max_element(counts.begin(), counts.end()));
  std::vector<file_record> mine(count), all(count * std::size_t(world.size));
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
  world.all_gather(std::as_bytes(std::span<const file_record>(mine)), std::as_writable_bytes(std::span(all)));
  rank_outcome out;
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

/// The collective save of the files of every rank of `world` (docs/checkpoint.md "Multi-rank
/// save"): collective_prepare, each rank writes and verifies its own `files` (possibly none)
/// into the temporary directory, collective_finish. Every rank must call it with the same
/// root and step. Throws loom::error on every rank when any rank failed (naming each).
inline std::filesystem::path commit_checkpoint_collective(const collective& world, const std::filesystem::path& root,
                                                          long step, const std::vector<rank_file>& files,
                                                          nlohmann::json manifest, const checkpoint_options& opt) {
  const auto tmp = collective_prepare(world, root, step, opt);
  rank_outcome written;
  nlohmann::json listed = nlohmann::json::array();
  try {
    listed = write_rank_files(tmp, files, opt.on_stage);
  } catch (const std::exception& e) {
    written.fail(e.what());
  }
  return collective_finish(world, root, step, tmp, written, listed, std::move(manifest), opt);
}

}  // namespace detail
}  // namespace loom::io
