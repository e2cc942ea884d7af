#pragma once
/// \file What a trainer hands io to save or load it: a view of its state as named tensors
/// (dtype, local and logical shape, shard geometry, where the bytes live) plus scalars (step,
/// optimizer step, loss scaler, configuration). Save, verify, commit, load and reshard work on
/// this view and are not templates; train::trainer::checkpoint_state builds it. Any other
/// trainer that fills a state_view checkpoints the same way.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include <loom/models/params.hpp>
#include <loom/nn/shard.hpp>
#include <loom/precision/loss_scaler.hpp>

namespace loom::io {

/// One row of the model's parameter table as a checkpoint records it.
struct state_row {
  std::string name;                         ///< "qkv_w"
  nn::shard_geometry geometry;              ///< logical shape and shard rule (nn/shard.hpp)
  std::vector<std::int64_t> logical_shape;  ///< the unsharded shape (manifest "logical_shape")
  std::vector<std::int64_t> local_shape;    ///< this rank's shape under the running layout
  models::stages used = models::stages::all;        ///< pipeline stages that use a global row
  bool decay = true;                        ///< receives weight decay (recorded, not checked)
  std::size_t offset = 0;                   ///< element offset in this rank's parameter buffer
  std::size_t elems = 0;                    ///< elements on this rank (product of local_shape)
};

/// One tensor of the state on this rank: "<kind>.<row name>", kind one of param, master,
/// adam_m, adam_v. `data` is where its bytes live (device memory of the view's device, or host
/// memory when `host` is set); a save reads them, a load writes them.
struct state_tensor {
  std::string kind;   ///< "param", "master", "adam_m", "adam_v"
  std::size_t row;    ///< index into state_view::rows
  std::string dtype;  ///< safetensors dtype: "F32", "BF16", "F16"
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  /// The bytes are in host memory whatever the view's device (an offloaded optimizer's state,
  /// optim::offload_adamw): read and written with memcpy, never through to_host / to_device.
  bool host = false;
};

/// A flat array of state sharded across data-parallel ranks (ZeRO-1: AdamW moments and, in 16-bit
/// precisions, fp32 master weights): this rank's shard of its cell's parameter buffer, which
/// state_view::ranges places. Saved as tensor `name` of this rank's optim-*.safetensors file.
struct state_shard {
  std::string kind;   ///< "adam_m", "adam_v", "master"
  std::string dtype;  ///< safetensors dtype
  std::byte* data = nullptr;
  std::size_t elems = 0;
};

/// A contiguous piece of a data-parallel shard: elements [param_offset, param_offset + length)
/// of the cell's parameter buffer live at [shard_offset, shard_offset + length) of the shard.
struct shard_piece {
  std::size_t param_offset = 0, length = 0, shard_offset = 0;
};

/// The whole checkpointable state of one rank, as a view (nothing is copied: pointers into the
/// trainer's buffers). Valid while the trainer lives and its buffers are not reallocated.
struct state_view {
  // --- identity: checked on load against the checkpoint's manifest
  nlohmann::json model;      ///< {"name", "arch", "n_layer", ...}: every key but "name" must match on load
  std::string precision;     ///< policy name ("bf16")
  std::string storage_dtype; ///< "BF16"
  std::string master_dtype;  ///< "F32"
  bool master_copy = false;  ///< fp32 master weights kept beside the storage parameters
  int tp = 1, pp = 1, dp = 1;             ///< degrees of the running layout
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
  bool zero1 = false;        ///< optimizer state sharded over dp (shards, ranges)

  // --- tensors
  std::vector<state_row> rows;          ///< the parameter table, in buffer order
  std::size_t cell_elems = 0;           ///< parameters of this (tp, pp) cell
  std::vector<state_tensor> tensors;    ///< per-row tensors this rank holds whole for its cell
  std::vector<state_shard> shards;      ///< with zero1: this rank's flat shards
  std::vector<shard_piece> ranges;      ///< with zero1: where the shards' elements belong

  // --- scalars
  long step = 0;                        ///< completed trainer steps (the schedule's position)
  long optimizer_step = 0;              ///< AdamW updates applied
  bool scaler_enabled = false;          ///< a dynamic loss scaler is running
  precision::loss_scaler_state scaler;  ///< its state (when enabled)
  nlohmann::json trainer = nlohmann::json::object();      ///< batch shape, seed, capacity
  nlohmann::json optimizer = nlohmann::json::object();    ///< kind, betas, eps, decay, clip
  nlohmann::json lr_schedule = nlohmann::json::object();  ///< kind, lrs, warmup, decay steps

  // --- the device the bytes live on
  bool host_accessible = true;  ///< `data` pointers may be read and written by the host
  std::function<void(void* dst, const void* src, std::size_t bytes)> to_host;    ///< async on the stream
  std::function<void(void* dst, const void* src, std::size_t bytes)> to_device;  ///< async on the stream
  std::function<void()> synchronize;                                             ///< waits for the stream
};

/// What a load restores besides tensors: the trainer applies it (trainer::restore).
struct restored_scalars {
  long step = 0;
  long optimizer_step = 0;
  std::optional<precision::loss_scaler_state> scaler;  ///< set when both sides have a loss scaler
};

}  // namespace loom::io
