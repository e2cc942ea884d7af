#pragma once
/// \file Saving a state_view (io/checkpoint/state.hpp) as a checkpoint: the snapshot (which
/// files this rank writes, the manifest) and the blocking saves, single-rank and collective.
/// Not templates, except the thin overloads that take a trainer and ask it for its view.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/io/checkpoint/commit.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/checkpoint/state.hpp>
#include <loom/parallel/comm.hpp>

namespace loom::io {

namespace detail {

/// The pipeline stages that use a row, as the manifest records it: "all" (per-layer tensors,
/// each stage its own layers), "first and last" (a tied embedding: token embedding and LM head),
/// "first" (embeddings), "last" (final norm, an untied LM head). Every stage's file holds every
/// row of its table; the copies on stages that do not use a tensor are never read when
/// resharding (models::owner_stage).
inline std::string used_on_stages(const state_row& r) {
  if (r.geometry.per_layer) return "all";
  switch (r.used) {
    case models::stages::first: return "first";
    case models::stages::last: return "last";
    case models::stages::first_and_last: return "first and last";
    case models::stages::all: break;
  }
  return "all";
}

/// "optim-tp00-pp00-dp01.safetensors": data-parallel rank dp's ZeRO-1 shard file of cell (tp, pp).
inline std::string shard_file_name(int tp, int pp, int dp) {
  char name[64];
  std::snprintf(name, sizeof name, "optim-tp%02d-pp%02d-dp%02d.safetensors", tp, pp, dp);
  return name;
}

/// The manifest of view `v` (without "files" and "checksum", which the commit adds).
inline nlohmann::json manifest_of(const state_view& v, const run_state& state) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& r : v.rows)
    tensors.push_back({{"name", r.name},
                       {"shard", std::string(shard_name(r.geometry.rule))},
                       {"per_layer", r.geometry.per_layer},
                       {"sections", r.geometry.sections},
                       {"section_parts", std::vector<int>(r.geometry.parts.begin(),
                                                          r.geometry.parts.begin() + r.geometry.sections)},
                       {"logical_shape", r.logical_shape},
                       {"local_shape", r.local_shape},
                       {"used_on_stages", used_on_stages(r)},
                       {"decay", r.decay}});
  const auto now = std::time(nullptr);
  char when[32] = "";
  std::tm tm{};
  if (gmtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  nlohmann::json scaler = {{"enabled", v.scaler_enabled}, {"scale", 1.0}, {"growth_tracker", 0}};
  if (v.scaler_enabled) scaler = {{"enabled", true}, {"scale", v.scaler.scale}, {"growth_tracker", v.scaler.good_steps}};
  nlohmann::json m = {
      {"format", "loom.checkpoint"},
      {"format_version", checkpoint_format_version},
      {"library", {{"name", "loom"}, {"version", std::string(library_version)}}},
      {"created_utc", when},
      {"step", v.step},
      {"optimizer_step", v.optimizer_step},
      {"tokens", state.tokens},
      {"model", v.model},
      {"layout",
       {{"tp", v.tp}, {"pp", v.pp}, {"dp", v.dp}, {"zero", v.zero1 ? 1 : 0},
        {"rank_order", "tp fastest, then dp, then pp (Megatron-LM)"}}},
      {"precision",
       {{"name", v.precision}, {"storage", v.storage_dtype}, {"master", v.master_dtype}, {"master_copy", v.master_copy}}},
      {"trainer", v.trainer},
      {"optimizer", v.optimizer},
      {"lr_schedule", v.lr_schedule},
      {"loss_scaler", scaler},
      {"rng", state.rng},
      {"data", state.data},
      {"extra", state.extra},
      {"tensors", tensors},
  };
  if (v.trainer.contains("seed")) m["rng"]["init_seed"] = v.trainer["seed"];
  return m;
}

/// Step 1 of a save: the files this rank writes and the manifest (without "files" and
/// "checksum", which the commit adds). Data-parallel rank 0 writes its cell's model file
/// (model-tpTT-ppPP.safetensors: every view tensor, "<kind>.<row>", local shapes); with ZeRO-1
/// every data-parallel rank also writes optim-tpTT-ppPP-dpDD.safetensors: its flat shards
/// (1-D, "<kind>") and "ranges" (I64, (pieces, 3): parameter-buffer offset, length, shard
/// offset). With copy = false the tensors point into the view's memory (host-accessible
/// devices only), which must not change until the files are written; with copy = true every
/// tensor is first copied into `staging` (grown to the total and reused across calls).
/// Throws loom::numeric_error when opt.check_finite finds a NaN or an infinity (nothing written).
inline std::pair<std::vector<rank_file>, nlohmann::json> snapshot(const state_view& v, const run_state& state,
                                                                 const checkpoint_options& opt,
                                                                 const std::filesystem::path& root, bool copy,
                                                                 std::vector<std::byte>& staging) {
  if (!v.host_accessible) copy = true;
  const bool writes_model = v.dp_rank == 0;  // replicas of a (tp, pp) cell hold the same values
  if (copy) {
    std::size_t total = 0;
    if (writes_model)
      for (const auto& t : v.tensors) total += t.bytes;
    for (const auto& s : v.shards) total += s.elems * dtype_size(s.dtype);
    if (staging.size() < total) staging.resize(total);
  }
  std::size_t used = 0;
  auto bytes_of = [&](const std::byte* data, std::size_t n, const std::string& dtype, const std::string& name,
                      bool host) {
    std::span<const std::byte> bytes(data, n);
    if (copy && host) {  // host memory on any device (an offloaded optimizer): copied now
      std::memcpy(staging.data() + used, data, n);
      bytes = {staging.data() + used, n};
      used += n;
    } else if (copy) {
      v.to_host(staging.data() + used, data, n);
      bytes = {staging.data() + used, n};
      used += n;
    }
    if (opt.check_finite) {
      if (copy) v.synchronize();
      if (!all_finite(dtype, bytes))
        throw numeric_error("checkpoint of step " + std::to_string(v.step) + " not saved: tensor '" + name +
                            "' holds NaN or infinite values; the checkpoints in '" + root.string() +
                            "' are unchanged: resume from the last one with a lower learning rate");
    }
    return bytes;
  };
  std::vector<rank_file> files;
  if (writes_model) {
    rank_file file{checkpoint_file_name(v.tp_rank, v.pp_rank), v.tp_rank, v.pp_rank, 0, {}, {}, {}};
    for (const auto& t : v.tensors) {
      const auto& r = v.rows[t.row];
      const std::string name = t.kind + "." + r.name;
      file.tensors.push_back({name, t.dtype, r.local_shape, bytes_of(t.data, t.bytes, t.dtype, name, t.host)});
    }
    file.metadata = {{"format", "loom.checkpoint.rank"},
                     {"step", std::to_string(v.step)},
                     {"tp_rank", std::to_string(v.tp_rank)},
                     {"pp_rank", std::to_string(v.pp_rank)}};
    files.push_back(std::move(file));
  }
  if (v.zero1) {
    rank_file o{shard_file_name(v.tp_rank, v.pp_rank, v.dp_rank), v.tp_rank, v.pp_rank, v.dp_rank, {}, {}, {}};
    o.owned.resize(v.ranges.size() * 3 * sizeof(std::int64_t));
    for (std::size_t i = 0; i < v.ranges.size(); ++i) {
      const std::int64_t row[3] = {std::int64_t(v.ranges[i].param_offset), std::int64_t(v.ranges[i].length),
                                   std::int64_t(v.ranges[i].shard_offset)};
      std::memcpy(o.owned.data() + i * sizeof row, row, sizeof row);
    }
    for (const auto& s : v.shards)
      o.tensors.push_back({s.kind, s.dtype, {std::int64_t(s.elems)},
                           bytes_of(s.data, s.elems * dtype_size(s.dtype), s.dtype, s.kind + " (ZeRO-1 shard)", false)});
    o.tensors.push_back({"ranges", "I64", {std::int64_t(v.ranges.size()), 3}, std::span<const std::byte>(o.owned)});
    o.metadata = {{"format", "loom.checkpoint.zero1"}, {"step", std::to_string(v.step)},
                  {"ranges", "rows (param_offset, length, shard_offset) in elements of the parameter buffer"}};
    files.push_back(std::move(o));
  }
  if (copy) v.synchronize();
  return {std::move(files), manifest_of(v, state)};
}

/// A single-rank save cannot hold another rank's shards.
inline void require_unsharded(const state_view& v, std::string_view api) {
  if (v.tp * v.pp > 1)
    throw input_error(std::string(api) + ": this trainer is split over tp = " + std::to_string(v.tp) + ", pp = " +
                      std::to_string(v.pp) + " ranks, so one rank cannot save the model alone; call "
                      "io::save_checkpoint(ctx, root, tr, state, world) on every rank of the world");
  if (v.zero1)
    throw input_error(std::string(api) + ": this trainer shards its optimizer state (ZeRO-1), so one rank cannot "
                      "save it alone; call io::save_checkpoint(ctx, root, tr, state, dp_group) on every rank");
}

}  // namespace detail

/// Saves state view `v` and the caller's `state` as checkpoint `<root>/step_<v.step>` (see
/// io/checkpoint.hpp for the layout and the protocol), points `<root>/latest` at it, then keeps
/// the newest opt.keep checkpoints. Returns the checkpoint's directory. Blocks until everything
/// is on disk; async_checkpointer is the variant that writes in the background.
///
/// Writes: the rank file and manifest.json; replaces `latest`; removes pruned checkpoints and
/// leftovers of interrupted saves (".tmp-*", ".old-*"). One writer per root at a time.
/// Memory: none extra on host-accessible devices (the file is written straight from the
/// trainer's buffers); a host copy of parameters and moments otherwise.
/// Cost: the bytes (12 per parameter in fp32) written and fsynced once, then read back once to
/// verify their XXH3-64.
/// Errors: loom::input_error when the view is sharded over ranks (use the collective overload)
/// or the root cannot be created; loom::numeric_error when a value is not finite
/// (opt.check_finite; nothing is written); loom::error when a write, fsync or rename fails. In
/// every failure before the new directory is in place, nothing changed on disk except the
/// removed temporary directory; the message says so.
inline std::filesystem::path save_checkpoint(const state_view& v, const std::filesystem::path& root,
                                             const run_state& state, const checkpoint_options& opt = {}) {
  detail::require_unsharded(v, "save_checkpoint");
  std::vector<std::byte> staging;
  auto [files, manifest] = detail::snapshot(v, state, opt, root, false, staging);
  return detail::commit_checkpoint(root, v.step, files, std::move(manifest), opt);
}

/// The collective save, called by every rank of `world` (all ranks of the run: tp x pp x dp)
/// with the same root. Data-parallel rank 0 of each (tp, pp) cell writes the cell's model file;
/// with ZeRO-1 every rank also writes its optimizer shard (ZeRO, Rajbhandari et al.,
/// arXiv:1910.02054, stage 1). The save is complete only when every rank has written and
/// verified its files: the ranks agree before rank 0 renames the directory into place and
/// moves `latest`; if any rank failed, nobody moves `latest`, the temporary directory is
/// removed, and every rank throws naming each failing rank and its reason. Returns the
/// checkpoint's directory on every rank. Writes straight from the trainer's buffers.
/// Errors: a NaN in any rank's state is agreed on first (loom::numeric_error on every rank
/// naming the rank and tensor, nothing written); an I/O failure of any rank is loom::error on
/// every rank naming the rank and its reason.
inline std::filesystem::path save_checkpoint(const state_view& v, const std::filesystem::path& root,
                                             const run_state& state, const collective& world,
                                             const checkpoint_options& opt = {}) {
  std::vector<std::byte> staging;
  std::pair<std::vector<detail::rank_file>, nlohmann::json> snap;
  detail::rank_outcome out;
  try {
    snap = detail::snapshot(v, state, opt, root, false, staging);
  } catch (const std::exception& e) {
    out.fail(e.what());
  }
  if (auto failed = detail::agree(world, out); !failed.empty()) throw numeric_error(failed);
  return detail::commit_checkpoint_collective(world, root, v.step, snap.first, std::move(snap.second), opt);
}

/// Requirements on what the trainer overloads of save_checkpoint / load_checkpoint accept:
/// a trainer that hands out its state view and restores scalars (train::trainer).
template <class T>
concept checkpointable_trainer = requires(T& t, const T& ct, context<typename T::device>& ctx, const restored_scalars& r) {
  typename T::device;
  { ct.checkpoint_state(ctx) } -> std::same_as<state_view>;
  { t.restore(r) };
};

/// save_checkpoint of trainer `tr`'s state view (tr.checkpoint_state(ctx)). Single-rank
/// trainers only; see the collective overload. Errors as save_checkpoint(state_view, ...).
template <checkpointable_trainer Trainer>
std::filesystem::path save_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& root,
                                      const Trainer& tr, const run_state& state, const checkpoint_options& opt = {}) {
  return save_checkpoint(tr.checkpoint_state(ctx), root, state, opt);
}

/// The collective save of trainer `tr`, called on every rank of `world` (its world, or its
/// data-parallel group when tp = pp = 1), through collective_of(world).
template <checkpointable_trainer Trainer, class Comm>
  requires parallel::communicator_for<Comm, std::int64_t>
std::filesystem::path save_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& root,
                                      const Trainer& tr, const run_state& state, Comm& world,
                                      const checkpoint_options& opt = {}) {
  return save_checkpoint(tr.checkpoint_state(ctx), root, state, collective_of(world), opt);
}

}  // namespace loom::io
