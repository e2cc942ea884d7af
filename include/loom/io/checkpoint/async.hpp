#pragma once
/// \file Checkpoints written in the background, single-rank and multi-rank, so that saving holds
/// the training loop only for a copy in memory. Not a template (async_checkpointer<Trainer> is a
/// thin adapter that asks the trainer for its state view).
#include <chrono>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/io/checkpoint/commit.hpp>
#include <loom/io/checkpoint/save.hpp>
#include <loom/io/checkpoint/state.hpp>

namespace loom::io {

/// The background saver. save() waits for the previous save, copies the view's tensors into a
/// staging buffer (allocated on the first save and reused: 12 bytes per parameter in fp32),
/// and returns; a worker thread then writes and verifies the files. The commit is the same as
/// save_checkpoint's (same files, same atomicity; opt.on_stage runs on the worker thread for
/// the writes).
///
/// Single-rank: the worker also commits (manifest, rename, `latest`). Multi-rank (the overloads
/// taking a collective): the worker only writes this rank's files, because the communicator
/// cannot serve a background thread while training uses it; the agreement and rank 0's commit
/// run on the calling thread at the next save() or wait(world), which every rank calls at the
/// same point (they are collective). Until then the new checkpoint is not `latest`: a crash in
/// between leaves the previous one in place (the temporary directory is removed by the next
/// save). Not copyable or movable; one saver per root.
///
///   io::async_saver saver;
///   saver.save(tr.checkpoint_state(ctx), "out/ckpt", state, io::collective_of(world));
///   ...                    // training continues while the files are written
///   saver.wait(io::collective_of(world));   // before exit: committed, or its error rethrown
class async_saver {
 public:
  async_saver() = default;
  async_saver(const async_saver&) = delete;
  async_saver& operator=(const async_saver&) = delete;
  /// Waits for the writes in flight; their error, if any, is dropped, and a multi-rank save
  /// that was not finished by wait(world) is not committed: call wait() to see either.
  ~async_saver() {
    if (worker_.joinable()) worker_.join();
  }

  /// Single-rank: snapshots `v` and `state` (checkpoint `<root>/step_<v.step>`) and starts
  /// writing and committing it in the background. First waits for the previous save and
  /// rethrows its error (then nothing new was started: call save() again). Throws
  /// loom::numeric_error when a value is not finite and loom::input_error when the view is
  /// sharded over ranks (nothing is written).
  void save(const state_view& v, const std::filesystem::path& root, const run_state& state,
            checkpoint_options opt = {}) {
    (void)wait();
    detail::require_unsharded(v, "async_checkpointer::save");
    auto [files, manifest] = detail::snapshot(v, state, opt, root, true, staging_);
    const long step = v.step;
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

  /// Multi-rank, on every rank of `world` with the same root: finishes the previous save
  /// (wait(world)), snapshots `v`, agrees that every rank's state is finite (else
  /// loom::numeric_error on every rank, naming the rank and tensor), creates the temporary
  /// directory (rank 0) and starts writing this rank's files in the background. Collective.
  void save(const state_view& v, const std::filesystem::path& root, const run_state& state, const collective& world,
            checkpoint_options opt = {}) {
    (void)wait(world);
    detail::rank_outcome out;
    std::pair<std::vector<detail::rank_file>, nlohmann::json> snap;
    try {
      snap = detail::snapshot(v, state, opt, root, true, staging_);
    } catch (const std::exception& e) {
      out.fail(e.what());
    }
    if (auto failed = detail::agree(world, out); !failed.empty()) throw numeric_error(failed);
    pending_ = in_flight{root, v.step, detail::collective_prepare(world, root, v.step, opt), std::move(snap.second),
                         std::move(opt), {}, nlohmann::json::array()};
    worker_ = std::thread([this, files = std::move(snap.first)]() {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        pending_->listed = detail::write_rank_files(pending_->tmp, files, pending_->opt.on_stage);
      } catch (const std::exception& e) {
        pending_->written.fail(e.what());
      }
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }

  /// Single-rank: blocks until the save in flight is on disk and returns its directory
  /// (nullopt when none was in flight). Rethrows the error the background save raised (once).
  /// Throws loom::input_error when a multi-rank save is in flight (finish it with wait(world)).
  std::optional<std::filesystem::path> wait() {
    if (pending_)
      throw input_error("async_checkpointer::wait(): a multi-rank save is in flight; call wait(world) on every rank");
    if (!worker_.joinable()) return std::nullopt;
    worker_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return done_;
  }

  /// Multi-rank: waits for this rank's writes, then commits the save in flight with the other
  /// ranks (detail::collective_finish) and returns its directory on every rank (nullopt when
  /// none was in flight). Throws loom::error on every rank when any rank failed, naming each;
  /// `latest` then still names the previous checkpoint. Collective.
  std::optional<std::filesystem::path> wait(const collective& world) {
    if (!pending_) return wait();
    if (worker_.joinable()) worker_.join();
    auto p = std::move(*pending_);
    pending_.reset();
    return detail::collective_finish(world, p.root, p.step, p.tmp, p.written, p.listed, std::move(p.manifest), p.opt);
  }

  /// True while a save may still be running or waits for its commit (until wait is called).
  bool pending() const noexcept { return worker_.joinable() || pending_.has_value(); }
  /// Seconds the last finished background write took (single-rank: write, fsync, verify,
  /// commit; multi-rank: this rank's files).
  double last_write_seconds() const noexcept { return seconds_; }

 private:
  struct in_flight {
    std::filesystem::path root;
    long step = 0;
    std::filesystem::path tmp;
    nlohmann::json manifest;
    checkpoint_options opt;
    detail::rank_outcome written;
    nlohmann::json listed;
  };
  std::vector<std::byte> staging_;
  std::thread worker_;
  std::exception_ptr error_;
  std::filesystem::path done_;
  std::optional<in_flight> pending_;
  double seconds_ = 0;
};

/// async_saver for a trainer: save(ctx, root, tr, state[, world]) snapshots tr.checkpoint_state(ctx).
///
///   io::async_checkpointer<decltype(tr)> saver;
///   saver.save(ctx, "out/ckpt", tr, state);   // ~ a memcpy of the state
///   ...                                       // training continues while it is written
///   saver.wait();                             // before exit: on disk, or its error rethrown
template <checkpointable_trainer Trainer>
class async_checkpointer : public async_saver {
 public:
  using device = typename Trainer::device;
  using async_saver::save;
  using async_saver::wait;

  /// Multi-rank: async_saver::wait(collective_of(world)), on every rank of `world`.
  template <class Comm>
    requires parallel::communicator_for<Comm, std::int64_t>
  std::optional<std::filesystem::path> wait(Comm& world) {
    return wait(collective_of(world));
  }

  /// Single-rank save of `tr` (async_saver::save).
  void save(context<device>& ctx, const std::filesystem::path& root, const Trainer& tr, const run_state& state,
            checkpoint_options opt = {}) {
    save(tr.checkpoint_state(ctx), root, state, std::move(opt));
  }

  /// Multi-rank save of `tr` on every rank of `world` (async_saver::save with collective_of(world)).
  template <class Comm>
    requires parallel::communicator_for<Comm, std::int64_t>
  void save(context<device>& ctx, const std::filesystem::path& root, const Trainer& tr, const run_state& state,
            Comm& world, checkpoint_options opt = {}) {
    save(tr.checkpoint_state(ctx), root, state, collective_of(world), std::move(opt));
  }
};

}  // namespace loom::io
